"""Planning layer: sweeps over configurations, the chunk-size plan, and the elastic-gain map.

    sweep       grid of cases -> one tidy row per case (local processes or Ray)
    plan        static at several chunk sizes vs elastic on one trace; pick rule; max rate
    gain_map    elastic's gain over the best static chunk across model x prompt x TP
    reserve     activation reserve as a share of the KV pool (memory plan only)
"""

from sim.planning.capacity import MaxRate, RateSearch, Sustain, find_max_rate
from sim.planning.cases import Case, EngineOptions, SyntheticSpec, TraceSpec
from sim.planning.gain_map import MapQuery, run_map
from sim.planning.parallel import Executor, run_parallel
from sim.planning.plan import PlanQuery, PlanResult, pick, run_plan
from sim.planning.spec import SweepSpec, load_sweep, sweep_from_dict
from sim.planning.sweep import run_case, run_sweep, write_table

__all__ = [
    "Case", "EngineOptions", "Executor", "MapQuery", "MaxRate", "PlanQuery", "PlanResult",
    "RateSearch", "Sustain", "SweepSpec", "SyntheticSpec", "TraceSpec", "find_max_rate",
    "load_sweep", "pick", "run_case", "run_map", "run_parallel", "run_plan", "run_sweep",
    "sweep_from_dict", "write_table",
]
