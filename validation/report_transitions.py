"""report.md's lines on the replays' elastic transitions: each one as measured (the model
prices every transition at one calibrated cost) and the slowest of each replay by phase."""

from __future__ import annotations

import numpy as np


def transition_line(runs: list[tuple[str, dict]]) -> str:
    """The replays' elastic transitions one by one (measured.attach_latency_s /
    detach_latency_s: count, p50, max): the model prices each at a fixed cost, and a rare
    stall of tens of milliseconds (seen on the H200) lands in TTFT p99. "" without any."""
    parts = []
    for label, summary in runs:
        measured = summary.get("measured") or {}
        kinds = []
        for kind in ("attach", "detach"):
            stats = measured.get(f"{kind}_latency_s") or {}
            if stats.get("count") and stats.get("p50") is not None:
                kinds.append(f"{kind} {stats['count']} x, p50 {stats['p50'] * 1e3:.2f} ms, "
                             f"max {stats['max'] * 1e3:.1f} ms")
        if kinds:
            parts.append(f"{label}: " + "; ".join(kinds))
    if not parts:
        return ""
    return ("Elastic transitions as measured, one by one (the model prices each at its "
            "calibrated cost): " + " | ".join(parts) + ".")


def slowest_transition_line(runs: list[tuple[str, dict[str, np.ndarray] | None]]) -> str:
    """Per run, its slowest elastic transition and where the time went (the replay's
    transitions.csv; "" where no run has one)."""
    parts = []
    for label, moves in runs:
        if not moves or len(moves.get("total_s", ())) == 0:
            continue
        i = int(np.argmax(moves["total_s"]))
        phases = [f"{name[:-2].replace('_', ' ')} {moves[name][i] * 1e3:.1f} ms"
                  for name in ("empty_cache_s", "copy_s", "map_s", "unmap_s")
                  if name in moves and moves[name][i] > 0]
        freed = moves["freed_bytes"][i] / 2**30 if "freed_bytes" in moves else 0.0
        parts.append(f"{label}: {moves['kind'][i]} before step {int(moves['step_id'][i])}, "
                     f"{moves['total_s'][i] * 1e3:.1f} ms (" + ", ".join(phases)
                     + (f"; {freed:.2f} GiB of torch's cache freed" if freed else "") + ")")
    return ("The slowest transition of each replay, by phase: " + " | ".join(parts) + "."
            if parts else "")
