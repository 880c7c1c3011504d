"""A calibration grid's extent, a run's largest steps, and the notes where a run went past."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from sim.cli import main
from sim.core.calibration.coverage import StepExtent, extrapolation_note, grid_extent
from sim.core.request import RequestState, RequestStatus
from sim.core.step import ScheduledRequest, SchedulerOutput, SchedulerStats
from sim.recording.metrics import ReplicaRecorder, summarize
from validation.report_header import grid_line

GRID = [
    {"kind": "prefill", "prefills": [[2048, 0]], "num_decodes": 0},
    {"kind": "prefill", "prefills": [[512, 6000]], "num_decodes": 0},
    {"kind": "decode", "prefills": [], "decode_groups": [[30, 1000], [2, 9000]]},
    {"kind": "mixed", "prefills": [[256, 0]], "decode_groups": [[4, 12000]]},
    # a record from before decode_groups: every row one context
    {"kind": "decode", "prefills": [], "num_decodes": 8, "decode_context": 4000},
]


def test_grid_extent_is_the_largest_step_in_each_dimension():
    # tokens: 2,048 (the prefill); keys of one sequence: the mixed step's 12,000-key rows;
    # decode keys: 30 x 1,000 + 2 x 9,000 = 48,000 over 8 x 4,000 = 32,000 (mixed excluded)
    assert grid_extent({"measurements": GRID}) == StepExtent(2048, 12000, 48000)
    assert grid_extent({"efficiency": {}}) is None


def test_a_grid_record_that_is_not_a_step_names_the_file_and_record():
    bad = {"measurements": [GRID[0], {"kind": "decode", "prefills": [],
                                      "decode_groups": [["thirty", 1000]]}]}
    with pytest.raises(ValueError, match=r"cal\.json: measurements\[1\] is not a grid step"):
        grid_extent(bad, "cal.json")


def test_extents_past_the_grid_are_named_with_both_figures():
    grid = StepExtent(2048, 12000, 48000)
    run = StepExtent(4096, 12000, 60000)
    note = extrapolation_note("static/chunk=4096", run, grid, "cal.json")
    assert note is not None and note.startswith("static/chunk=4096: steps past the grid of cal.json")
    assert "4,096 tokens in one step (the grid's most: 2,048)" in note
    assert "60,000 keys one decode step reads (the grid's most: 48,000)" in note
    assert "keys of one sequence" not in note
    assert extrapolation_note("x", StepExtent(2048, 12000, 48000), grid, "cal.json") is None
    assert extrapolation_note("x", run, None, "cal.json") is None


def _request(rid: int, computed: int, new: int) -> ScheduledRequest:
    return ScheduledRequest(rid, computed, new, (), new == 1, True)


def test_the_recorder_keeps_the_largest_step_and_a_decode_runs_last_step():
    rec = ReplicaRecorder(0, 16)
    stats = SchedulerStats(0, 1, 0, 10, 100, 0, 0, 0)
    chunk = SchedulerOutput(0, (_request(1, 6000, 2048),), 1, 2048, 0, ((2048, 6000),), 0,
                            (), None, None)
    # a run of 5 decode steps over rows with 100 and 7,000 keys cached: at its last step
    # the rows hold 105 and 7,005 keys, 7,110 in all
    run = SchedulerOutput(1, (_request(2, 100, 1), _request(3, 7000, 1)), 5, 0, 2, (), 7102,
                          (), None, None)
    rec.step(0.0, chunk, stats, [0.05])
    rec.step(0.05, run, stats, [0.01] * 5)
    extent = summarize([rec])["step_extent"]
    assert extent == {"tokens": 2048, "sequence_keys": 8048, "decode_keys": 7110}
    # a request of 8,048 prompt tokens that sampled 1,000: its last decode step attended over
    # the prompt and 999 of its outputs, longer than any prefill chunk above
    done = RequestState(4, 0.0, 8048, 1000, status=RequestStatus.FINISHED,
                        num_computed_tokens=9047, num_output_tokens=1000,
                        first_token_s=0.5, finish_s=9.0)
    rec.arrival(0.0, done, 0)
    rec.done(done)
    assert summarize([rec])["step_extent"]["sequence_keys"] == 9047


def test_sim_notes_the_runs_past_its_calibrations_grid(tmp_path, capsys):
    path = tmp_path / "small-grid.json"
    path.write_text(json.dumps({"efficiency": {}, "measurements": GRID}))
    args = ["--trace", "azure-conv", "--limit", "20", "--policy", "static", "--no-progress",
            "--json", "--calibration", str(path), "--chunk"]
    assert main([*args, "4096"]) == 0
    captured = capsys.readouterr()
    extent = json.loads(captured.out)[0]["step_extent"]
    assert extent["tokens"] > 2048  # the trace's prompts fill chunks of 4,096
    assert (f"note: static/chunk=4096: steps past the grid of {path}" in captured.err
            and f"{extent['tokens']:,} tokens in one step (the grid's most: 2,048)"
            in captured.err)
    assert main([*args, "1024"]) == 0
    assert "steps past the grid" not in capsys.readouterr().err


def test_the_report_lists_the_runs_past_the_grid():
    def run(label: str, tokens: int) -> SimpleNamespace:
        extent = {"tokens": tokens, "sequence_keys": 100, "decode_keys": 0}
        return SimpleNamespace(label=label, sim=SimpleNamespace(summary={"step_extent": extent}))

    v = SimpleNamespace(grid_extent=StepExtent(16384, 30000, 10**6),
                        runs=[run("static/chunk=8192", 8192), run("static/chunk=32768", 32768)])
    assert grid_line(v).splitlines() == [
        "Steps past the calibration's grid, priced by carrying its fitted rates beyond what its "
        "profile timed:",
        "- static/chunk=32768: 32,768 tokens in one step (the grid's most: 16,384)"]
    v.runs = v.runs[:1]
    assert grid_line(v) == ""


def test_an_extent_the_grid_does_not_record_is_not_compared():
    # decode rows recorded without their contexts: the grid says nothing of decode keys
    grid = grid_extent({"measurements": [GRID[0], {"kind": "decode", "prefills": [],
                                                   "num_decodes": 8}]})
    assert grid == StepExtent(2048, 2048, 0)
    assert StepExtent(1024, 1024, 500_000).past(grid) == []


def test_plan_notes_each_policy_and_chunk_past_the_grid(tmp_path, capsys):
    from sim.__main__ import main as sim_main

    path = tmp_path / "small-grid.json"
    path.write_text(json.dumps({"efficiency": {}, "measurements": GRID}))
    assert sim_main(["plan", "--trace", "azure-conv", "--max-requests", "20", "--no-max-rate",
                     "--max-num-batched-tokens", "1024,4096", "--calibration", str(path),
                     "--json", "--no-progress"]) == 0
    captured = capsys.readouterr()
    planned = json.loads(captured.out)
    past = planned["past_grid"]
    assert [note.split(":")[0] for note in past] == ["static at chunk 4,096",
                                                      "elastic at chunk 4,096"]
    assert all(f"note: {note}" in captured.err for note in past)


def test_sweep_notes_the_rows_past_each_calibrations_grid(tmp_path, capsys):
    from sim.__main__ import main as sim_main

    path = tmp_path / "small-grid.json"
    path.write_text(json.dumps({"efficiency": {}, "measurements": GRID}))
    out = tmp_path / "sweep"
    args = ["sweep", "--trace", "azure-conv", "--limit", "20", "--policy", "static",
            "--max-num-batched-tokens", "1024,4096", "--calibration", str(path), "--no-progress",
            "--out", str(out)]
    assert sim_main(args) == 0
    err = capsys.readouterr().err
    assert f"note: 1 of 2 rows priced by {path} have steps past its grid" in err
    # the sweep read back from its CSV (--resume: every case done) says the same
    assert sim_main([*args, "--resume"]) == 0
    assert f"note: 1 of 2 rows priced by {path} have steps past its grid" in capsys.readouterr().err


def test_extents_read_from_text_cells_and_empty_ones():
    row = {"step_extent_tokens": "4096.0", "step_extent_sequence_keys": "",
           "step_extent_decode_keys": 700}
    assert StepExtent.from_row(row) == StepExtent(4096, 0, 700)
    assert StepExtent.from_row({"chunk": 2048}) is None
