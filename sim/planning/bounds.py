"""Analytic bounds a capacity search prunes with before it simulates.

Memory fit is the memory plan's own check (`sim.planning.sweep.fit_error`): weights, the
activation reserve and non-torch memory must leave a KV pool on every GPU of the TP group,
and that pool must hold one request of max_model_len tokens. A configuration it refuses
cannot run, so it is never simulated.

Throughput. Every step the cost model prices takes at least the sum of its device terms
plus its overheads (`CostModel.step`: max(device, launch) + overhead), and each term grows
with the step's work, so a trace's requests need at least this much engine time, summed over
the replicas of a fleet, whatever the scheduler does:

    linear      max(a x T, S x linear_s(1))     a: linear seconds per token (compute),
                                                T: tokens computed, S: steps
    attention   prefill (P^2 - c^2)/2 key pairs at the prefill-attention rate, decode contexts
                sum(P + m, m = 1..o-1) at the cheaper of the decode and mixed-step rates
    all-reduce  per token and per step (TP > 1); logits: one sampled row per output token
    overhead    step_overhead x S + per_seq_overhead x (1 + o - 1) rows per request

with P the prompt, c the prompt tokens a prefix cache could at most hold (those whose hash
chain another request of the trace shares), o the output tokens, T >= sum(P - c + o - 1) and
S >= max(T / chunk, decode tokens / max_num_seqs). The rates are read off the cost model's
own operators (`Rates`), so the bound follows its formulas and calibration.

A fleet of N replicas meets the targets only if at least k = ceil(attainment x n) requests
finish within them. Such a request's prefill ends by arrival + TTFT target; with a TPOT
target its whole decode ends by arrival + TTFT + TPOT x (o - 1). So the k cheapest requests'
work fits in N x (latest such deadline - first arrival) seconds of engine time, which gives
the smallest N worth simulating (`WorkBound.min_replicas`). The bound is a max of sums that
are each additive over requests, so the cheapest k of each sum bound it from below. Without
a TTFT target nothing has a deadline and there is no bound.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from sim.core.cost_model import CostModel
from sim.planning.cases import Case
from sim.planning.sustain import Sustain
from sim.recording.metrics import Slo
from traces import Trace

_BIG_TOKENS = 1 << 24  # a step this large is compute-bound in every operator
_SOUND = 1 - 1e-9  # rounding margin: a bound shaded down, never up


@dataclass(frozen=True)
class Rates:
    """Per-token, per-pair and per-step seconds, read off one replica's cost model."""

    linear_token_s: float  # compute per token of the linear layers
    linear_step_s: float  # linear layers of the smallest step (weights read once)
    attention_pair_s: float  # prefill attention per (query, key) pair
    context_token_s: float  # decode attention per context token (the cheaper pricing)
    allreduce_token_s: float
    allreduce_step_s: float
    logits_row_s: float
    step_s: float  # fixed per-step overhead
    row_s: float  # per scheduled sequence

    @classmethod
    def of(cls, cost: CostModel) -> Rates:
        def slope(fn) -> float:
            return (fn(2 * _BIG_TOKENS) - fn(_BIG_TOKENS)) / _BIG_TOKENS * _SOUND

        return cls(
            linear_token_s=slope(cost.linear_s), linear_step_s=cost.linear_s(1) * _SOUND,
            attention_pair_s=cost.attention_pair_s * _SOUND,
            context_token_s=min(cost.decode_attention_s(1),
                                cost.mixed_decode_attention_s(1)) * _SOUND,
            allreduce_token_s=(cost.allreduce_s(2) - cost.allreduce_s(1)) * _SOUND,
            allreduce_step_s=cost.allreduce_s(0) * _SOUND, logits_row_s=slope(cost.logits_s),
            step_s=cost.eff.step_overhead_s, row_s=cost.eff.per_seq_overhead_s)


def cost_model(case: Case) -> CostModel:
    engine = case.engine()
    return CostModel.for_engine(engine, case.efficiency)


def cacheable_tokens(trace: Trace, block_size: int, hash_block_tokens: int) -> np.ndarray:
    """Per request, the most prompt tokens a prefix cache could serve: the leading hash
    blocks whose whole chain another request of the trace shares (whole KV blocks only; a
    chain is interned as `sim.core.prefix_cache` does)."""
    cached = np.zeros(len(trace), dtype=np.int64)
    if trace.block_hashes is None:
        return cached
    interned: dict[tuple[int, int], int] = {}
    rows: list[list[int]] = []
    for row in trace.block_hashes:
        chain_id, chain = 0, []
        for block_hash in row:
            chain_id = interned.setdefault((chain_id, block_hash), len(interned) + 1)
            chain.append(chain_id)
        rows.append(chain)
    holders = np.bincount(np.fromiter((c for chain in rows for c in chain), np.int64),
                          minlength=len(interned) + 1)
    for i, chain in enumerate(rows):
        depth = 0
        while depth < len(chain) and holders[chain[depth]] > 1:
            depth += 1
        tokens = min(depth * hash_block_tokens, int(trace.prompt_tokens[i]))
        cached[i] = tokens // block_size * block_size
    return cached


