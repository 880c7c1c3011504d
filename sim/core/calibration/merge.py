"""Merge profiles of one grid taken at other times: each point's timings become the median.

The host's speed drifts between profiles (one H200 host ran a fixed Python loop in 7 to 14
ms at different times, benchmarks/host_noise.py); the median over several profiles weighs
one drifted profile less. Refit the result (`profile_fit.refit_profile`).
"""

from __future__ import annotations

import json
import statistics

import numpy as np

TIMING_KEYS = ("measured_s", "build_s", "enqueue_s", "device_s", "host_probe_s", "ahead_s",
               "ahead_device_s")
# a profile's timed records: whole steps, and the attention of those with prefill tokens
MERGED_RECORDS = ("measurements", "attention_measurements")
SAME_SETUP_KEYS = ("model", "gpu_preset", "piecewise_sizes")


def merge_profiles(base: dict, others: list[dict], sources: list[str]) -> dict:
    """`base` with each grid point's timings the median over it and `others`, profiles of the
    same model, GPU, grid and piecewise sizes; everything else (memory, VMM costs, versions,
    provenance) stays `base`'s. `sources` names the others in errors and in "merged_from"."""
    for other, source in zip(others, sources, strict=True):
        _check_same_grid(base, other, source)
    merged: dict[str, list[dict]] = {}
    for records in MERGED_RECORDS:
        if not base.get(records):
            continue
        points = []
        for index, entry in enumerate(base[records]):
            profiles = [entry] + [other[records][index] for other in others]
            point = {**entry, **{key: statistics.median(p[key] for p in profiles)
                                 for key in TIMING_KEYS if all(key in p for p in profiles)}}
            point["profiles_measured_s"] = [p["measured_s"] for p in profiles]
            points.append(point)
        merged[records] = points
    probe = base.get("host_probe")
    samples = [p["host_probe_s"] for p in merged.get("measurements", ()) if "host_probe_s" in p]
    if isinstance(probe, dict) and samples:  # the host's speed over the merged timings
        probe = summarize_host_probe(samples, probe.get("iterations"))
    extra = {"host_probe": probe} if probe is not None else {}
    return {**base, **merged, **extra, "merged_from": list(sources)}


def summarize_host_probe(samples: list[float], iterations: object) -> dict:
    """A profile's "host_probe": how long the fixed Python loop of `iterations` took beside
    its grid points (seconds: median, 10th and 90th percentiles)."""
    base = {"iterations": iterations, "count": len(samples)}
    if not samples:
        return {**base, "median_s": None, "p10_s": None, "p90_s": None}
    a = np.asarray(samples, dtype=np.float64)
    return {**base, "median_s": float(np.median(a)), "p10_s": float(np.percentile(a, 10)),
            "p90_s": float(np.percentile(a, 90))}


def _shape_keys(data: dict, records: str) -> list[tuple]:
    return [(m["kind"], json.dumps(m["prefills"]), json.dumps(m.get("decode_groups")))
            for m in data.get(records) or ()]


def _check_same_grid(base: dict, other: dict, source: str) -> None:
    for key in SAME_SETUP_KEYS:
        if other.get(key) != base.get(key):
            raise ValueError(f"{source}: {key} {other.get(key)!r} differs from the base "
                             f"calibration's {base.get(key)!r}; merge profiles of one setup")
    for records in MERGED_RECORDS:
        if _shape_keys(other, records) != _shape_keys(base, records):
            raise ValueError(f"{source}: its grid differs from the base calibration's "
                             f"({records}; profiles of two code versions?); merge profiles "
                             "of the same grid")
