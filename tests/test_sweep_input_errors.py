"""`python -m sim sweep --config FILE` with a bad value: refused before any case runs, with
one line naming the file and the key and exit code 2; a valid value that a configuration
cannot run (a model too large for the GPU) is still a row with fits=False."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = yaml.safe_load((ROOT / "examples" / "sweep.yaml").read_text())


def tiny_example() -> dict:
    """examples/sweep.yaml cut to one small case: one point on every axis, 20 requests."""
    data = copy.deepcopy(EXAMPLE)
    data["grid"].update(model=["llama-3.1-8b"], tp=[1], chunk=[2048], policy=["static"],
                        rate_scale=[1.0], trace=[{"source": "azure-conv", "limit": 20}])
    data.pop("out")
    data["workers"] = 1
    return data


def run_sweep(tmp_path: Path, data: dict) -> subprocess.CompletedProcess:
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(data))
    return subprocess.run([sys.executable, "-m", "sim", "sweep", "--config", str(path),
                           "--out", str(tmp_path / "out"), "--no-progress", "--json"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)


def edit(section: str | None, **values):
    def apply(data: dict) -> None:
        (data if section is None else data[section]).update(values)
    return apply


@pytest.mark.parametrize("change, says", [
    (edit("grid", tp=[0]), "grid.tp[0]: give 1 or more, got 0"),
    (edit("grid", chunk=[-5]), "grid.chunk[0]: give 1 or more, got -5"),
    (edit("engine", gpu_memory_utilization=9),
     "engine.gpu_memory_utilization: give a share of the GPU's memory above 0 and at most 1"),
    (edit("engine", vmm_handle_mib=-2), "engine.vmm_handle_mib: give a positive multiple of "
     "the h200-141gb VMM granularity (2 MiB), got -2"),
    (edit("engine", vmm_handle_mib=3), "engine.vmm_handle_mib: give a positive multiple of "
     "the h200-141gb VMM granularity (2 MiB), got 3"),
    (edit("engine", block_size=7), "engine.block_size: give one of 8, 16, 32, 64, 128 (vLLM's "
     "choices), got 7"),
    (edit("engine", max_num_seqs=0), "engine.max_num_seqs: give 1 or more sequences, or leave "
     "it out for vLLM's default, got 0"),
    (edit("engine", cuda_graph_sizes=[0, 4]),
     "engine.cuda_graph_sizes: give sizes of 1 or more (or none), got 0,4"),
    (edit("engine", mixed_split_mib=-1), "engine.mixed_split_mib: give 0 (never) or more MiB, "
     "got -1"),
    (edit("engine", piecewise_graphs=True, piecewise_max_tokens=0),
     "engine.piecewise_max_tokens: give 1 or more, got 0"),
    (edit(None, num_replicas=0), "num_replicas: give 1 or more, got 0"),
    (edit("grid", model=[]), "grid.model is an empty list"),
    (edit("grid", policy=[]), "grid.policy is an empty list"),
    (edit("grid", chunk=[2048, 2048]), "grid.chunk: 2048 is given twice"),
    (edit("grid", trace=[{"source": "azure-conv", "limit": 20}] * 2),
     "grid.trace: 'azure-conv' is given twice"),
    (edit(None, workers=0), "workers: give 1 or more, got 0"),
    (edit("grid", trace=[{"source": "azure-conv", "window": [5, 1]}]),
     "grid.trace[0]: trace.window: give [start_s, end_s] with end_s after start_s, got [5, 1]"),
], ids=["tp-0", "chunk-negative", "memory-share-9", "handle-negative", "handle-odd",
        "block-size-7", "max-seqs-0", "graph-size-0", "split-negative", "piecewise-cap-0",
        "replicas-0", "model-empty", "policy-empty", "chunk-twice",
        "trace-twice", "workers-0", "window-backwards"])
def test_a_bad_value_is_refused_naming_the_file_and_key(tmp_path, change, says):
    data = tiny_example()
    change(data)
    done = run_sweep(tmp_path, data)
    assert done.returncode == 2, done.stdout + done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith(f"error: {tmp_path / 'sweep.yaml'}: ") and says in line, line
    assert done.stdout == "" and not (tmp_path / "out" / "sweep.csv").exists()


def test_a_valid_configuration_that_does_not_fit_is_a_row(tmp_path):
    data = tiny_example()
    data["grid"].update(model=["llama-3.1-70b"], gpu=["a100-80gb"])
    done = run_sweep(tmp_path, data)
    assert done.returncode == 0, done.stderr
    (row,) = json.loads(done.stdout)
    assert row["fits"] is False and "does not fit on a100-80gb" in row["fit_error"]


def test_a_max_model_len_past_one_grid_models_context_is_that_cases_row(tmp_path):
    """A refusal that depends on the model (vLLM's, of a max_model_len past its context) does
    not stop the sweep: the model it fits runs, the other is a row with fits=False."""
    data = tiny_example()
    data["grid"]["model"] = ["llama-3.1-8b", "qwen2.5-7b"]  # contexts 131,072 and 32,768
    data["engine"]["max_model_len"] = 100_000
    done = run_sweep(tmp_path, data)
    assert done.returncode == 0, done.stderr
    rows = {row["model"]: row for row in json.loads(done.stdout)}
    assert rows["llama-3.1-8b"]["fits"] is True and rows["llama-3.1-8b"]["num_finished"] == 20
    assert rows["qwen2.5-7b"]["fits"] is False
    assert "--max-model-len 100000 is longer than qwen2.5-7b's context" in (
        rows["qwen2.5-7b"]["fit_error"])


def test_a_handle_size_one_grid_gpu_cannot_cut_stops_the_sweep(tmp_path):
    """6 MiB handles suit the H200's 2 MiB VMM granularity but not a GPU file's 4 MiB one:
    the engine refuses it on that GPU, and the sweep stops before its first case."""
    gpu = tmp_path / "gpu4.yaml"
    gpu.write_text("name: gpu4\nmemory_bytes: 85899345920\npeak_bf16_flops: 989.4e12\n"
                   "memory_bandwidth_bytes_s: 3.35e12\ninterconnect_bytes_s: 450e9\n"
                   "vmm_granularity_bytes: 4194304\n")
    data = tiny_example()
    data["grid"]["gpu"] = ["h200", str(gpu)]
    data["engine"]["vmm_handle_mib"] = 6
    done = run_sweep(tmp_path, data)
    assert done.returncode == 2, done.stdout + done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line == (f"error: {tmp_path / 'sweep.yaml'}: engine.vmm_handle_mib: give a positive "
                    "multiple of the gpu4 VMM granularity (4 MiB), got 6"), line
    assert not (tmp_path / "out" / "sweep.csv").exists()


@pytest.mark.parametrize("command", [["plan", "--no-max-rate"], ["plan", "fleet"]])
def test_plan_and_fleet_refuse_a_handle_size_the_gpu_cannot_cut_before_any_run(tmp_path,
                                                                               command):
    """The engine's granularity check reaches the plan and fleet flags too: a handle of 3 MiB
    is refused up front, naming the flag, not run as a column of rows that do not fit."""
    done = subprocess.run([sys.executable, "-m", "sim", *command, "--trace", "azure-conv",
                           "--limit", "20", "--workers", "1", "--no-progress",
                           "--vmm-handle-mib", "3", "--out", str(tmp_path / "out")],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr == ("error: argument --vmm-handle-mib: give a positive multiple of the "
                           "h200-141gb VMM granularity (2 MiB), got 3\n")
    assert done.stdout == "" and not (tmp_path / "out").exists()


def test_the_cut_example_runs_its_one_case(tmp_path):
    done = run_sweep(tmp_path, tiny_example())
    assert done.returncode == 0, done.stderr
    (row,) = json.loads(done.stdout)
    assert row["fits"] is True and row["num_finished"] == 20


@pytest.mark.parametrize("key, says", [
    ("gpu", "grid.gpu[0]: unknown GPU 'nosuch'; known: a100-40gb"),
    ("model", "grid.model[0]: unknown model 'nosuch'; known: deepseek-v2-lite"),
])
def test_an_unknown_name_in_the_grid_is_refused_with_the_known_ones(tmp_path, key, says):
    data = tiny_example()
    data["grid"][key] = ["nosuch"]
    done = run_sweep(tmp_path, data)
    assert done.returncode == 2, done.stdout + done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith(f"error: {tmp_path / 'sweep.yaml'}: ") and says in line, line
    assert "or give a" in line and not (tmp_path / "out" / "sweep.csv").exists()


@pytest.mark.parametrize("flag, value, says", [
    ("--gpu-memory-utilization", "9", "give a share of the GPU's memory above 0 and at most 1"),
    ("--gpu-memory-utilization", "0", "give a share of the GPU's memory above 0 and at most 1"),
    ("--block-size", "7", "give one of 8, 16, 32, 64, 128 (vLLM's choices), got 7"),
    ("--vmm-handle-mib", "0", "give a positive multiple of the h200-141gb VMM granularity "
     "(2 MiB), got 0"),
    ("--vmm-handle-mib", "3", "give a positive multiple of the h200-141gb VMM granularity "
     "(2 MiB), got 3"),
    ("--mixed-split-mib", "-1", "give 0 (never) or more MiB, got -1"),
    ("--piecewise-max-tokens", "0", "give 1 or more, got '0'"),
])
def test_a_bad_engine_flag_is_refused_naming_the_flag(tmp_path, flag, value, says):
    done = subprocess.run([sys.executable, "-m", "sim", "sweep", "--trace", "azure-conv",
                           "--limit", "20", "--chunk", "2048", "--policy", "static",
                           "--workers", "1", "--out", str(tmp_path / "out"), "--no-progress",
                           "--json", flag, value],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stdout + done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith(f"error: argument {flag}: ") and says in line, line
    assert done.stdout == "" and not (tmp_path / "out" / "sweep.csv").exists()
