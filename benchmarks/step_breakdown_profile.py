"""Where a step's device time goes, from torch's profiler (CUPTI kernel records, CUDA-graph
replays included): each kernel's class by its name, the device's busy time (the union of the
kernel intervals), its idle gaps with the kernels on either side, and the host's CUDA calls;
and one call's device time with no host launch cost in it (replays of a CUDA graph).

benchmarks/step_breakdown.py profiles the engine's steps with these."""

from __future__ import annotations

import re
import time

import torch
from torch.profiler import ProfilerActivity, profile

# kernel class <- first pattern its name matches (checked in this order)
CLASSES = (
    ("attention (cuDNN)", r"cudnn|fmha|flash|sdpa"),
    ("attention (Triton)", r"paged_attention|combine_splits|decode_split_plan"),
    ("LSE merge", r"_merge_kernel"),
    ("matmul", r"gemm|nvjet|cutlass|xmma|cublas|splitK|sm90_|sm80_"),
    ("fused norm/rotary/act", r"rms_norm|rotary|silu|store_kv"),
    ("gather/copy", r"index|gather|copy|Memcpy|memcpy|scatter|cat"),
    ("sampling", r"argmax|reduce|max"),
)


def kernel_class(name: str) -> str:
    for label, pattern in CLASSES:
        if re.search(pattern, name, re.IGNORECASE):
            return label
    return "other"


def kernel_records(prof) -> list[tuple[str, float, float]]:
    """(name, start us, end us) of every device kernel and copy the profiler saw."""
    out = []
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA and e.time_range.end > 0:
            out.append((e.name, float(e.time_range.start), float(e.time_range.end)))
    return sorted(out, key=lambda r: r[1])


def busy_us(records: list[tuple[str, float, float]]) -> float:
    """Length of the union of the kernel intervals."""
    total, end = 0.0, -1.0
    for _, s, e in records:
        if s >= end:
            total += e - s
            end = e
        elif e > end:
            total += e - end
            end = e
    return total


GAP_BUCKETS_US = (5.0, 20.0, 100.0, 1000.0)


def gaps(records: list[tuple[str, float, float]], repeat: int) -> dict:
    """The device's idle gaps between kernels (each length's count and ms divided by
    `repeat`, the runs or steps profiled), and the longest with the kernels on either side."""
    found, end, before = [], None, ""
    for name, s, e in records:
        if end is not None and s > end:
            found.append((s - end, before, name))
        if end is None or e >= end:
            end, before = e, name
    edges = (0.0, *GAP_BUCKETS_US, float("inf"))
    buckets = {}
    for low, high in zip(edges, edges[1:]):
        inside = [g for g, _, _ in found if low <= g < high]
        buckets[f"{low:g}-{high:g} us"] = {"count": len(inside) / repeat,
                                          "ms": sum(inside) / 1e3 / repeat}
    longest = sorted(found, key=lambda g: -g[0])[:10]
    return {"by_length": buckets,
            "longest": [{"us": g, "after": a[:80], "before": b[:80]} for g, a, b in longest]}


def host_calls(fn, repeat: int, per: int) -> list[dict]:
    """CUDA runtime and driver calls on the host while `fn` runs `repeat` times, divided by
    `per` (a second, host-traced profile: the host tracing slows the host, so no device timing
    is taken from it)."""
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(repeat):
            fn()
        torch.cuda.synchronize()
    calls: dict[str, list[float]] = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CPU and e.name.startswith("cu"):
            entry = calls.setdefault(e.name, [0.0, 0])
            entry[0] += (e.time_range.end - e.time_range.start) / 1e3 / per
            entry[1] += 1
    top = sorted(calls.items(), key=lambda kv: -kv[1][0])[:10]
    return [{"name": n, "ms": v[0], "calls": v[1] / per} for n, v in top]


def breakdown(fn, repeat: int, steps: int = 1) -> dict:
    """Profile `fn` run `repeat` times (after one warm-up): wall, busy and per-class ms, the
    device's idle gaps and the host's CUDA calls, per run, or per step where one run of `fn`
    is `steps` steps."""
    per = repeat * steps
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        start = time.perf_counter()
        for _ in range(repeat):
            fn()
        torch.cuda.synchronize()
        wall = (time.perf_counter() - start) / per
    records = kernel_records(prof)
    classes: dict[str, float] = {}
    kernels: dict[str, list[float]] = {}
    for name, s, e in records:
        label = kernel_class(name)
        classes[label] = classes.get(label, 0.0) + (e - s) / 1e3 / per
        entry = kernels.setdefault(name, [0.0, 0])
        entry[0] += (e - s) / 1e3 / per
        entry[1] += 1
    span = (records[-1][2] - records[0][1]) / 1e3 / per if records else 0.0
    busy = busy_us(records) / 1e3 / per
    top = sorted(kernels.items(), key=lambda kv: -kv[1][0])[:12]
    return {"wall_ms": wall * 1e3, "device_span_ms": span, "busy_ms": busy,
            "idle_ms": wall * 1e3 - busy, "classes_ms": dict(sorted(classes.items())),
            "top_kernels": [{"name": n[:120], "class": kernel_class(n), "ms": v[0],
                             "calls": v[1] // per} for n, v in top],
            "gaps": gaps(records, per), "host_calls": host_calls(fn, repeat, per)}


def graph_ms(fn, calls: int = 50, repeat: int = 20) -> float:
    """Device time of one `fn()` (ms): `calls` of them captured in one CUDA graph, the replay
    timed with events (median of `repeat`), so no launch cost of the host's is in it."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    times = []
    for _ in range(repeat):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / calls)
    del graph
    return sorted(times)[len(times) // 2]
