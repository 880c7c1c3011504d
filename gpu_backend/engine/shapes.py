"""Synthetic engine steps for calibration and benchmarks: a host batch and the matching
`SchedulerOutput`, so measured times line up with `CostModel.step(out)` predictions.

A step is a list of prefill chunks (new tokens, cached prefix tokens) and a list of decode
context lengths (the sequence length after the step, as the core's decode_context_tokens
counts it). Block 0 of the `num_pool_blocks` device blocks is scratch; the others hold every
sequence's blocks side by side while the step fits the pool (`pool_tables`), and at random
when it does not, so a grid step larger than the pool reads its KV from memory, not from
the L2 cache (step time does not depend on KV contents).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from gpu_backend.engine.inputs import (
    HostBatch,
    RequestMirror,
    decode_rows_first,
    leading_decodes,
)
from sim.core.step import ScheduledRequest, SchedulerOutput


@dataclass(frozen=True)
class StepShape:
    kind: str  # "prefill", "decode" or "mixed"
    prefills: tuple[tuple[int, int], ...] = ()  # (new tokens, prefix tokens)
    decodes: tuple[int, ...] = ()  # context length after the step, per decode row

    @property
    def num_tokens(self) -> int:
        return sum(n for n, _ in self.prefills) + len(self.decodes)

    def describe(self) -> dict:
        """A JSON record; decode rows as [count, context] runs (`decode_groups`)."""
        groups = [[len(list(run)), int(c)] for c, run in itertools.groupby(self.decodes)]
        return {"kind": self.kind, "prefills": [list(p) for p in self.prefills],
                "num_decodes": len(self.decodes),
                "decode_context": int(self.decodes[0]) if self.decodes else 0,
                "decode_groups": groups}

    @classmethod
    def from_record(cls, record: dict) -> StepShape:
        """Inverse of describe(); records without decode_groups (calibrations before
        2026-11-30 evening) had one context for every decode row."""
        groups = record.get("decode_groups")
        if groups is None:
            groups = [[int(record["num_decodes"]), int(record["decode_context"])]]
        decodes = tuple(int(c) for n, c in groups for _ in range(int(n)))
        return cls(record["kind"], tuple(tuple(p) for p in record["prefills"]), decodes)


def decode_shape(batch_size: int, context: int) -> StepShape:
    return StepShape("decode", decodes=(context,) * batch_size)


def skewed_decode_shape(batch_size: int, context: int, long_context: int,
                        num_long: int = 1) -> StepShape:
    """A decode batch with `num_long` long sequences among short ones (as in trace replays)."""
    return StepShape("decode", decodes=(context,) * (batch_size - num_long)
                     + (long_context,) * num_long)


def prefill_shape(new_tokens: int, prefix_tokens: int = 0) -> StepShape:
    return StepShape("prefill", prefills=((new_tokens, prefix_tokens),))


def spread_decode_shape(batch_size: int, low: int, high: int, seed: int = 0) -> StepShape:
    """A decode batch whose contexts are spread uniformly over [low, high] (seeded), as a
    trace's are: uneven, with no single outlier."""
    contexts = np.random.default_rng(seed).integers(low, high + 1, batch_size)
    return StepShape("decode", decodes=tuple(int(c) for c in contexts))


def mixed_shape(new_tokens: int, prefix_tokens: int, batch_size: int, context: int) -> StepShape:
    return StepShape("mixed", ((new_tokens, prefix_tokens),), (context,) * batch_size)


def prompt_shapes(prompt: int, chunk: int, num_decodes: int = 0,
                  decode_context: int = 0) -> list[StepShape]:
    """The steps of a `prompt`-token prompt prefilled `chunk` tokens a step, each over the
    prefix before it and beside `num_decodes` decodes of `decode_context` keys."""
    return [mixed_shape(min(chunk, prompt - prefix), prefix, num_decodes, decode_context)
            if num_decodes else prefill_shape(min(chunk, prompt - prefix), prefix)
            for prefix in range(0, prompt, chunk)]


