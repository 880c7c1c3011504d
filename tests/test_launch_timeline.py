"""benchmarks/launch_timeline.py on the CPU: a launch's timeline read into its span, packed
work, ramp and tail, and the launch orders summarised against their one pass."""

from __future__ import annotations

import json

import numpy as np
import pytest
from bench_helpers import load_benchmark

lt = load_benchmark("launch_timeline")
US = 1000  # ns


def test_a_timeline_reads_into_span_work_ramp_and_tail():
    # 3 SMs: SM 0 runs a 10 us program then a 20 us one, SM 1 one of 20 us starting 5 us in,
    # SM 2 nothing; one program exited before working (zeros)
    timeline = np.array([[0, 1 * US, 11 * US], [0, 11 * US, 31 * US], [1, 6 * US, 26 * US],
                         [0, 0, 0]])
    stats = lt.launch_stats(timeline, num_sms=3)
    assert stats["programs"] == 3 and stats["slots_per_sm"] == 1
    assert stats["span_us"] == pytest.approx(30)
    assert stats["work_us"] == pytest.approx(50 / 3)
    assert stats["ramp_us"] == pytest.approx((0 + 5 + 30) / 3)
    assert stats["tail_us"] == pytest.approx((0 + 5 + 30) / 3)


def test_programs_running_side_by_side_on_one_sm_count_as_its_slots():
    timeline = np.array([[0, 0 * US + 1, 10 * US], [0, 2 * US, 12 * US], [1, 1, 12 * US]])
    stats = lt.launch_stats(timeline, num_sms=2)
    assert stats["slots_per_sm"] == 2
    assert stats["work_us"] == pytest.approx((10 + 10 + 12) / 4, rel=1e-3)


def test_orders_are_summarised_against_their_own_one_pass(tmp_path):
    rows = []
    for order, fixed in (("tiles in order", 0.06), ("longest first", 0.03)):
        rows.append({"order": order, "prompt": 8192, "prefix": 0, "length": 8192,
                     "device_ms": 8192 * 4096.5 / 25e6, "span_us": 1.0, "work_us": 1.0,
                     "ramp_us": 0.0, "tail_us": 0.0})
        for p in (0, 2048, 4096, 6144):
            rows.append({"order": order, "prompt": 8192, "prefix": p, "length": 2048,
                         "device_ms": fixed + 2048 * (p + 1024.5) / 20e6, "span_us": 2.0,
                         "work_us": 1.5, "ramp_us": 0.1, "tail_us": 0.4})
    first, second = lt.order_summary(rows, 8192, 2048)
    assert first["order"] == "tiles in order" and second["order"] == "longest first"
    assert first["launch_fixed_ms"] == pytest.approx(0.06)
    assert second["launch_fixed_ms"] == pytest.approx(0.03)
    assert first["pairs_per_ms"] == pytest.approx(20e6)
    assert first["chunk_mean_tail_us"] == pytest.approx(0.4)
    result = {"env": {"gpu": "test"}, "prompt": 8192, "chunk": 2048,
              "summary": [first, second]}
    saved = tmp_path / "r.json"
    saved.write_text(json.dumps(result))
    lt.main(["--report", str(saved)])  # prints, no GPU


def test_a_saved_file_that_is_no_result_is_refused_with_its_path(tmp_path):
    bad = tmp_path / "x.json"
    bad.write_text("{}")
    with pytest.raises(SystemExit) as stop:
        lt.main(["--report", str(bad)])
    assert str(bad) in str(stop.value.code)


def test_a_timeline_that_cannot_hold_the_launch_is_refused_before_it_runs():
    """paged_attention checks the timeline buffer on the host: int64, contiguous, three
    values for every program of the launch."""
    import torch

    from gpu_backend.kernels import paged_attention

    q = torch.zeros(64, 4, 16)
    cache = torch.zeros(4, 16, 2, 16)
    tables = torch.arange(4, dtype=torch.int32).view(1, 4)
    lens = torch.tensor([64], dtype=torch.int32)
    qsl = torch.tensor([0, 64], dtype=torch.int32)

    def call(timeline):
        paged_attention(q, cache, cache, tables, lens, qsl, 0.25, max_query_len=64,
                        timeline=timeline)
    with pytest.raises(ValueError, match="int64"):
        call(torch.zeros(3000, dtype=torch.int32))
    with pytest.raises(ValueError, match="needs 3 per program"):
        call(torch.zeros(6, dtype=torch.int64))
