"""benchmarks/step_breakdown.py on the CPU: how it sorts kernels into classes, measures the
device's busy time and finds its idle gaps (hand-made kernel intervals, in microseconds)."""

from __future__ import annotations

import pytest
from bench_helpers import load_benchmark

sb = load_benchmark("step_breakdown")


@pytest.mark.parametrize("name, label", [
    ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop", "attention (cuDNN)"),
    ("paged_attention_kernel", "attention (Triton)"),
    ("combine_splits_kernel", "attention (Triton)"),
    ("_merge_kernel", "LSE merge"),
    ("nvjet_sm90_tst_192x192_64x4_2x1_v_bz_coopB_TNN", "matmul"),
    ("_add_rms_norm_kernel", "fused norm/rotary/act"),
    ("_rotary_store_kv_kernel", "fused norm/rotary/act"),
    ("void at::native::vectorized_gather_kernel<16, long>", "gather/copy"),
    ("Memcpy HtoD (Pinned -> Device)", "gather/copy"),
    ("void at::native::reduce_kernel<512, 1, ArgMaxOps>", "sampling"),
    ("void at::native::vectorized_elementwise_kernel<4, FillFunctor>", "other"),
])
def test_kernels_fall_into_their_class(name, label):
    assert sb.kernel_class(name) == label


def test_busy_time_counts_overlapping_kernels_once():
    records = [("a", 0.0, 10.0), ("b", 5.0, 12.0), ("c", 6.0, 8.0), ("d", 20.0, 25.0)]
    assert sb.busy_us(records) == 17.0  # [0, 12] and [20, 25]
    assert sb.busy_us([]) == 0.0


def test_gaps_are_measured_from_the_latest_end_and_bucketed_per_run():
    records = [("a", 0.0, 10.0), ("long", 12.0, 50.0), ("short", 13.0, 14.0),
               ("b", 53.0, 60.0), ("c", 260.0, 261.0)]
    found = sb.gaps(records, repeat=2)
    # 10 -> 12 (2 us, after a), 50 -> 53 (3 us, after the long kernel that ends last), 60 -> 260
    by_length = found["by_length"]
    assert by_length["0-5 us"] == {"count": 1.0, "ms": 0.0025}
    assert by_length["100-1000 us"] == {"count": 0.5, "ms": 0.1}
    assert sum(b["count"] for b in by_length.values()) == 1.5
    longest = found["longest"]
    assert [(g["us"], g["after"], g["before"]) for g in longest] == [
        (200.0, "b", "c"), (3.0, "long", "b"), (2.0, "a", "long")]
