"""Per-step compositions and times, and the cost model's prediction of each step.

A `StepTable` holds one row per engine step (never a fast-forwarded run of steps): what the
step computed (prefill tokens and chunks, decode rows and their context) and how long it took,
measured on the GPU (`steps.csv`) or predicted by the simulator. `predict_step_times` prices
every row with `sim.core.cost_model.CostModel`, vectorised so a calibration fit can call it
thousands of times; it equals `CostModel.step(out).total_s` for the same composition.

steps.csv columns read (GPU engine; extra columns are ignored):

    step_id, num_prefill_tokens, num_decode_tokens, decode_context_tokens, num_seqs,
    measured_s                                    required
    prefill_chunks                                "new:prefix;new:prefix" per prefill chunk
                                                  (or a JSON list of pairs); without it the
                                                  prefill is priced as one chunk, no prefix
    num_sampled_rows, start_s, num_preempted,
    kv_blocks_used, kv_blocks_usable,
    reserve_lent_blocks, max_decode_context,
    build_s, enqueue_s, device_s                  optional (the last three: a step's phases)
"""

from __future__ import annotations

import csv
import gzip
import json
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import TextIO

import numpy as np

from sim.core.cost_model import APART_LAUNCHES, CostModel, step_total_array
from sim.core.split_shapes import FLASHINFER_ATTENTION

REQUIRED_COLUMNS = ("num_prefill_tokens", "num_decode_tokens", "decode_context_tokens",
                    "num_seqs")
DURATION_COLUMNS = ("measured_s", "duration_s", "step_s")
# Where a GPU step's time went (replays record it per step): host batch
# build, host enqueue (inputs staged, graph or kernels launched), device span (CUDA events).
PHASE_COLUMNS = ("build_s", "enqueue_s", "device_s")
OPTIONAL_COLUMNS = ("start_s", "num_preempted", "kv_blocks_used", "kv_blocks_usable",
                    "reserve_lent_blocks", "lent_blocks", "oom",
                    "max_decode_context",  # longest decode row's context (GPU runs since 2026-11-30)
                    *PHASE_COLUMNS)


# A step starts this much (relative, at least in seconds) after the step before it ended: more
# than the rounding of the clocks' sums, less than any idle gap or elastic pause.
EXPOSED_GAP_S = 1e-9


@dataclass(frozen=True)
class StepTable:
    """Column arrays, one element per engine step, in execution order."""

    num_prefill_tokens: np.ndarray  # int64 [S]
    num_decode_tokens: np.ndarray  # int64 [S]
    decode_context_tokens: np.ndarray  # int64 [S]: sum of decode rows' context lengths
    num_seqs: np.ndarray  # int64 [S]: scheduled requests
    num_sampled_rows: np.ndarray  # int64 [S]: rows that reach lm_head and sample
    prefill_pairs: np.ndarray  # float64 [S]: sum over chunks of new x (prefix + new / 2)
    duration_s: np.ndarray  # float64 [S]: measured (GPU) or predicted (simulator)
    chunks_exact: bool = True  # False: prefill chunk prefixes were unknown (priced as 0)
    extra: dict[str, np.ndarray] = field(default_factory=dict)  # OPTIONAL_COLUMNS present
    # int64 [S]: the longest query (new tokens of one row) and the longest sequence after the
    # step, which decide whether a step's attention splits its keys (CostModel.splits); None:
    # unknown, no split priced
    max_query_len: np.ndarray | None = None
    max_seq_len: np.ndarray | None = None
    # object [S]: each step's prefill chunks, a tuple of (new tokens, prefix tokens), where the
    # steps recorded them: what a step running SPLIT is priced from (CostModel.split_chunks)
    prefill_chunks: np.ndarray | None = None

    def __len__(self) -> int:
        return int(self.duration_s.shape[0])

    @property
    def num_tokens(self) -> np.ndarray:
        return self.num_prefill_tokens + self.num_decode_tokens

    @property
    def has_prefill(self) -> np.ndarray:
        return self.num_prefill_tokens > 0

    @property
    def start_s(self) -> np.ndarray | None:
        return self.extra.get("start_s")

    def exposed(self) -> np.ndarray:
        """Per step, whether it started later than the step before it ended (bool [S]): the
        first step, one after an idle gap or an elastic pause. Under async scheduling such a
        step has no step in flight to hide its host work behind (sim.engine). All False where
        the table has no start times."""
        start = self.start_s
        if start is None or not len(self):
            return np.zeros(len(self), dtype=bool)
        ends = start[:-1] + self.duration_s[:-1]
        gap = start[1:] - ends > EXPOSED_GAP_S * np.maximum(1.0, np.abs(ends))
        return np.concatenate(([True], gap))

    def take(self, index: np.ndarray | slice) -> StepTable:
        """The rows picked by `index` (a slice, bool mask or positions)."""
        arrays = {f.name: getattr(self, f.name)[index] for f in fields(self)
                  if isinstance(getattr(self, f.name), np.ndarray)}
        extra = {k: v[index] for k, v in self.extra.items()}
        return replace(self, **arrays, extra=extra)

    def with_durations(self, duration_s: np.ndarray) -> StepTable:
        return replace(self, duration_s=np.asarray(duration_s, dtype=np.float64))


