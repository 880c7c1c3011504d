"""What the validation evidence says of a calibration (sim.core.calibration.validated), and
the index `python -m validation rebuild` writes for it (validation.results)."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import pytest

from sim.core.calibration import load_calibration
from sim.core.calibration.validated import (
    INDEX_PATH,
    PROJECT_DIR,
    evidence_key,
    evidence_line,
    read_index,
    validated,
)
from validation.evidence import EVIDENCE_DIR, read_recipe, slice_folders
from validation.results import INDEX as INDEX_NAME
from validation.results import calibration_index

SHIPPED = "calibration/h100/qwen2.5-7b.json"


def target(best: float, worst: float, missed: list[str], limit: float = 0.05,
           measure: str = "relative") -> dict:
    return {"aggregate": "median", "measure": measure, "limit": limit, "best": best,
            "worst": worst, "missed": missed}


INDEX = {SHIPPED: {
    "slices": ["a_slice", "b_slice"], "runs": 12,
    "targets": {"ttft_p50_s": target(0.034, 0.076, ["b_slice"]),
                "tpot_p50_s": target(0.008, 0.008, []),
                "throughput_tok_s": target(0.007, 0.018, []),
                "ttft_p99_s": target(0.026, 0.131, ["a_slice", "b_slice"], limit=0.1),
                "reserve_share": target(0.0016, 0.0016, [], limit=0.02, measure="points")},
    "over_smaller_chunk": {"decided_at": 0.02, "decided": 14, "same": 12, "on_medians": 12,
                           "on_medians_same": 12}}}


@pytest.fixture(scope="module")
def calibration():
    return load_calibration(PROJECT_DIR / SHIPPED)


def test_a_validated_calibration_says_its_error_over_the_slices_and_its_decisions(calibration):
    line = evidence_line(replace(calibration, source=SHIPPED), INDEX)
    assert line.startswith(f"evidence: {SHIPPED} prices 2 validated slices (12 GPU runs)")
    assert "TTFT p50 3.4-7.6% (1 slice over the 5% target)" in line
    assert "TPOT p50 0.8%," in line  # one value where best and worst agree
    assert "throughput 0.7-1.8%" in line
    assert "TTFT p99 2.6-13.1% (2 slices over the 10% target)" in line
    assert "reserve" not in line  # the four a planner reads first
    assert "the measured decision predicted in 12 of 14 gains measured at 2% or more" in line


def test_the_calibration_is_found_however_the_output_was_given_its_path(calibration,
                                                                        tmp_path, monkeypatch):
    absolute = replace(calibration, source=str(PROJECT_DIR / SHIPPED))
    assert evidence_key(absolute.source) == SHIPPED
    assert validated(absolute, INDEX) is INDEX[SHIPPED]
    assert "prices 2 validated slices" in evidence_line(absolute, INDEX)
    monkeypatch.chdir(PROJECT_DIR / "calibration")  # relative to the working directory
    assert evidence_key("h100/qwen2.5-7b.json") == SHIPPED
    monkeypatch.chdir(tmp_path)
    assert evidence_key(os.path.relpath(PROJECT_DIR / SHIPPED, tmp_path)) == SHIPPED


def test_an_unvalidated_calibration_says_so_and_no_evidence_says_nothing(calibration, tmp_path):
    elsewhere = replace(calibration, source=str(tmp_path / "mine.json"))
    assert validated(elsewhere, INDEX) is None
    assert evidence_line(elsewhere, INDEX).startswith(
        f"evidence: no validated slice is priced by {tmp_path / 'mine.json'}")
    assert evidence_line(calibration, None) is None  # an install without the evidence
    assert evidence_line(None, INDEX) is None  # the roofline: its own warning says so


def test_a_malformed_index_is_named_with_its_fix(tmp_path):
    assert read_index(tmp_path / "none.json") is None
    path = tmp_path / "calibrations.json"
    for text in ("{", "[]"):
        path.write_text(text)
        with pytest.raises(ValueError, match=f"{path}: .*python -m validation rebuild"):
            read_index(path)


def test_the_committed_index_holds_every_calibration_the_slices_are_priced_with():
    index = read_index(INDEX_PATH)
    folders = slice_folders()
    by_calibration: dict[str, list[str]] = {}
    for folder in folders:  # a slice of another model than its calibration's: carried there
        calibration = read_recipe(folder).calibration
        model = folder.name.split("_")[1]  # <gpus>_<model>_<trace>[_<engine>]
        if f"/{model}" not in calibration:
            calibration += f" -> {model}"
        by_calibration.setdefault(calibration, []).append(folder.name)
    assert "calibration/h200/llama-3.1-8b-unfused.json -> qwen2.5-14b" in by_calibration
    assert {k: v["slices"] for k, v in index.items()} == by_calibration
    assert index == json.loads(json.dumps(calibration_index(folders)))  # current


def test_the_index_takes_each_targets_range_and_misses_from_the_reports():
    entry = calibration_index(slice_folders())[SHIPPED]
    reports = {name: json.loads((EVIDENCE_DIR / name / "report.json").read_text())
               for name in entry["slices"]}
    assert entry["runs"] == sum(len(r["runs"]) for r in reports.values())
    for metric, t in entry["targets"].items():
        values = {name: next(x for x in r["targets"] if x["metric"] == metric)
                  for name, r in reports.items()}
        assert t["best"] == min(v["value"] for v in values.values())
        assert t["worst"] == max(v["value"] for v in values.values())
        assert t["missed"] == [name for name, v in values.items() if not v["passed"]]
    # the sync slice's report: elastic over a smaller chunk measured >= 2% in 8 pairs, 6 the
    # same way as predicted (its gains table); the async slice's: 6 of 6
    assert entry["over_smaller_chunk"]["decided"] == 14
    assert entry["over_smaller_chunk"]["same"] == 12


def test_every_output_that_names_its_pricing_says_its_evidence(tmp_path):
    from sim.core.calibration import pricing, pricing_line, select_calibration

    shipped = select_calibration("qwen2.5-7b", "h100", "eager")
    assert pricing_line(shipped).splitlines()[1].startswith(f"evidence: {SHIPPED} prices")
    assert pricing(shipped)["validated"]["slices"] == [
        "h100_qwen2.5-7b_study-a100-budget", "h100_qwen2.5-7b_study-a100-budget_async"]
    assert pricing(None)["validated"] is None
    assert Path(INDEX_PATH) == EVIDENCE_DIR / INDEX_NAME  # where the rebuild writes it


def test_a_carried_calibration_is_keyed_by_its_file_and_the_model_it_was_carried_to():
    """`python -m sim --model qwen2.5-14b --calibration FILE` (FILE profiled on the 8B) finds
    the evidence of the slice the carried file priced, however FILE was named."""
    carried = "calibration/h200/llama-3.1-8b-unfused.json -> qwen2.5-14b"
    absolute = str(PROJECT_DIR / "calibration/h200/llama-3.1-8b-unfused.json") + " -> qwen2.5-14b"
    assert evidence_key(absolute) == carried
    entry = read_index(INDEX_PATH)[carried]
    assert entry["slices"] == ["h200x2_qwen2.5-14b_azure-conv_tp2"]
