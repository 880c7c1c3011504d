"""benchmarks/detach_behind.py and benchmarks/ahead_price.py on files written here (no GPU)."""

from __future__ import annotations

import csv
import gzip
import json
from pathlib import Path

import pytest
from bench_helpers import load_benchmark

detach_behind = load_benchmark("detach_behind")
ahead_price = load_benchmark("ahead_price")

STEP_FIELDS = ("step_id", "start_s", "num_prefill_tokens", "num_seqs", "decode_context_tokens",
               "measured_s")
TRANSITION_FIELDS = ("step_id", "kind", "handles", "total_s", "behind_step")


def write_gz(path: Path, fields: tuple[str, ...], rows: list[dict]) -> None:
    with gzip.open(path, "wt", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)


def run_folder(tmp_path: Path) -> Path:
    """Decode steps at 5 ms + 0.1 ms a sequence + 1 us per 1k keys; two prompts, each taken
    back by a detach behind the decode before it (0.4 ms), which ran 0.3 ms over the line; a
    detach that waited, after a decode that did not."""
    steps, transitions = [], []
    start = 0.0
    for i in range(1, 61):
        prefill = i in (20, 40, 55)
        seqs, keys = 4 + i % 7, 1000 * (i % 11)
        seconds = 0.030 if prefill else 5e-3 + 1e-4 * seqs + 1e-9 * keys
        if i in (19, 39):
            seconds += 3e-4
        steps.append({"step_id": i, "start_s": start, "num_prefill_tokens": 512 if prefill else 0,
                      "num_seqs": seqs, "decode_context_tokens": keys, "measured_s": seconds})
        start += seconds
    for step, behind in ((20, 1), (40, 1), (55, 0)):
        transitions.append({"step_id": step, "kind": "detach", "handles": 1, "total_s": 4e-4,
                            "behind_step": behind})
        transitions.append({"step_id": step + 1, "kind": "attach", "handles": 1,
                            "total_s": 1e-3, "behind_step": 0})
    run = tmp_path / "elastic_chunk_2048"
    run.mkdir()
    write_gz(run / "steps.csv.gz", STEP_FIELDS, steps)
    write_gz(run / "transitions.csv.gz", TRANSITION_FIELDS, transitions)
    return run


def test_the_decode_before_a_detach_behind_it_is_set_against_the_other_decodes(tmp_path):
    found = detach_behind.run_excess(run_folder(tmp_path))
    assert found["steps"] == 2  # the waited detach's step is not counted
    assert found["excess_mean_ms"] == pytest.approx(0.3, abs=1e-6)
    assert found["excess_median_ms"] == pytest.approx(0.3, abs=1e-6)
    assert found["detach_mean_ms"] == pytest.approx(0.4)
    assert found["share"] == pytest.approx(0.75, abs=1e-5)


def test_a_run_with_no_detach_behind_a_step_gives_nothing(tmp_path):
    run = run_folder(tmp_path)
    write_gz(run / "transitions.csv.gz", TRANSITION_FIELDS,
             [{"step_id": 20, "kind": "detach", "handles": 1, "total_s": 4e-4, "behind_step": 0}])
    assert detach_behind.run_excess(run) is None


def test_an_unknown_slice_is_refused(capsys):
    assert detach_behind.main(["no_such_slice"]) == 2
    assert "no_such_slice" in capsys.readouterr().err


def test_the_async_price_is_set_against_the_grid_periods(tmp_path, capsys):
    """Every grid period twice as long halves the price's ratio to it; a calibration whose
    profile timed no period gives nothing; a missing file is refused."""
    source = Path(__file__).resolve().parents[1] / "calibration" / "h100" / "llama-3.1-8b.json"
    data = json.loads(source.read_text())
    timed = [m for m in data["measurements"] if m.get("ahead_s")]
    as_measured = ahead_price.ahead_errors(source)
    assert as_measured is not None and as_measured["all"]["steps"] == len(timed) > 0
    assert 0 < as_measured["eager"]["steps"] < len(timed)  # the decode graphs are not eager
    for m in timed:
        m["ahead_s"] *= 2.0
    doubled = tmp_path / "doubled.json"
    doubled.write_text(json.dumps(data))
    halved = ahead_price.ahead_errors(doubled)
    for part in ("all", "eager"):
        assert 1.0 + halved[part]["median_error"] == pytest.approx(
            (1.0 + as_measured[part]["median_error"]) / 2.0)
    for m in data["measurements"]:
        m.pop("ahead_s", None)
    untimed = tmp_path / "untimed.json"
    untimed.write_text(json.dumps(data))
    assert ahead_price.ahead_errors(untimed) is None
    assert ahead_price.main([str(tmp_path / "missing.json")]) == 2
    assert "missing.json: no such calibration file" in capsys.readouterr().err
