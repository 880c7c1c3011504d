"""`python -m validation table`: reports side by side, and every run pooled."""

from __future__ import annotations

import json
import statistics

import pytest

from validation.cli import main
from validation.table import table

METRICS = ("ttft_p50_s", "tpot_p50_s", "throughput_tok_s", "ttft_p99_s", "kv_capacity_tokens")


def write_report(folder, errors: list[float], model: str | None = None) -> None:
    """A report whose runs all carry the relative error errors[i] on every metric."""
    config = {"config": {"model": model}} if model else {}
    runs = [{"label": f"run{i}", **config, "metrics": {
        **{m: {"predicted": 1 + e, "measured": 1.0, "difference": e, "relative_error": e}
           for m in METRICS},
        "reserve_share": {"predicted": 0.01, "measured": 0.01, "difference": 0.001,
                          "relative_error": 0.1}}} for i, e in enumerate(errors)]
    folder.mkdir()
    (folder / "report.json").write_text(json.dumps({"runs": runs}))


def test_pooled_row_takes_the_median_over_every_run(tmp_path):
    write_report(tmp_path / "a", [0.01, -0.03])
    write_report(tmp_path / "b", [0.20, -0.08, 0.09])
    rows = table([tmp_path / "a", tmp_path / "b"]).splitlines()
    a, b, pooled = rows[2], rows[3], rows[4]
    assert a.startswith("| a | 2 | 2.0% | 2.0% | 2.0% | 2.0% | **3.0%** |")  # KV: max, limit 2%
    assert b.startswith("| b | 3 | **9.0%** |")
    # pooled |errors| 1, 3, 8, 9, 20 %: median 8% (not the median of the two rows' medians)
    assert pooled.startswith("| all of the above | 5 | **8.0%** | **8.0%** | **8.0%** | 8.0% |")
    assert pooled.endswith("| **20.0%** | 0.10 pp |")


def test_each_model_gets_its_own_pooled_row(tmp_path):
    write_report(tmp_path / "big_conv", [0.01, 0.02], model="big")
    write_report(tmp_path / "big_code", [0.03, -0.02], model="big")
    write_report(tmp_path / "small_conv", [0.07, -0.09], model="small")
    rows = table([tmp_path / name for name in ("big_conv", "big_code", "small_conv")]).splitlines()
    # big: 1, 2, 2, 3 % -> median 2%; small: 7, 9 % -> 8%; all six: 1, 2, 2, 3, 7, 9 -> 2.5%
    assert rows[5].startswith("| all big runs | 4 | 2.0% |")
    assert rows[6].startswith("| all small runs | 2 | **8.0%** |")
    assert rows[7].startswith("| all of the above | 6 | 2.5% |")
    one_model = table([tmp_path / "big_conv", tmp_path / "big_code"]).splitlines()
    assert not any(r.startswith("| all big runs") for r in one_model)


