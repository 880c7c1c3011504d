"""The committed evidence (validation/evidence/) and `python -m validation rebuild`.

Two small slices are rebuilt byte for byte (a few seconds each); every slice's report is
checked against the digests of the files it was built from, and the results tables against
the reports. `python -m validation rebuild --check` regenerates every report in full.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from validation.evidence import (
    EVIDENCE_DIR,
    ROOT,
    differing,
    read_recipe,
    render,
    slice_folders,
    stale_inputs,
)
from validation.results import README_MARKERS, between_markers, engine_of, update_results

# the two slices that rebuild fastest (40 requests each, ~2-3 s)
BYTE_FOR_BYTE = ("h200_qwen2.5-0.5b_mooncake-conv_piecewise",
                 "h200_llama-3.1-8b_mooncake-conv_piecewise512")


@pytest.fixture(scope="module", params=BYTE_FOR_BYTE)
def rebuilt(request) -> tuple[Path, dict[str, str]]:
    folder = EVIDENCE_DIR / request.param
    texts, _ = render(folder)
    return folder, texts


def test_a_committed_report_is_byte_identical_to_its_rebuild(rebuilt):
    folder, texts = rebuilt
    assert sorted(texts) == ["report.json", "report.md"]
    assert differing(folder, texts) == []


def test_a_report_that_differs_from_its_rebuild_is_named(rebuilt, tmp_path):
    folder, texts = rebuilt
    copy = tmp_path / folder.name
    copy.mkdir()
    for name, text in texts.items():
        (copy / name).write_text(text)
    assert differing(copy, texts) == []
    edited = texts["report.md"].replace("| **PASS** |", "| **FAIL** |", 1)
    assert edited != texts["report.md"]
    (copy / "report.md").write_text(edited)
    assert differing(copy, texts) == [f"{folder.name}/report.md"]


def test_a_report_says_where_it_came_from_without_machine_paths(rebuilt):
    folder, texts = rebuilt
    recipe = read_recipe(folder)
    report = json.loads(texts["report.json"])
    assert report["provenance"]["command"] == recipe.command
    assert report["provenance"]["measured_on"] == recipe.measured_on
    assert {run["gpu_folder"].split("/")[0] for run in report["runs"]} == {"runs"}
    assert f"`{recipe.command}`" in texts["report.md"]
    for text in texts.values():
        assert str(ROOT) not in text and "/tmp" not in text


def test_every_slice_has_a_report_current_with_its_evidence():
    folders = slice_folders()
    assert len(folders) >= 10
    stale = [line for folder in folders for line in stale_inputs(folder)]
    assert stale == []
    for folder in folders:
        report = json.loads((folder / "report.json").read_text())
        assert report["provenance"]["slice"] == folder.name
        # its slice.json's, carried to the slice's model where that is another's
        assert report["calibration"].split(" -> ")[0] == read_recipe(folder).calibration
        engine_of(folder)  # the name says which engine ran


def test_the_results_tables_are_current_with_the_reports():
    assert update_results(slice_folders(), check=True) == []


def _copy_slice(name: str, tmp_path: Path) -> Path:
    """A slice and its calibration under a copy of the repository layout."""
    source = EVIDENCE_DIR / name
    folder = tmp_path / "validation" / "evidence" / name
    shutil.copytree(source, folder)
    calibration = read_recipe(source).calibration
    (tmp_path / calibration).parent.mkdir(parents=True)
    shutil.copy(ROOT / calibration, tmp_path / calibration)
    return folder


def test_evidence_changed_after_its_report_is_found(tmp_path):
    folder = _copy_slice("h200_qwen2.5-0.5b_mooncake-conv_piecewise", tmp_path)
    assert stale_inputs(folder, tmp_path) == []
    summary = next((folder / "runs").glob("*/summary.json"))
    summary.write_text(summary.read_text().replace('"num_preemptions": 0', '"num_preemptions": 1'))
    (folder / "repeats" / "repeat-9").mkdir()
    (folder / "repeats" / "repeat-9" / "summary.json").write_text("{}")
    name = summary.relative_to(folder).as_posix()
    assert stale_inputs(folder, tmp_path) == [f"{folder.name}: repeats/repeat-9/summary.json",
                                              f"{folder.name}: {name}"]


@pytest.mark.parametrize("edit, message", [
    (lambda r: r.pop("calibration"), "no 'calibration'"),
    (lambda r: r.update(limit="40"), "'limit' is '40'"),
    (lambda r: r.update(rate=2), r"unknown fields \['rate'\]"),
    (lambda r: r.update(replayed_apart=["elastic_chunk_4096"]),
     r"'replayed_apart' is \['elastic_chunk_4096'\]; expected a list of run folders"),
    (lambda r: r.update(replayed_apart="elastic_chunk_8192"), "'replayed_apart' is"),
])
def test_a_bad_slice_recipe_names_its_file_and_field(tmp_path, edit, message):
    recipe = json.loads((EVIDENCE_DIR / BYTE_FOR_BYTE[0] / "slice.json").read_text())
    edit(recipe)
    (tmp_path / "slice.json").write_text(json.dumps(recipe))
    with pytest.raises(ValueError, match=message) as info:
        read_recipe(tmp_path)
    assert str(tmp_path / "slice.json") in str(info.value)


def test_runs_replayed_apart_mark_the_gains_across_the_two_starts(tmp_path):
    from validation.compare import mark_replayed_apart

    folder = _copy_slice(BYTE_FOR_BYTE[1], tmp_path)
    runs = sorted(p.name for p in (folder / "runs").iterdir())
    recipe = json.loads((folder / "slice.json").read_text())
    recipe["replayed_apart"] = [r for r in runs if r.startswith("elastic")]
    (folder / "slice.json").write_text(json.dumps(recipe))
    assert read_recipe(folder).replayed_apart == tuple(recipe["replayed_apart"])
    gains = [{"run": "elastic/chunk=8192", "baseline": "static/chunk=8192"},
             {"run": "elastic/chunk=2048", "baseline": "static/chunk=2048"}]
    mark_replayed_apart(gains, ["elastic_chunk_8192"])
    assert [g.get("replayed_apart", False) for g in gains] == [True, False]
    # the replays' own record of their start: two known and different starts are apart
    gains = [{"run": "elastic/chunk=8192", "baseline": "static/chunk=8192"},
             {"run": "elastic/chunk=2048", "baseline": "static/chunk=2048"},
             {"run": "elastic/chunk=8192", "baseline": "static/chunk=2048"}]
    mark_replayed_apart(gains, [], {"elastic/chunk=8192": "h/a", "static/chunk=8192": "h/b",
                                    "elastic/chunk=2048": "h/a", "static/chunk=2048": None})
    assert [g.get("replayed_apart", False) for g in gains] == [True, False, False]
    texts, _ = render(folder, tmp_path)
    assert "(replayed apart)" in texts["report.md"]
    assert "ran on another start of the machine" in texts["report.md"]
    report = json.loads(texts["report.json"])
    assert report["provenance"]["replayed_apart"] == recipe["replayed_apart"]
    assert all(g.get("replayed_apart") for g in report["gains"])


def test_the_results_go_between_the_markers_only(tmp_path):
    begin, end = README_MARKERS
    path = tmp_path / "README.md"
    text = f"# Title\n\nbefore\n{begin}\nold table\n{end}\nafter\n"
    assert between_markers(text, README_MARKERS, "new table\n", path) == (
        f"# Title\n\nbefore\n{begin}\nnew table\n{end}\nafter\n")
    with pytest.raises(ValueError, match="README.md: expected one"):
        between_markers("no markers here\n", README_MARKERS, "table", path)
    with pytest.raises(ValueError, match="expected one"):
        between_markers(f"{end}\n{begin}\n", README_MARKERS, "table", path)


HISTORY_NAME = re.compile(r"20[0-9]{2}-[01][0-9]-[0-3][0-9][a-z]\b|_call[0-9]|-call[0-9]")


def test_evidence_files_are_named_by_what_they_measure():
    tracked = subprocess.run(["git", "ls-files", "validation", "calibration", "benchmarks",
                              "docs", "tests_gpu", "scripts"], cwd=ROOT, capture_output=True,
                             text=True, check=True).stdout.split()
    if not tracked:
        pytest.skip("not a git checkout")
    assert [p for p in tracked if HISTORY_NAME.search(p)] == []


def test_each_slice_command_parses_with_the_current_flags():
    from validation.cli import build_parser

    for folder in slice_folders():
        recipe = read_recipe(folder)
        words = shlex.split(recipe.command)
        while re.fullmatch(r"[A-Z_]+=\S*", words[0]):  # environment switches of the engine
            words.pop(0)
        assert words[:4] == ["python", "-m", "validation", "run"], folder.name
        args = build_parser().parse_args(words[3:])
        assert str(args.calibration) == recipe.calibration
        assert args.trace == recipe.trace_slice.trace and args.limit == recipe.trace_slice.limit


# The settings a slice's command must reproduce: those a replay's config records beside the
# policy, the chunk and the graph sizes (which the engine captures for itself).
PINNED = ("max_model_len", "enable_prefix_caching", "drain", "reclaim", "max_num_seqs",
          "gpu_memory_utilization", "block_size", "vmm_handle_bytes", "tensor_parallel_size",
          "attention_backend", "async_scheduling", "mixed_split_bytes")


def test_each_slice_command_reproduces_its_runs_configuration():
    """A default that changed since a slice was replayed must be pinned in its command, or
    measuring it again would measure another engine."""
    from sim.core.config_flags import engine_configs
    from sim.core.engine_config import Policy
    from validation.cli import build_parser
    from validation.runs import engine_config, find_runs, load_summary

    for folder in slice_folders():
        words = shlex.split(read_recipe(folder).command)
        while re.fullmatch(r"[A-Z_]+=\S*", words[0]):
            words.pop(0)
        made = engine_configs(build_parser().parse_args(words[3:]))
        runs = [engine_config(load_summary(r).summary) for r in find_runs(folder / "runs")]
        assert {(c.policy, c.chunk_tokens) for c in made} == {
            (r.policy, r.chunk_tokens) for r in runs}, folder.name
        assert {c.model.name for c in made} == {r.model.name for r in runs}, folder.name
        for name in PINNED:
            assert {getattr(c, name) for c in made} == {getattr(r, name) for r in runs}, (
                folder.name, name)
        # only an elastic run under async scheduling detaches; its setting must be the run's
        behind = {r.detach_behind_step for r in runs
                  if r.policy is Policy.ELASTIC and r.async_scheduling}
        if behind:
            assert {c.detach_behind_step for c in made} == behind, folder.name
