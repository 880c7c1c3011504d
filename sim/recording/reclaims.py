"""Where the model's price of elastic's own cost is least known: a run that lends and
reclaims its reserve often, under async scheduling.

An attach waits for the step in flight, and in release mode each lend empties torch's cache,
so the step after a reclaim allocates its activations again. An engine that also waits for
the step in flight before each detach exposes the step after it: on an H100 a 205-token eager
mixed step so exposed took 14.78 ms with the detach against 9.42 ms launched ahead, where the
model adds 7.1% (12.14 against 11.34 ms; benchmarks/reclaim_step.py, docs/engine.md, "The step
after a reclaim"). The engine detaches behind a step in flight that holds no elastic block
(EngineConfig.detach_behind_step, on by default); the unmap still holds that step back, and the
simulator charges it the detach's time. Replayed so, five Azure-conversation slices at 5.3-6.8
reclaims a second (Llama-3.1-8B on an H100 and on an H200, Llama-3.2-3B on an H200, Qwen2.5-0.5B
on an H200 and on an H100) measured elastic's TTFT p50 over static's at the same chunk within
0.3-3.4 points of the prediction on their compared replays (README, Limits). Outputs say so
from RECLAIMS_NOTED_PER_S on.
"""

from __future__ import annotations

from collections.abc import Mapping

RECLAIMS_NOTED_PER_S = 2.0
RECLAIM_EVIDENCE = ("At that rate the model's price of elastic's own cost is measured on five "
                    "slices, Azure conversations at 5.3-6.8 reclaims a second: Llama-3.1-8B on an "
                    "H100 and an H200, Llama-3.2-3B on an H200, Qwen2.5-0.5B on an H200 and an "
                    "H100, where elastic's TTFT p50 over static's came within 0.3-3.4 points of "
                    "the prediction on their compared replays (README, Limits)")
WAITING_EVIDENCE = ("Waiting exposes the step after each reclaim: on an H100 a 205-token eager "
                    "mixed step took 1.57x its time launched ahead, where the model adds 7.1% "
                    "(benchmarks/reclaim_step.py)")
# the key to the `!` a gain map puts on a cell whose elastic pick reclaims that often
RECLAIM_MARK = (f"!: elastic's pick reclaims its reserve {RECLAIMS_NOTED_PER_S:g} times a second "
                "or more there, under async scheduling")


def reclaims_per_s(summary: Mapping | None) -> float | None:
    """How often an elastic run reclaimed its reserve: detaches over the makespan, from a
    run's summary or a sweep row (None for a static run, or one that did not run)."""
    if summary is None or summary.get("policy") != "elastic":
        return None
    detaches, makespan_s = summary.get("num_detach"), summary.get("makespan_s")
    if detaches is None or not makespan_s:
        return None
    return float(detaches) / float(makespan_s)


def reclaims_often(summary: Mapping | None, async_scheduling: bool) -> bool:
    """An elastic run under async scheduling that reclaimed RECLAIMS_NOTED_PER_S times a
    second or more: the model likely under-prices its own cost."""
    rate = reclaims_per_s(summary)
    return async_scheduling and rate is not None and rate >= RECLAIMS_NOTED_PER_S


def reclaim_note(summary: Mapping | None, async_scheduling: bool, subject: str,
                 detach_behind_step: bool = True) -> str | None:
    """The line an output gives `subject` (a run) that `reclaims_often`; else None.
    `detach_behind_step`: the run's engine setting; an engine that waits for the step in
    flight before each reclaim is likely under-priced there."""
    if not reclaims_often(summary, async_scheduling):
        return None
    said = f"{subject} reclaims its reserve {reclaims_per_s(summary):.1f} times a second"
    if detach_behind_step:
        return f"{said}. {RECLAIM_EVIDENCE}"
    return (f"{said} and waits for the step in flight before each reclaim: its own cost is "
            f"likely under-priced here. {WAITING_EVIDENCE}")
