"""The subcommand parsers of `python -m gpu_backend`: replay, profile and refit.

Building them loads no torch or Triton, so `--help` works, and `main` can say which GPU package is
missing, on a host without them. The engine flags and their defaults are EngineConfig's
(sim.core.config_flags); each subcommand leaves out the settings it does not take.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from sim.core.config_flags import add_engine_flags, positive_float, positive_int
from traces import add_trace_arguments

# Engine settings the GPU engine decides itself (it captures its own decode graph sizes and
# records them in config.json), or that a profile does not use.
REPLAY_EXCLUDED = ("cuda_graph_sizes",)
# a profile times each grid step on its own, synchronously: the simulator derives async
# scheduling's pricing from it (Efficiency.host_gap_s)
PROFILE_EXCLUDED = ("cuda_graph_sizes", "policy", "drain", "reclaim", "enable_prefix_caching",
                    "hash_block_tokens", "async_scheduling")


def add_replay_parser(sub: argparse._SubParsersAction) -> None:
    rp = sub.add_parser("replay", help="replay a trace through the engine (one policy)")
    add_trace_arguments(rp)
    add_engine_flags(rp, exclude=REPLAY_EXCLUDED)
    g = rp.add_argument_group("replay")
    g.add_argument("--no-wait", action="store_true",
                   help="virtual clock: advance by measured step times, skip idle gaps "
                        "(needed with --tensor-parallel-size above 1)")
    g.add_argument("--no-graphs", action="store_true", help="run decode steps eagerly")
    g.add_argument("--torch-cap", default="auto", choices=["auto", "on", "off"],
                   help="cap torch's allocator at the unlent reserve (default: auto, overcommit "
                        "only)")
    g.add_argument("--torch-cap-headroom-gib", type=positive_float, default=None,
                   metavar="GIB",
                   help="what a capped torch may hold above the reserve, for allocator "
                        "rounding and fragmentation (default: 0.25). Emulating a smaller card "
                        "with --gpu-memory-utilization, give the memory that card has beyond "
                        "its own utilization budget, less its non-torch memory")
    g.add_argument("--max-kv-blocks", type=positive_int, default=None,
                   help="cap the base KV pool (memory pressure on a large GPU; default: none)")
    g.add_argument("--out", type=Path, default=None,
                   help="write summary.json, config.json, steps.csv and the run's CSVs here")


def add_profile_parser(sub: argparse._SubParsersAction) -> None:
    pp = sub.add_parser("profile", help="measure step times and fit the cost model")
    add_engine_flags(pp, exclude=PROFILE_EXCLUDED)
    g = pp.add_argument_group("profile")
    g.add_argument("--seed", type=int, default=0, help="seed of the random weights (default: 0)")
    g.add_argument("--quick", action="store_true", help="a small grid (tests, smoke runs)")
    g.add_argument("--passes", type=positive_int, default=2,
                   help="time the grid this many times, every other pass in reverse order, and "
                        "keep each point's median (a drift of the host's speed cancels; "
                        "default: 2)")
    g.add_argument("--replay-setup", action="store_true",
                   help="time the grid as a replay runs its steps: graphs of the replay's "
                        "capture sizes, tables --max-model-len wide, a pool over 60%% of free "
                        "memory with blocks scattered")
    g.add_argument("--no-attention-profile", action="store_true",
                   help="skip timing each prefill launch's attention on its own (the "
                        "attention's terms are then fitted on the whole steps)")
    g.add_argument("--no-sample-clocks", action="store_true",
                   help="do not read the SM clock, power and energy while each grid step is "
                        "launched back to back (NVML every 5 ms; recorded per step as "
                        "ahead_sm_clock_mhz, ahead_power_w, ahead_power_capped_share, "
                        "ahead_energy_j)")
    g.add_argument("--out", type=Path, default=None,
                   help="calibration JSON to write (default: calibration_<model>.json)")


def add_refit_parser(sub: argparse._SubParsersAction) -> None:
    fp = sub.add_parser("refit", help="fit a calibration's stored measurements again (no GPU)")
    fp.add_argument("calibration", type=Path)
    fp.add_argument("--out", type=Path, default=None, help="default: overwrite the input")
    fp.add_argument("--merge", type=Path, nargs="+", default=[], metavar="CALIBRATION",
                    help="profiles of the same grid taken at other times: each point's timings "
                         "become the median over all of them before the fit")
    held = fp.add_mutually_exclusive_group()
    held.add_argument("--program-from", type=Path, default=None, metavar="CALIBRATION",
                      help="hold attention_program (one attention program's speed) at this "
                           "calibration's (same GPU, a model of the same head_dim): for a "
                           "grid without the chunk-beside-long-decode-rows steps that tell it")
    held.add_argument("--attention-from", type=Path, default=None, metavar="CALIBRATION",
                      help="hold every term of the Triton kernel's attention at this "
                           "calibration's (same GPU and model, profiled on the triton backend): "
                           "for a profile on the split or auto backend, whose grid runs that "
                           "kernel on a few short launches only")
    fp.add_argument("--add-launches", type=Path, nargs="+", default=[], metavar="RESULT",
                    help="attention launches timed alone by benchmarks/prefix_attention.py "
                         "(same model, GPU, torch and Triton): those of shapes the calibration "
                         "lacks join its attention measurements before the fit, and the "
                         "calibration records the file (added_attention_launches)")
    fp.add_argument("--copy-bandwidth", type=positive_float, default=None, metavar="BYTES_S",
                    help="measured device-to-device copy bandwidth that pins weight streaming "
                         "(default: the calibration's own copy_bandwidth_bytes_s, if any)")
