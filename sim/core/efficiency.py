"""The cost model's fitted efficiencies, and the what-if variants of a set of them.

`Efficiency` holds what share of the GPU's peak rates each operator of `CostModel`
(sim.core.cost_model) achieves, and the fixed per-step times; a calibration fits the
`FIT_PARAMETERS` among them to measured step times (`sim.core.calibration`). `slower` and
`host_slower` scale a set for sensitivity runs: every step longer, or only the host's share.

Default efficiencies come from DESIGN.md's H200 measurements: Llama-3.1-8B linear layers cost
0.58-0.64 us per token per layer at 512-16,384 tokens (2 x 218 M params / 0.6 us = 727 TFLOP/s,
0.73 of the 989 TFLOP/s datasheet peak) and turn weight-bound below ~256 tokens (1.0 us at 128
tokens = 436 MB in 128 us = 3.4 TB/s, 0.71 of 4.8 TB/s). A calibration written by
`python -m gpu_backend profile` replaces them with values fitted on the user's GPU
(`sim.core.calibration` reads it).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields, replace

# Efficiency fields that may be None, and what None prices them as (each field's comment).
UNSET_MEANS = {"piecewise_launch_s": "as eager_launch_s", "attention_program": "not priced",
               "mixed_decode_compute": "as attention_compute", "decode_host_gap_s": "as host_gap_s"}
OPTIONAL_FIELDS = tuple(UNSET_MEANS)
# Efficiency's rates, each a share of a datasheet peak: within (0, 1].
RATE_FIELDS = ("linear_compute", "memory", "kv_memory", "attention_compute", "interconnect",
               "attention_program", "split_attention_compute", "mixed_decode_compute")
# Efficiency's shares of a shorter time not hidden under a longer one: each within [0, 1].
SERIAL_FRACTIONS = ("linear_serial_fraction", "launch_serial_fraction", "attention_program_serial")


@dataclass(frozen=True)
class Efficiency:
    linear_compute: float = 0.73  # of peak bf16 FLOP/s, large GEMMs
    memory: float = 0.71  # of HBM bandwidth, weight streaming by the linear layers
    kv_memory: float = 0.71  # of HBM bandwidth, KV streaming by decode attention (paged reads)
    attention_compute: float = 0.45  # of peak, causal prefill attention (flash-style kernels)
    interconnect: float = 0.8  # of the link bandwidth, ring all-reduce
    allreduce_latency_s: float = 8e-6  # per all-reduce call (NCCL on NVLink, small messages)
    step_overhead_s: float = 1.0e-3  # per step: scheduler, input preparation, launches
    per_seq_overhead_s: float = 4e-6  # per scheduled sequence (block tables, metadata)
    # Host time to launch a step that runs eagerly: one with prefill tokens, as engines capture
    # CUDA graphs for decode-only steps only (vLLM before piecewise graphs, this project's
    # engine). The host enqueues kernels while the device runs the earlier ones, so such a
    # step takes max(device time, this), not the sum: short chunks are launch-bound, long
    # ones compute-bound (H200, Llama-3.1-8B, torch layers: prefills of 16 to 1,024 tokens
    # all took ~42 ms). 0 where every step is graphed.
    eager_launch_s: float = 0.0
    # Host time to launch a step that runs piecewise CUDA graphs (CostModel's
    # token_graph_sizes): attention launched eagerly between the graph pieces, every piece a
    # graph replay (Qwen2.5-0.5B on the H200: 3-5 ms against 11-22 ms fully eager). None: as
    # eager_launch_s (a calibration from before this term, whose eager_launch_s was fitted on
    # the piecewise steps it timed, or one that timed no piecewise step).
    piecewise_launch_s: float | None = None
    # How much of the shorter of a linear layer's compute and weight-read times is NOT hidden
    # under the longer, at the ridge where the two are equal: 0 is the roofline (max of the
    # two), 1 adds them there. Away from the ridge the share fades with the shorter's ratio to
    # the longer (OperatorCosts.linear_s: longer + fraction x shorter^2 / longer), so a chunk's
    # compute-bound GEMMs hide their weight read. Skinny GEMMs (decode batches of 8..64 rows)
    # sit near the ridge: measured H200 decode steps grow with the batch long before the
    # roofline's compute term overtakes the weight read.
    linear_serial_fraction: float = 0.0
    # Host time added to an eager step's launch when its attention splits each tile's keys
    # over several programs (`attention_num_splits`): per layer a combine kernel and two scratch
    # buffers more. Qwen2.5-0.5B with piecewise graphs on the H200: 4.4-4.7 ms launches with
    # splits against 3.1-3.4 ms without (profile grid; replays alike).
    split_launch_s: float = 0.0
    # How much of the shorter of an eager step's device time and launch time is NOT hidden
    # under the longer (as linear_serial_fraction for a GEMM's compute and weight read): the
    # device waits for the first launches and runs the last ones after the host is done. 0 is
    # a perfect overlap. It shows where the two are close: Qwen2.5-0.5B's piecewise steps of
    # 1-2k tokens (3-4 ms of launches, as long on the device) took 15-20% over the max.
    launch_serial_fraction: float = 0.0
    # Of one SM's share of the peak bf16 FLOP/s: how fast one program of a prefill or mixed
    # attention launch works through its keys (CostModel.longest_program_s). Such a launch
    # gives every sequence's 128-row tile, a decode row's too, one program per KV head, and
    # splits no keys once the programs fill the SMs, so it lasts at least as long as its
    # longest sequence's program: a 2,048-token chunk beside decode rows of ~30k keys
    # (Mooncake) took 13 ms more than its total work predicts on Llama-3.1-8B and -3.2-3B
    # alike. None: not priced (calibrations from before this term, or grids without such steps).
    attention_program: float | None = None
    # How much of the shorter of such a launch's total work and its longest program is NOT
    # hidden under the longer (as linear_serial_fraction): the long programs do not all start
    # at once, and the SMs they hold share their bandwidth. The Mooncake replays' own
    # chunk-2,048 steps (18 decode rows, five of ~27k keys), their attention timed alone, ran
    # 1.3-1.7x the longer of the two (benchmarks/replay_attention.py); 0 is max(work, longest).
    attention_program_serial: float = 0.0
    # Of peak bf16 FLOP/s: what cuDNN's SDPA achieves on SPLIT's products, padding included
    # (attention backends split and auto; sim.core.split_shapes.SplitShapes.work). One H200,
    # Llama-3.1-8B heads, a 16,384-token causal pass: 3.29 ms a layer, 0.67 of the peak
    # (benchmarks/results/attention_options_nvidia-h200.json).
    split_attention_compute: float = 0.67
    # Device time of one SPLIT SDPA call in one layer besides its products: the call's first
    # and last waves, its share of the gathers and the log-sum-exp merge. A fit tells it from
    # SPLIT steps of several sizes only.
    split_call_s: float = 0.0
    # Device time of the Triton prefill path per new (query) token, KV head and layer besides
    # its products with the keys: the token's share of its tile's start and finish (queries
    # loaded, the softmax normalised, the output written) and of the causal diagonal's tiles,
    # which do a full tile's work for half its pairs. Without it every pair costs the same,
    # and one H200 profile's causal prefills alone (Llama-3.1-8B, one layer's attention
    # launch timed) came out 19% fast at 2,048 tokens and 17% slow at 16,384. A profile fits
    # it to its attention launches timed alone only (whole steps cannot tell it from the
    # linear layers); a fit of replays' steps may free it. 0: not priced.
    attention_query_s: float = 0.0
    # Of peak bf16 FLOP/s: how fast a decode row's tile works through its keys in the launch
    # of a step with prefill tokens (CostModel.mixed_decode_attention_s: a 128-row tile per
    # KV head for one query row). The same kernel's rate on prefill pairs (attention_compute)
    # does not hold for it: fitted as one, the H200 profile's mixed launches came out 13-67%
    # fast and its prefix-heavy prefills up to 33% slow (Llama-3.1-8B: 0.33 for both;
    # apart, 0.37 for pairs and 0.23 for such tiles). A profile fits it to its attention
    # launches timed alone only, as attention_query_s. None: at attention_compute
    # (calibrations from before this term).
    mixed_decode_compute: float | None = None
    # Host time per step in which a synchronous engine's device is idle (the inputs built and
    # copied before the first kernel, the ids read back after the last): a profile's step
    # time less its device span (CUDA events), median over its grid. Not fitted: measured
    # (`measured_host_gap_s`). Async scheduling does this work while the step before runs,
    # so it comes off the step's overhead (sim.core.cost_model). H200 profiles: 0.28-0.41 ms
    # on decode steps, 0.36-0.72 ms on mixed ones, from Qwen2.5-0.5B to Llama-3.1-8B.
    host_gap_s: float = 4e-4
    # What a decode-only step (a decode graph replayed) sheds under async scheduling: a
    # profile's synchronous step time less its period launched back to back (`ahead_s`),
    # median over its decode steps of at most SMALL_DECODE_SEQS sequences
    # (`measured_decode_gap_s`). Not fitted: measured. Inside a synchronous decode step the
    # device also waits on the graph's launch, which a step launched ahead does not, so the
    # small steps shed about twice their idle device time. Larger batches shed more in the
    # profile's stream of identical steps, but the replays' did not (docs/modelling.md).
    # None: as host_gap_s (profiles that timed no step launched ahead).
    decode_host_gap_s: float | None = None

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None and f.name in OPTIONAL_FIELDS:
                continue
            if not math.isfinite(value) or value < 0 or (f.name in RATE_FIELDS and not 0 < value <= 1) or (
                    f.name in SERIAL_FRACTIONS and value > 1):
                raise ValueError(f"efficiency {f.name}={value} is out of range")

    @property
    def piecewise_launch(self) -> float:
        """The launch time of a step that runs piecewise graphs (piecewise_launch_s, or
        eager_launch_s where that is None)."""
        return self.eager_launch_s if self.piecewise_launch_s is None else self.piecewise_launch_s


# Efficiency fields fitted to measured step times: (name, bounds, typical scale). Interconnect
# and all-reduce latency stay as given: a TP-1 run cannot see them.
FIT_PARAMETERS = (
    ("linear_compute", (0.05, 1.0), 1.0),
    ("memory", (0.05, 1.0), 1.0),
    ("kv_memory", (0.05, 1.0), 1.0),
    ("attention_compute", (0.02, 1.0), 1.0),
    ("step_overhead_s", (0.0, 0.05), 1e-3),
    ("per_seq_overhead_s", (0.0, 1e-3), 1e-6),
    ("eager_launch_s", (0.0, 0.2), 1e-3),
    ("piecewise_launch_s", (0.0, 0.2), 1e-3),
    ("linear_serial_fraction", (0.0, 1.0), 1.0),
    ("split_launch_s", (0.0, 0.05), 1e-3),
    ("launch_serial_fraction", (0.0, 1.0), 1.0),
    ("attention_program", (0.02, 1.0), 1.0),
    ("attention_program_serial", (0.0, 1.0), 1.0),
    ("split_attention_compute", (0.05, 1.0), 1.0),
    ("split_call_s", (0.0, 1e-3), 1e-5),
    ("attention_query_s", (0.0, 1e-7), 1e-9),
    ("mixed_decode_compute", (0.02, 1.0), 1.0),
)
# SPLIT's terms: fitted only where enough steps run SPLIT (sim.core.calibration.fit)
SPLIT_PARAMETERS = ("split_attention_compute", "split_call_s")


def slower(eff: Efficiency, factor: float) -> Efficiency:
    """`eff` with every step `factor` (>= 1) times as long: each rate's efficiency divided by
    it, each fixed time multiplied (what-if and sensitivity runs)."""
    if factor < 1:
        raise ValueError(f"slower() needs a factor >= 1 (efficiencies stay <= 1), got {factor}")
    return replace(eff, **{name: getattr(eff, name) / factor for name in RATE_FIELDS
                           if getattr(eff, name) is not None},
        **_times(eff, ("allreduce_latency_s", "step_overhead_s", "per_seq_overhead_s",
                       "eager_launch_s", "piecewise_launch_s", "split_launch_s",
                       "split_call_s", "attention_query_s", *GAP_TERMS), factor))


def _times(eff: Efficiency, names: Sequence[str], factor: float) -> dict[str, float]:
    """The fixed times `names` of `eff` multiplied by `factor` (an unset one left unset)."""
    return {name: getattr(eff, name) * factor for name in names
            if getattr(eff, name) is not None}


# the host times a profile measures rather than fits (`measured_gaps`)
GAP_TERMS = ("host_gap_s", "decode_host_gap_s")
HOST_TERMS = ("step_overhead_s", "per_seq_overhead_s", "eager_launch_s", "piecewise_launch_s",
              "split_launch_s")


def host_slower(eff: Efficiency, factor: float) -> Efficiency:
    """`eff` on a host `factor` times slower: the per-step terms a calibration fits multiplied,
    the device's rates kept. One H200 host ran a fixed Python loop in 7 to 14 ms at different
    times, and eager steps' launch time moved with it (benchmarks/host_noise.py).
    The eager launch term is host time; the step overhead also holds per-step device time (the
    Llama-3.1-8B profile fits 1.68 ms, of which a small decode graph step's host build and
    enqueue are 0.3-0.5 ms), so for graph steps this is an upper bound."""
    if not 0 < factor < math.inf:
        raise ValueError(f"host_slower() needs a positive factor, got {factor} "
                         "(--host-slowdown: a finite number above 0)")
    return replace(eff, **_times(eff, (*HOST_TERMS, *GAP_TERMS), factor))


def measured_host_gap_s(measurements: Sequence[Mapping], less: str = "device_s") -> float | None:
    """`Efficiency.host_gap_s` of a profile's records: the median of step time less device
    span over the records that have both (None when none has). `less`: another record field
    to take off instead (`ahead_s`: what a step sheds launched back to back)."""
    gaps = sorted(float(m["measured_s"]) - float(m[less]) for m in measurements
                  if _finite(m.get("measured_s")) and _finite(m.get(less)))
    if not gaps:
        return None
    middle = len(gaps) // 2
    gap = gaps[middle] if len(gaps) % 2 else 0.5 * (gaps[middle - 1] + gaps[middle])
    return max(gap, 0.0)


# the decode steps whose shed under async scheduling `measured_decode_gap_s` takes: the
# profile's smallest batches (its grid times 1, 2, 4 and 8 sequences)
SMALL_DECODE_SEQS = 8


def measured_decode_gap_s(measurements: Sequence[Mapping],
                          most_seqs: int = SMALL_DECODE_SEQS) -> float | None:
    """`Efficiency.decode_host_gap_s` of a profile's records: the median of step time less
    back-to-back period over its decode steps of at most `most_seqs` sequences (None where it
    timed none launched ahead)."""
    small = [m for m in measurements if m.get("kind") == "decode"
             and _finite(m.get("num_decodes")) and m["num_decodes"] <= most_seqs]
    return measured_host_gap_s(small, less="ahead_s")


def measured_gaps(measurements: Sequence[Mapping]) -> dict[str, float]:
    """The GAP_TERMS a profile's records measure, by name (those its grid timed)."""
    gaps = {"host_gap_s": measured_host_gap_s(measurements),
            "decode_host_gap_s": measured_decode_gap_s(measurements)}
    return {name: gap for name, gap in gaps.items() if gap is not None}


def _finite(value: object) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def efficiency_dict(eff: Efficiency) -> dict[str, float]:
    """Every field by name: a calibration file's `efficiency` object."""
    return asdict(eff)