@dataclass(frozen=True)
class WorkBound:
    """Lower bounds on the engine seconds each request needs (one row per additive form),
    and the deadline by which a request within the targets has had them."""

    forms_s: np.ndarray  # float64 [forms, requests]
    deadline_s: np.ndarray | None  # [requests]; None: no TTFT target, no deadline
    first_arrival_s: float

    def seconds(self, num_requests: int | None = None) -> float:
        """Engine seconds that the `num_requests` cheapest requests (all: None) need at least."""
        n = self.forms_s.shape[1]
        k = n if num_requests is None else min(n, num_requests)
        if k <= 0:
            return 0.0
        if k == n:
            return float(self.forms_s.sum(axis=1).max())
        return float(np.partition(self.forms_s, k - 1, axis=1)[:, :k].sum(axis=1).max())

    def min_replicas(self, min_attainment: float) -> int:
        """The fewest replicas whose engine time before the last deadline holds the work of
        the requests the attainment target needs (1 when nothing has a deadline)."""
        if self.deadline_s is None or self.forms_s.shape[1] == 0:
            return 1
        needed_s = self.seconds(math.ceil(min_attainment * self.forms_s.shape[1] - 1e-9))
        horizon_s = float(self.deadline_s.max()) - self.first_arrival_s
        return max(1, math.ceil(needed_s / horizon_s * _SOUND))

    def max_rate_scale(self, trace: Trace, rule: Sustain) -> float | None:
        """Above this rate scale of `trace` one replica cannot meet the targets (None: no
        bound). Scaling divides arrival gaps; the deadlines' slack after arrival stays."""
        if self.deadline_s is None or len(trace) == 0:
            return None
        needed_s = self.seconds(math.ceil(rule.min_attainment * len(trace) - 1e-9))
        slack_s = float((self.deadline_s - trace.arrival_s).max())
        span_s = float(trace.arrival_s[-1] - trace.arrival_s[0])
        if needed_s <= slack_s:
            return None
        return span_s / (needed_s - slack_s) / _SOUND if span_s > 0 else 0.0


def work_bound(case: Case, trace: Trace, rule: Sustain) -> WorkBound:
    """The bound for `case`'s engine on `trace` (scaled) under `rule`'s targets."""
    engine = case.engine()
    rates = Rates.of(cost_model(case))
    prompt = trace.prompt_tokens.astype(np.float64)
    cached = (cacheable_tokens(trace, engine.block_size, engine.hash_block_tokens)
              if engine.enable_prefix_caching else np.zeros(len(trace), dtype=np.int64))
    tpot_s = rule.slo.tpot_s
    with_decode = tpot_s is not None
    outputs = trace.output_tokens.astype(np.float64) if with_decode else np.ones(len(trace))
    decodes = outputs - 1
    tokens = prompt - cached + decodes
    contexts = decodes * prompt + decodes * (decodes + 1) / 2
    base = (rates.allreduce_token_s * tokens + rates.row_s * outputs
            + rates.attention_pair_s * (prompt**2 - cached.astype(np.float64) ** 2) / 2
            + rates.context_token_s * contexts + rates.logits_row_s * outputs)
    per_step = rates.allreduce_step_s + rates.step_s
    forms = []
    for steps in (tokens / engine.chunk_tokens, decodes / engine.num_seqs):
        forms.append(base + rates.linear_token_s * tokens + per_step * steps)
        forms.append(base + (rates.linear_step_s + per_step) * steps)
    deadline = None
    if rule.slo.ttft_s is not None:
        deadline = trace.arrival_s + rule.slo.ttft_s + (
            tpot_s * decodes if tpot_s is not None else 0.0)
    first_s = float(trace.arrival_s[0]) if len(trace) else 0.0
    return WorkBound(np.vstack(forms), deadline, first_s)


def request_work_s(case: Case, trace: Trace) -> np.ndarray:
    """Each request's whole work under the bound's first form (prefill and decode), for
    telling busy stretches of a trace from quiet ones."""
    return work_bound(case, trace, Sustain(Slo(ttft_s=1.0, tpot_s=1.0))).forms_s[0]
