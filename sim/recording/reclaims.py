"""Where the model's price of elastic's own cost is known to fall short: a run that lends and
reclaims its reserve often, under async scheduling.

In release mode each reclaim makes the step after it allocate torch's activations again, and
the engine that recorded the evidence also exposed that step: it waited for the step in
flight before every elastic action, so the step's launches hid behind nothing (the engine
now detaches behind a step in flight that holds no elastic block, EngineConfig.
detach_behind_step, and no replay has measured that yet). The Azure-conversation slices of
`validation/evidence` reclaimed 4.6-6.8 times a second; with async scheduling their replays
measured elastic's TTFT p50 over static's at the same chunk at 1.6-5.4x what the model
predicted, where the slices that reclaimed at most 1.1 times a second missed both ways
(README, Limits; docs/engine.md, "The step after a reclaim"). Outputs say so from
RECLAIMS_NOTED_PER_S on.
"""

from __future__ import annotations

from collections.abc import Mapping

RECLAIMS_NOTED_PER_S = 2.0
RECLAIM_EVIDENCE = ("Replays that reclaimed 4.6-6.8 times a second with async scheduling "
                    "measured elastic's TTFT p50 over static's at 1.6-5.4x what the model "
                    "predicted, on an engine that waited for the step in flight before each "
                    "reclaim, as it no longer does where that step holds no elastic block "
                    "(README, Limits)")
# the key to the `!` a gain map puts on a cell whose elastic pick reclaims that often
RECLAIM_MARK = (f"!: elastic's pick reclaims its reserve {RECLAIMS_NOTED_PER_S:g} times a second "
                "or more there, under async scheduling: its own cost is likely under-priced")


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


def reclaim_note(summary: Mapping | None, async_scheduling: bool, subject: str) -> str | None:
    """The line an output gives `subject` (a run) that `reclaims_often`; else None."""
    if not reclaims_often(summary, async_scheduling):
        return None
    return (f"{subject} reclaims its reserve {reclaims_per_s(summary):.1f} times a second: its "
            f"own cost is likely under-priced here. {RECLAIM_EVIDENCE}")