def chunk_pairs(chunks: list[tuple[int, int]]) -> float:
    """Attention (query, key) pairs of causal prefill chunks, as the cost model counts them."""
    return float(sum(c * (p + c / 2.0) for c, p in chunks))


def parse_chunks(text: str) -> list[tuple[int, int]]:
    """`"512:0;512:512"` or `"[[512, 0], [512, 512]]"` -> [(512, 0), (512, 512)]."""
    text = text.strip()
    if not text:
        return []
    if text.startswith("["):
        return [(int(c), int(p)) for c, p in json.loads(text)]
    pairs = []
    for item in text.replace("|", ";").split(";"):
        if item.strip():
            new, _, prefix = item.partition(":")
            pairs.append((int(new), int(prefix or 0)))
    return pairs


def format_chunks(chunks: list[tuple[int, int]]) -> str:
    return ";".join(f"{c}:{p}" for c, p in chunks)


def open_csv(path: Path) -> TextIO:
    """A CSV for reading, gzip-compressed when its name ends in .gz (the committed replays
    under validation/evidence are kept compressed: `gzip -n` of the engine's CSVs)."""
    if path.suffix == ".gz":
        return gzip.open(path, "rt", newline="")
    return path.open(newline="")


def read_steps_csv(path: Path) -> StepTable:
    with open_csv(path) as f:
        rows = list(csv.DictReader(f))
    header = set(rows[0]) if rows else set()
    missing = [c for c in REQUIRED_COLUMNS if c not in header]
    duration = next((c for c in DURATION_COLUMNS if c in header), None)
    if rows and (missing or duration is None):
        raise ValueError(f"{path}: missing columns {missing or list(DURATION_COLUMNS[:1])}; "
                         f"has {sorted(header)}")

    def ints(name: str) -> np.ndarray:
        return np.array([int(float(r[name])) for r in rows], dtype=np.int64)

    if not rows:
        empty = np.zeros(0, dtype=np.int64)
        return StepTable(empty, empty, empty, empty, empty, np.zeros(0), np.zeros(0))
    prefill, decode = ints("num_prefill_tokens"), ints("num_decode_tokens")
    exact = "prefill_chunks" in header
    if exact:
        chunk_lists = [parse_chunks(r["prefill_chunks"] or "") for r in rows]
    else:  # one chunk per step with a prefill, no prefix
        chunk_lists = [[(int(n), 0)] if n else [] for n in prefill]
    pairs = np.array([chunk_pairs(c) for c in chunk_lists])
    num_chunks = np.array([len(c) for c in chunk_lists], dtype=np.int64)
    decode_ctx = ints("decode_context_tokens")
    if "max_decode_context" in header:
        longest_decode = ints("max_decode_context")
    else:  # the mean decode row: a lower bound of the longest
        longest_decode = -(-decode_ctx // np.maximum(decode, 1))
    if {"max_query_len", "max_seq_len"} <= header:  # written by write_steps_csv
        max_query, max_seq = ints("max_query_len"), ints("max_seq_len")
    else:  # the GPU engine's columns: the longest chunk and the longest row after the step
        max_query = np.array([max((c for c, _ in chunks), default=0)
                              for chunks in chunk_lists], dtype=np.int64)
        max_query = np.where(decode > 0, np.maximum(max_query, 1), max_query)
        max_seq = np.maximum(np.array([max((c + p for c, p in chunks), default=0)
                                       for chunks in chunk_lists], dtype=np.int64),
                             longest_decode)
    rows_sampled = ints("num_sampled_rows") if "num_sampled_rows" in header else decode + num_chunks
    extra = {c: np.array([float(r[c]) for r in rows]) for c in OPTIONAL_COLUMNS if c in header}
    recorded = np.empty(len(chunk_lists), dtype=object)
    recorded[:] = [tuple(chunks) for chunks in chunk_lists]
    return StepTable(prefill, decode, decode_ctx, ints("num_seqs"),
                     rows_sampled, pairs.astype(np.float64),
                     np.array([float(r[duration]) for r in rows]), exact, extra,
                     max_query, max_seq, recorded if exact else None)


def write_steps_csv(path: Path, table: StepTable, chunks: list[str] | None = None) -> None:
    """Write a table in the GPU engine's steps.csv layout (`chunks`: formatted per row)."""
    columns = ["step_id", *REQUIRED_COLUMNS, "num_sampled_rows", "measured_s", *table.extra]
    extents = table.max_query_len is not None and table.max_seq_len is not None
    if extents:
        columns += ["max_query_len", "max_seq_len"]
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(columns + (["prefill_chunks"] if chunks is not None else []))
        for i in range(len(table)):
            row = [i + 1, int(table.num_prefill_tokens[i]), int(table.num_decode_tokens[i]),
                   int(table.decode_context_tokens[i]), int(table.num_seqs[i]),
                   int(table.num_sampled_rows[i]), repr(float(table.duration_s[i]))]
            row += [repr(float(v[i])) for v in table.extra.values()]
            if extents:
                assert table.max_query_len is not None and table.max_seq_len is not None
                row += [int(table.max_query_len[i]), int(table.max_seq_len[i])]
            writer.writerow(row + ([chunks[i]] if chunks is not None else []))


def _per_unique(values: np.ndarray, fn) -> np.ndarray:
    unique, inverse = np.unique(values, return_inverse=True)
    return np.array([fn(int(v)) for v in unique], dtype=np.float64)[inverse]


def runs_apart(cost: CostModel, table: StepTable) -> np.ndarray:
    """Per step, whether its decode rows run apart from its chunks (CostModel.runs_apart):
    a step with prefill tokens whose decode rows hold apart_min_keys keys or more."""
    least = cost.apart_min_keys
    return table.has_prefill & (least > 0) & (table.decode_context_tokens >= least)


def attention_terms(cost: CostModel, table: StepTable
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per step, as CostModel.step prices them: the Triton launch's total work (prefill pairs
    and decode rows' keys, linear in both: read on a decode-only step, a tile's FLOPs beside a
    chunk, neither where the decode rows run apart), its longest program, and into how many
    programs a step with prefill tokens split its keys (both 0 and 1 on decode-only steps, or
    where the table does not know its longest query and sequence). A step whose decode rows
    run apart (`runs_apart`) launches its chunks alone: its longest program and splits are
    those of its prefill rows."""
    apart = runs_apart(cost, table)
    if (cost.attention_backend == FLASHINFER_ATTENTION and table.prefill_chunks is None
            and table.max_seq_len is not None and apart.any()):
        raise ValueError("steps priced on the flashinfer attention backend need their prefill "
                         "chunks (steps.csv's prefill_chunks column): its mixed steps launch "
                         "their prefill rows alone, priced by their longest sequence")
    per_key_s = np.where(table.has_prefill, cost.mixed_decode_attention_s(1),
                         cost.decode_attention_s(1))
    work = (table.prefill_pairs * cost.attention_pair_s
            + table.num_prefill_tokens * cost.attention_query_token_s
            + np.where(apart, 0.0, table.decode_context_tokens * per_key_s))
    longest, splits = np.zeros(len(table)), np.ones(len(table), dtype=np.int64)
    if table.max_query_len is not None and table.max_seq_len is not None:
        tokens, seqs, max_seq = table.num_tokens, table.num_seqs, table.max_seq_len
        if apart.any():
            tokens = np.where(apart, table.num_prefill_tokens, tokens)
            seqs = np.where(apart, table.num_seqs - table.num_decode_tokens, seqs)
            if table.prefill_chunks is not None:  # the longest prefill row, where apart
                max_seq = max_seq.copy()
                max_seq[apart] = [max(c + p for c, p in chunks)
                                  for chunks in table.prefill_chunks[apart]]
        splits = np.where(table.has_prefill, cost.num_splits_array(
            tokens, np.maximum(seqs, 1), table.max_query_len, max_seq), 1)
        longest = np.where(table.has_prefill, cost.longest_program_s(max_seq, splits), 0.0)
    return work, longest, splits


def split_attention(cost: CostModel, table: StepTable) -> np.ndarray | None:
    """Per step, the attention of the steps that run SPLIT as CostModel.step prices it (NaN on
    the others), or None where no step does (the triton backend's)."""
    if not cost.runs_split or not table.has_prefill.any():
        return None
    if table.prefill_chunks is None:
        raise ValueError(f"steps priced on the {cost.attention_backend} attention backend need "
                         "their prefill chunks (steps.csv's prefill_chunks column)")
    seconds = np.full(len(table), np.nan)
    for i in np.flatnonzero(table.has_prefill):
        parts = cost.split_chunks(table.prefill_chunks[i])
        if parts is not None:
            seconds[i] = cost.split_step_attention_s(parts, int(table.decode_context_tokens[i]))
    return seconds if np.isfinite(seconds).any() else None


def predict_step_times(cost: CostModel, table: StepTable) -> np.ndarray:
    """Cost-model time of every step from its composition (no scheduling); under async
    scheduling, whether a step had one in flight before it from the start times
    (`StepTable.exposed`)."""
    if len(table) == 0:
        return np.zeros(0)
    tokens = table.num_tokens
    # Decode-only steps run the graph of the next capture size up (CostModel.decode_rows):
    # its rows are what the linear layers and logits compute; beyond every size, eagerly.
    decode_only = (table.num_prefill_tokens == 0) & (tokens > 0)
    graph_rows, graph_eager = cost.decode_rows_array(tokens)
    eager = ~decode_only | graph_eager
    # A step that runs no decode graph runs the piecewise graphs of the next token size up,
    # if any (CostModel.eager_step): its padded tokens are what the linear layers compute.
    piecewise_tokens, piecewise = cost.eager_step_array(tokens)
    padded = np.where(eager, piecewise_tokens, graph_rows)
    sampled = np.where(eager, table.num_sampled_rows, padded)
    # Prefill attention and decode KV reads are linear in pairs and context tokens.
    attention, longest, splits = attention_terms(cost, table)
    attention = cost.launch_attention_s(attention, longest)
    split = split_attention(cost, table)  # steps running SPLIT: no Triton launch of their own
    apart = _not_split(runs_apart(cost, table), split)  # decode rows read on their own launch
    attention = attention + np.where(apart, table.decode_context_tokens
                                     * cost.decode_attention_s(1), 0.0)
    if split is not None:
        runs_split = np.isfinite(split)
        attention = np.where(runs_split, split, attention)
        splits = np.where(runs_split, 1, splits)
    launch = np.where(eager & (tokens > 0),
                      np.where(piecewise, cost.eff.piecewise_launch, cost.eff.eager_launch_s), 0.0)
    launch = launch + np.where(splits > 1, cost.eff.split_launch_s, 0.0)  # CostModel.step's
    launch = launch + np.where(apart, APART_LAUNCHES * cost.eff.split_launch_s, 0.0)
    device = (_per_unique(padded, cost.linear_s) + _per_unique(padded, cost.allreduce_s)
              + _per_unique(sampled, cost.logits_s) + attention)
    overheads = (cost.eff.step_overhead_s, cost.eff.per_seq_overhead_s * table.num_seqs)
    fraction = cost.eff.launch_serial_fraction
    total = step_total_array(device, launch, fraction, *overheads,  # StepCost's
                             hidden_s=cost.hidden_s)
    if cost.hidden_s > 0:  # async: a step with none in flight before it hides nothing
        exposed = table.exposed()
        if exposed.any():
            total = np.where(exposed, step_total_array(device, launch, fraction, *overheads),
                             total)
    # A step that scheduled nothing (an OOM the engine dropped) costs the fixed overhead only.
    return np.where(tokens > 0, total, cost.eff.step_overhead_s)


def relative_errors(predicted: np.ndarray, measured: np.ndarray) -> np.ndarray:
    """(predicted - measured) / measured, NaN where nothing was measured."""
    measured = np.asarray(measured, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(measured > 0, (np.asarray(predicted) - measured) / measured, np.nan)


def error_stats(rel_err: np.ndarray) -> dict[str, float | int | None]:
    """Median, p90 and p99 of |relative error|, mean signed error (bias), count."""
    values = rel_err[np.isfinite(rel_err)]
    if values.size == 0:
        return {"count": 0, "median_abs": None, "p90_abs": None, "p99_abs": None, "bias": None}
    absolute = np.abs(values)
    p50, p90, p99 = np.percentile(absolute, [50, 90, 99])
    return {"count": int(values.size), "median_abs": float(p50), "p90_abs": float(p90),
            "p99_abs": float(p99), "bias": float(values.mean())}


# Step classes of `step_classes`: (name, test on a StepTable -> bool mask); decode-only steps
# by batch size, then prefill-only steps, then mixed steps by their prefill tokens.
SMALL_CHUNK_TOKENS = 512


def class_masks(t: StepTable, apart: np.ndarray | None = None) -> list[tuple[str, np.ndarray]]:
    """The step classes the reports break errors down by. `apart`: the mixed steps that ran
    their decode rows apart (`apart_steps`), a class of their own; None: no step did."""
    ran, pre, seqs = t.num_tokens > 0, t.has_prefill, t.num_decode_tokens
    decode = ran & ~pre
    mixed = pre & (t.num_decode_tokens > 0)
    apart = np.zeros(len(t), dtype=bool) if apart is None else mixed & apart
    one_launch = mixed & ~apart
    return [
        ("decode, 1-8 sequences", decode & (seqs <= 8)),
        ("decode, 9-32 sequences", decode & (seqs > 8) & (seqs <= 32)),
        ("decode, 33+ sequences", decode & (seqs > 32)),
        ("prefill only", pre & (t.num_decode_tokens == 0)),
        (f"mixed, chunk <= {SMALL_CHUNK_TOKENS} tokens",
         one_launch & (t.num_prefill_tokens <= SMALL_CHUNK_TOKENS)),
        (f"mixed, chunk > {SMALL_CHUNK_TOKENS} tokens",
         one_launch & (t.num_prefill_tokens > SMALL_CHUNK_TOKENS)),
        ("mixed, decode rows apart", apart),
    ]


def apart_steps(cost: CostModel, table: StepTable) -> np.ndarray:
    """Per step, whether it ran its decode rows apart from its chunks: `runs_apart`, less the
    steps that run SPLIT (whose decode rows are read on SPLIT's own path)."""
    apart = runs_apart(cost, table)
    return _not_split(apart, split_attention(cost, table)) if apart.any() else apart


def _not_split(apart: np.ndarray, split: np.ndarray | None) -> np.ndarray:
    """`apart` less the steps that run SPLIT (`split_attention` finite there)."""
    return apart if split is None else apart & ~np.isfinite(split)


def step_classes(predicted: np.ndarray, measured: StepTable,
                 apart: np.ndarray | None = None) -> list[dict]:
    """Where the time and the error sit: per class of step (decode by batch size, prefill
    only, mixed by chunk size, mixed with the decode rows apart where `apart` marks some),
    the count, measured and predicted seconds in all, the error of the sum and the median
    step error. Classes with no step are left out."""
    rows = []
    for name, mask in class_masks(measured, apart):
        if not mask.any():
            continue
        m, p = measured.duration_s[mask], np.asarray(predicted)[mask]
        rows.append({"class": name, "count": int(mask.sum()), "measured_s": float(m.sum()),
                     "predicted_s": float(p.sum()),
                     "sum_error": float(p.sum() / m.sum() - 1.0) if m.sum() > 0 else None,
                     "median_error": float(np.nanmedian(relative_errors(p, m))),
                     "median_measured_s": float(np.median(m)),
                     "median_phases_s": _median_phases(measured, mask)})
    return rows


def _median_phases(table: StepTable, mask: np.ndarray) -> dict[str, float] | None:
    """Median of each recorded phase over the masked steps (None: not recorded, or NaN: the
    device span of a CPU run)."""
    if not all(c in table.extra for c in PHASE_COLUMNS):
        return None
    medians = {}
    for column in PHASE_COLUMNS:
        values = table.extra[column][mask]
        values = values[np.isfinite(values)]
        medians[column] = float(np.median(values)) if values.size else None
    return medians
