"""Run one configuration over one trace: build the cores, start the SimPy processes, summarize."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import simpy

from sim.core.cost_model import CostModel, Efficiency
from sim.core.elastic import VmmCosts
from sim.core.engine_config import EngineConfig, EngineCore, build_core
from sim.core.memory_plan import ActivationProfile
from sim.engine import Replica
from sim.fleet import Fleet, ProgressFn, TraceRequests
from sim.recording.metrics import ReplicaRecorder, Slo, summarize
from sim.recording.outputs import config_fields, run_label
from traces import Trace

PROGRESS_EVERY_S = 5.0  # simulated seconds between two progress(simulated_s, num_finished) calls


@dataclass(frozen=True)
class RunSpec:
    engine: EngineConfig
    num_replicas: int = 1
    router: str = "round-robin"
    efficiency: Efficiency | None = None
    profile: ActivationProfile | None = None
    slo: Slo = field(default_factory=Slo)
    vmm_costs: VmmCosts | None = None  # a calibration's attach/detach costs (else H200 defaults)

    def __post_init__(self) -> None:
        if self.num_replicas < 1:
            raise ValueError("num_replicas must be >= 1")

    @property
    def label(self) -> str:
        return run_label(self.engine)


@dataclass
class RunResult:
    spec: RunSpec
    summary: dict
    recorders: list[ReplicaRecorder]
    core: EngineCore  # replica 0's core (all replicas share the plan)
    wall_s: float


RecorderFactory = Callable[[int, int], ReplicaRecorder]
"""recorder(replica_id, block_size): what each replica records with (validation logs steps)."""


def simulate(spec: RunSpec, trace: Trace, progress: ProgressFn | None = None,
             recorder: RecorderFactory = ReplicaRecorder) -> RunResult:
    wall_start = time.perf_counter()
    env = simpy.Environment()
    requests = TraceRequests(trace)  # made one at a time as they arrive
    fleet = Fleet(env, requests, spec.router)
    vmm = spec.engine.vmm_cost(spec.vmm_costs)
    cores = [build_core(spec.engine, spec.profile, vmm) for _ in range(spec.num_replicas)]
    cost = CostModel.for_engine(spec.engine, spec.efficiency)
    replicas = [Replica(env, replica_id, core, cost, fleet)
                for replica_id, core in enumerate(cores)]
    for replica in replicas:
        replica.recorder = recorder(replica.replica_id, replica.core.config.block_size)
    fleet.replicas.extend(replicas)
    env.process(fleet.arrivals(env))
    for replica in replicas:
        env.process(replica.run(env))
    if progress is not None:
        env.process(fleet.monitor(env, progress, PROGRESS_EVERY_S))
    env.run(until=fleet.done)
    recorders = [r.recorder for r in replicas]
    summary = summarize(recorders, spec.slo)
    summary.update(config_fields(cores[0], spec.num_replicas))
    wall_s = time.perf_counter() - wall_start
    summary["sim_wall_s"] = wall_s
    return RunResult(spec, summary, recorders, cores[0], wall_s)