def test_a_folder_without_a_report_is_a_clear_error(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert main(["table", str(tmp_path / "empty")]) == 2
    assert "empty/report.json: cannot read a validation report" in capsys.readouterr().err
    (tmp_path / "empty" / "report.json").write_text(json.dumps({"runs": []}))
    with pytest.raises(ValueError, match="no \"runs\""):
        table([tmp_path / "empty"])


def gain(run: str, baseline: str, values: dict[str, tuple[float, float]]) -> dict:
    """A gains entry: metric -> (predicted gain, measured gain), directions as compare gives."""
    def direction(g: float) -> int:
        return 0 if abs(g) < 0.01 else (1 if g > 0 else -1)
    return {"run": run, "baseline": baseline, "metrics": {
        m: {"predicted_gain": p, "measured_gain": g, "gain_error": p - g,
            "same_direction": direction(p) == direction(g)} for m, (p, g) in values.items()}}


def test_the_gain_table_counts_decisions_at_the_same_chunk_and_over_a_smaller_one(tmp_path):
    write_report(tmp_path / "a", [0.01])
    report = json.loads((tmp_path / "a" / "report.json").read_text())
    report["gains"] = [
        gain("elastic/chunk=8192", "static/chunk=8192", {
            "ttft_p50_s": (0.05, 0.04), "tpot_p50_s": (0.0, 0.03),  # agrees; misses an up
            "throughput_tok_s": (0.002, -0.004), "ttft_p99_s": (-0.02, -0.05),  # both agree
            "kv_capacity_tokens": (0.0, 0.0), "num_preemptions": (0.5, 0.0)}),  # last: not counted
        gain("elastic/chunk=8192", "static/chunk=2048", {
            "ttft_p50_s": (-0.30, -0.44), "tpot_p50_s": (-0.01, -0.015),  # only the first >= 2%
            "throughput_tok_s": (0.03, -0.05), "ttft_p99_s": (0.0, 0.001)})]
    (tmp_path / "a" / "report.json").write_text(json.dumps(report))
    lines = table([tmp_path / "a"]).splitlines()
    start = lines.index("| elastic over static | metrics | pairs | same decision | "
                        "median \\|gain error\\| | settled by the replays | "
                        "same decision there | same decision, replays' medians |")
    same, same_kv, smaller = lines[start + 2], lines[start + 3], lines[start + 4]
    # measured >= 2%: TTFT p50 (agrees), TPOT p50 (misses an up), TTFT p99 (agrees);
    # |errors| 1, 3, 0.6, 3 pp -> median 2.0; with KV's 0: 0, 0.6, 1, 3, 3 -> 1.0
    assert same == ("| at the same chunk | TTFT p50, p99, TPOT p50, throughput | "
                    "4 (3 measured >= 2%) | 2 of 3 | 2.00 pp | 0 of 0 | 0 of 0 | 2 of 3 |")
    assert same_kv.endswith(
        "| 5 (3 measured >= 2%) | 2 of 3 | 1.00 pp | 0 of 1 | 0 of 0 | 2 of 3 |")
    # measured >= 2%: TTFT p50 (agrees) and throughput (opposite); |errors| 14, 0.5, 8, 0.1
    assert smaller == ("| over a smaller chunk | TTFT p50, p99, TPOT p50, throughput | "
                       "4 (2 measured >= 2%) | 1 of 2 | 4.25 pp | 0 of 0 | 0 of 0 | 1 of 2 |")
    write_report(tmp_path / "b", [0.01])
    assert "Gains, predicted" not in table([tmp_path / "b"])  # no gains: no table


def repeat_row(run: str, metric: str, value: float, repeats: dict[str, float]) -> dict:
    return {"run": run, "metric": metric, "value": value,
            "repeats": [{"name": n, "value": v} for n, v in repeats.items()],
            "max_deviation": max(abs(v / value - 1) for v in repeats.values()),
            "median": statistics.median([value, *repeats.values()])}


def test_decisions_settled_by_the_replays_count_apart(tmp_path):
    """A gain counts as settled only when every replay pair (the compared replays, then each
    repeat folder holding both runs) measured it at >= 2% the same way."""
    write_report(tmp_path / "a", [0.01])
    report = json.loads((tmp_path / "a" / "report.json").read_text())
    run, base = "elastic/chunk=8192", "static/chunk=2048"
    report["gains"] = [gain(run, base, {
        "ttft_p50_s": (-0.10, -0.10),  # replays: -10%, -8%, -12%: settled down, predicted down
        "tpot_p50_s": (0.03, 0.05),  # replays: +5%, -1%: not settled
        "throughput_tok_s": (-0.05, 0.04),  # replays: +4%, +3%: settled up, predicted down
        "ttft_p99_s": (0.05, 0.06)}),  # no repeat of the baseline: not replayed again
        gain(run, "static/chunk=8192", {"ttft_p50_s": (0.03, 0.03)})]  # +3%, +1.5%: too small
    report["repeats"] = [
        repeat_row(run, "ttft_p50_s", 0.90, {"repeat-1": 0.92, "repeat-2": 0.88}),
        repeat_row(base, "ttft_p50_s", 1.00, {"repeat-1": 1.00, "repeat-2": 1.00}),
        repeat_row(run, "tpot_p50_s", 1.05, {"repeat-1": 0.99}),
        repeat_row(base, "tpot_p50_s", 1.00, {"repeat-1": 1.00}),
        repeat_row(run, "throughput_tok_s", 1.04, {"repeat-1": 1.03, "repeat-3": 2.0}),
        repeat_row(base, "throughput_tok_s", 1.00, {"repeat-1": 1.00}),  # no repeat-3 here
        repeat_row(run, "ttft_p99_s", 1.06, {"repeat-1": 1.06}),
        repeat_row("static/chunk=8192", "ttft_p50_s", 0.8738, {"repeat-1": 0.9064})]
    (tmp_path / "a" / "report.json").write_text(json.dumps(report))
    lines = table([tmp_path / "a"]).splitlines()
    smaller = next(line for line in lines if line.startswith("| over a smaller chunk | TTFT p50"))
    # on the replays' medians: TTFT p50 -10% (agrees), TPOT p50 +2% (agrees), throughput +4%
    # (opposite), TTFT p99 +6% from the compared replays (its baseline has no repeat; agrees)
    assert smaller.endswith("| 2 of 3 | 1 of 2 | 3 of 4 |")
    same = next(line for line in lines if line.startswith("| at the same chunk | TTFT p50"))
    # one way, but one replay pair under 2%; the compared replays' +3.0% is +1.1% on the
    # medians (0.90 over 0.8901): counted in the decisions, not on the medians
    assert same.endswith("| 1 (1 measured >= 2%) | 1 of 1 | 0.00 pp | 0 of 1 | 0 of 0 | 0 of 0 |")


def test_a_pair_replayed_apart_settles_nothing(tmp_path):
    """Replays of the run and its baseline on different starts of the machine compare two
    hosts: however one-sided their gains, they settle no decision."""
    write_report(tmp_path / "a", [0.01])
    report = json.loads((tmp_path / "a" / "report.json").read_text())
    run, base = "elastic/chunk=2048", "static/chunk=2048"
    report["gains"] = [{**gain(run, base, {"ttft_p50_s": (-0.10, -0.10)}), "replayed_apart": True}]
    report["repeats"] = [
        repeat_row(run, "ttft_p50_s", 0.90, {"repeat-1": 0.92, "repeat-2": 0.88}),
        repeat_row(base, "ttft_p50_s", 1.00, {"repeat-1": 1.00, "repeat-2": 1.00})]
    (tmp_path / "a" / "report.json").write_text(json.dumps(report))
    same = next(line for line in table([tmp_path / "a"]).splitlines()
                if line.startswith("| at the same chunk | TTFT p50"))
    # decided and right on the compared replays and on the medians, but not settled
    assert same.endswith("| 1 (1 measured >= 2%) | 1 of 1 | 0.00 pp | 0 of 0 | 0 of 0 | 1 of 1 |")
    del report["gains"][0]["replayed_apart"]
    (tmp_path / "a" / "report.json").write_text(json.dumps(report))
    same = next(line for line in table([tmp_path / "a"]).splitlines()
                if line.startswith("| at the same chunk | TTFT p50"))
    assert same.endswith("| 1 (1 measured >= 2%) | 1 of 1 | 0.00 pp | 1 of 1 | 1 of 1 | 1 of 1 |")
