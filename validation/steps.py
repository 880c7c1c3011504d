"""The cost model's price of each engine step, and the steps' classes and errors.

`predict_step_times` prices every row of a `StepTable` (`validation.step_table`) with
`sim.core.cost_model.CostModel`, vectorised so a calibration fit can call it thousands of
times; it equals `CostModel.step(out).total_s` for the same composition.
"""

from __future__ import annotations

import numpy as np

from sim.core.cost_model import APART_LAUNCHES, CostModel, step_total_array
from sim.core.split_shapes import FLASHINFER_ATTENTION
from validation.step_table import PHASE_COLUMNS, StepTable


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
    if cost.decode_hidden_s != cost.hidden_s:  # a decode-only step hides its own gap
        total = np.where(decode_only, step_total_array(device, launch, fraction, *overheads,
                                                       hidden_s=cost.decode_hidden_s), total)
    if cost.hides_host:  # async: a step with none in flight before it hides nothing
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
# by batch size, then prefill-only steps, then mixed steps by their prefill tokens, and the
# larger chunks (and those whose decode rows ran apart) by their cached prefix: the step's
# price drifts with it (the H200 Mooncake replays' chunks of 2,048 came out about 5 points
# longer over prefixes of 16k keys than over short ones, on every backend), so a slice of
# long prompts shows it apart.
SMALL_CHUNK_TOKENS = 512
LONG_PREFIX_TOKENS = 8192


def class_masks(t: StepTable, apart: np.ndarray | None = None) -> list[tuple[str, np.ndarray]]:
    """The step classes the reports break errors down by. `apart`: the mixed steps that ran
    their decode rows apart (`apart_steps`), a class of their own; None: no step did."""
    ran, pre, seqs = t.num_tokens > 0, t.has_prefill, t.num_decode_tokens
    decode = ran & ~pre
    mixed = pre & (t.num_decode_tokens > 0)
    apart = np.zeros(len(t), dtype=bool) if apart is None else mixed & apart
    one_launch = mixed & ~apart
    large = one_launch & (t.num_prefill_tokens > SMALL_CHUNK_TOKENS)
    cached = f", {LONG_PREFIX_TOKENS:,}+ keys cached"
    long_prefix = t.longest_prefix >= LONG_PREFIX_TOKENS
    return [
        ("decode, 1-8 sequences", decode & (seqs <= 8)),
        ("decode, 9-32 sequences", decode & (seqs > 8) & (seqs <= 32)),
        ("decode, 33+ sequences", decode & (seqs > 32)),
        ("prefill only", pre & (t.num_decode_tokens == 0)),
        (f"mixed, chunk <= {SMALL_CHUNK_TOKENS} tokens",
         one_launch & (t.num_prefill_tokens <= SMALL_CHUNK_TOKENS)),
        (f"mixed, chunk > {SMALL_CHUNK_TOKENS} tokens", large & ~long_prefix),
        (f"mixed, chunk > {SMALL_CHUNK_TOKENS} tokens{cached}", large & long_prefix),
        ("mixed, decode rows apart", apart & ~long_prefix),
        (f"mixed, decode rows apart{cached}", apart & long_prefix),
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
    only, mixed by chunk size and the larger chunks by their cached prefix, mixed with the
    decode rows apart where `apart` marks some), the count, measured and predicted seconds in
    all, the error of the sum and the median step error. Classes with no step are left out."""
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