def host_batch(shape: StepShape, block_size: int, num_pool_blocks: int) -> HostBatch:
    """Host arrays of `shape`; decode rows first, then prefill rows (each row samples), in
    the order RequestMirror.build puts them."""
    rows = decode_rows_first([(p, n) for n, p in shape.prefills]
                             + [(c - 1, 1) for c in shape.decodes], lambda row: row[1])
    computed = np.array([c for c, _ in rows], dtype=np.int64)  # [S]
    lens = np.array([n for _, n in rows], dtype=np.int64)  # [S]
    seq_lens = (computed + lens).astype(np.int32)
    width = int(-(-seq_lens.max() // block_size))
    tables = np.zeros((len(rows), width), dtype=np.int32)  # [S, W] padded with the scratch block
    for i, blocks in enumerate(pool_tables(-(-seq_lens // block_size), num_pool_blocks - 1)):
        tables[i, :len(blocks)] = blocks + 1  # device id = pool id + 1
    qsl = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)  # [S+1]
    positions = np.concatenate([np.arange(c, c + n) for c, n in zip(computed, lens)])  # [T]
    row = np.repeat(np.arange(len(rows)), lens)
    slots = tables[row, positions // block_size].astype(np.int64) * block_size
    slots += positions % block_size
    return HostBatch(
        request_ids=list(range(len(rows))), input_ids=positions % 128, positions=positions,
        slot_mapping=slots, block_tables=tables, seq_lens=seq_lens, query_start_loc=qsl,
        logits_indices=(qsl[1:] - 1).astype(np.int64), sample_request_ids=list(range(len(rows))),
        max_query_len=int(lens.max()), max_seq_len=int(seq_lens.max()),
        num_decodes=leading_decodes(lens))


def scheduler_output(shape: StepShape) -> SchedulerOutput:
    """The SchedulerOutput the core would emit for `shape` (what CostModel.step reads)."""
    items = [ScheduledRequest(i, c - 1, 1, (), True, True) for i, c in enumerate(shape.decodes)]
    base = len(items)  # decode rows first, as host_batch and RequestMirror.build order them
    items += [ScheduledRequest(base + i, p, n, (), False, True)
              for i, (n, p) in enumerate(shape.prefills)]
    return SchedulerOutput(
        step_id=0, scheduled=tuple(items), num_steps=1,
        num_prefill_tokens=sum(n for n, _ in shape.prefills), num_decode_tokens=len(shape.decodes),
        prefill_chunks=shape.prefills, decode_context_tokens=sum(shape.decodes),
        preempted_ids=(), elastic=None, oom=None, num_sampled_rows=len(items))


def engine_step(shape: StepShape, block_size: int, num_pool_blocks: int,
                vocab_size: int) -> tuple[RequestMirror, SchedulerOutput]:
    """The engine's own host side of `shape`: a RequestMirror holding the step's requests and
    the SchedulerOutput it builds from. `mirror.build(out, num_blocks)` gives the arrays `host_batch` gives
    (same tables, slots and token ids), by the code a replay runs, so a calibration that times
    build + execute times what a replay's step time holds."""
    out = scheduler_output(shape)  # build it with num_usable_blocks=num_pool_blocks
    mirror = RequestMirror(vocab_size, block_size, block_id_offset=1)
    totals = [item.num_computed_tokens + item.num_new_tokens for item in out.scheduled]
    tables = pool_tables([-(-n // block_size) for n in totals], num_pool_blocks - 1)
    for item, total, blocks in zip(out.scheduled, totals, tables):
        mirror.tables[item.request_id] = [int(b) for b in blocks]
        mirror.tokens[item.request_id] = [t % 128 for t in range(total)]
    return mirror, out


def pool_tables(row_blocks: Iterable[int], usable: int, seed: int = 0) -> list[np.ndarray]:
    """Each row's block ids (0..usable-1) for a step whose rows hold `row_blocks` blocks.

    Side by side while the step fits the pool. A step that outgrows it (a grid point bigger
    than the batches replays run: 256 x 8,192 tokens of Llama-3.1-8B is 256 GiB of KV) must
    reuse blocks: laid round-robin, rows a pool apart walk the same blocks in step and hit the
    L2 cache (the H100's 128 and 256 x 8,192 decodes read at 1.06-1.09x its datasheet
    bandwidth), so each row instead draws its own blocks at random (seeded), and reuse is
    scattered over the step as in a real pool."""
    counts = [int(n) for n in row_blocks]
    if sum(counts) <= usable:
        first = np.cumsum([0] + counts[:-1])
        return [np.arange(f, f + n) for f, n in zip(first, counts)]
    rng = np.random.default_rng(seed)
    return [rng.choice(usable, size=n, replace=n > usable) for n in counts]


def scatter_tables(mirror: RequestMirror, num_pool_blocks: int, seed: int = 0) -> None:
    """Move every table's blocks to random places over the pool (one seeded permutation of
    the usable blocks): a replay's scheduler hands blocks out scattered, not side by side."""
    usable = num_pool_blocks - 1
    perm = np.random.default_rng(seed).permutation(usable)
    for request_id in list(mirror.tables):
        mirror.tables[request_id] = perm[mirror.tables[request_id]]


def blocks_needed(shape: StepShape, block_size: int) -> int:
    lens = [n + p for n, p in shape.prefills] + list(shape.decodes)
    return sum(-(-n // block_size) for n in lens)
