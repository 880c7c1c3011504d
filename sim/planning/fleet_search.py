"""One configuration's search for its fewest replicas: the bound, the trials, the bisection.

Replica counts below the throughput bound (`sim.planning.bounds`) are known to fail without
a run. Above it the search assumes monotonicity: more replicas of a configuration that meets
the targets meet them too. Until a count passes it gallops upward (bound, +1, +2, +4, ...:
failing runs mostly stop early and cost little, a passing one runs to the end), then bisects
between the largest count seen to fail and the smallest seen to pass. The answer is that
smallest passing count once the one below it has failed (or is below the bound).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from sim.planning.cases import Case
from sim.planning.sustain import Trial


class Status(enum.Enum):
    SEARCHING = "searching"
    FOUND = "found"
    UNFIT = "does not fit"  # the memory plan refuses it: never simulated
    BEYOND = "beyond max replicas"  # fails at every count up to --max-replicas
    OUTRANKED = "outranked"  # cannot beat the answer and its runners-up


@dataclass
class ConfigSearch:
    index: int  # order in the query's grid (the last tie-break)
    case: Case  # num_replicas 1; each trial sets its own
    unit_cost: float  # objective per replica: GPUs, or $ per hour
    fit_error: str | None
    bound_replicas: int = 1  # fewest replicas the throughput bound allows
    failed_at: int = 0  # largest count known to fail (by the bound or a run)
    passed: Trial | None = None  # the smallest count seen to pass
    trials: list[Trial] = field(default_factory=list)
    status: Status = Status.SEARCHING
    _step: int = 1

    def __post_init__(self) -> None:
        if self.fit_error is not None:
            self.status = Status.UNFIT
        self.failed_at = max(self.failed_at, self.bound_replicas - 1)

    @property
    def tp(self) -> int:
        return self.case.tp

    @property
    def replicas(self) -> int | None:
        """The answer: fewest replicas that meet the targets (once found)."""
        return self.passed.num_replicas if self.status is Status.FOUND and self.passed else None

    def cost(self, num_replicas: int) -> float:
        return num_replicas * self.unit_cost

    def optimistic_cost(self) -> float:
        """The least this configuration can still cost: one replica above the last failure."""
        return self.cost(self.failed_at + 1)

    def settle(self, max_replicas: int, cap_cost: float | None) -> None:
        """Close the search where nothing is left to try: found, beyond the replica limit, or
        unable to beat `cap_cost` (the costs of the answers already kept)."""
        if self.status is not Status.SEARCHING:
            return
        if self.passed is not None and self.passed.num_replicas - self.failed_at <= 1:
            self.status = Status.FOUND
        elif self.failed_at >= max_replicas:
            self.status = Status.BEYOND
        elif cap_cost is not None and self.optimistic_cost() > cap_cost:
            self.status = Status.OUTRANKED

    def next_probe(self, max_replicas: int, cap_cost: float | None) -> int:
        """The replica count to run next (call `settle` first: the search is open)."""
        cap = max_replicas
        if cap_cost is not None and self.unit_cost > 0:
            cap = min(cap, int(cap_cost / self.unit_cost * (1 + 1e-12)))
        if self.passed is not None:
            probe = (self.failed_at + self.passed.num_replicas) // 2
        else:
            probe = self.failed_at + self._step
        return max(self.failed_at + 1, min(probe, cap))

    def record(self, trial: Trial) -> None:
        self.trials.append(trial)
        if trial.verdict.ok:
            if self.passed is None or trial.num_replicas < self.passed.num_replicas:
                self.passed = trial
        else:
            self.failed_at = max(self.failed_at, trial.num_replicas)
            self._step *= 2

    def rank_key(self) -> tuple:
        """Cheapest first; then fewer GPUs, lower TTFT p99, grid order."""
        assert self.passed is not None and self.passed.summary is not None
        ttft = self.passed.summary["ttft_s"]["p99"]
        return (self.cost(self.passed.num_replicas), self.passed.num_replicas * self.tp,
                float("inf") if ttft is None else ttft, self.index)
