"""CUDA graphs for decode-only steps: capture sizes, padding, and the captured graphs.

A decode-only step (every sequence has one new token) of batch size B replays the graph of
the smallest capture size >= B. Padded rows must be harmless: each is a one-token sequence
at position 0 whose only block is the scratch block (device block 0, never handed to the
scheduler), so its K/V write and its attention read stay inside memory that is always
mapped. Graphs are captured with max_seq_len = max_model_len, the bound the attention
kernel sizes its split-K buffers for, and a block-table width of max_model_len / block_size.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from gpu_backend.engine.inputs import SCRATCH_BLOCK_ID, HostBatch
from sim.core.cost_model import padded_batch

BASE_CAPTURE_SIZES = (1, 2, 4, 8, 16, 32, 48, 64, 96, 128)


def capture_sizes(max_num_seqs: int) -> tuple[int, ...]:
    """1, 2, 4, 8, 16, 32, 48, 64, 96, 128, then steps of 64 up to 512, then of 128; the
    last size is max_num_seqs itself, so every decode batch has a graph."""
    sizes = [s for s in BASE_CAPTURE_SIZES if s < max_num_seqs]
    size = BASE_CAPTURE_SIZES[-1]
    while True:
        size += 64 if size < 512 else 128
        if size >= max_num_seqs:
            break
        sizes.append(size)
    sizes.append(max_num_seqs)
    return tuple(sorted(set(sizes)))


# Smallest capture size >= batch_size, or None when the batch is larger than all: the one
# rule the engine runs and the simulator's cost model prices.
bucket_for = padded_batch


def pad_decode(batch: HostBatch, size: int, table_width: int, block_size: int) -> HostBatch:
    """A decode-only batch padded to `size` rows with scratch rows.

    The tables keep the batch's own width (at most the graph's `table_width`): the graph's
    static table is updated only in those columns, since the kernel never reads a column
    beyond a row's last block. Every row (real or padded) is sampled by the graph;
    `batch.logits_indices` still says which rows the engine keeps.
    """
    num_real = batch.num_seqs
    if not batch.is_decode_only or num_real > size:
        raise ValueError(f"pad_decode needs a decode-only batch of <= {size} rows")
    if batch.block_tables.shape[1] > table_width:
        raise ValueError(f"block table width {batch.block_tables.shape[1]} > graph width "
                         f"{table_width}; raise max_model_len")
    num_pad = size - num_real
    width = max(1, batch.block_tables.shape[1])
    tables = np.full((size, width), SCRATCH_BLOCK_ID, dtype=np.int32)  # [size, width]
    tables[:num_real, :batch.block_tables.shape[1]] = batch.block_tables
    scratch_slot = SCRATCH_BLOCK_ID * block_size
    return replace(
        batch,
        input_ids=np.concatenate([batch.input_ids, np.zeros(num_pad, np.int64)]),
        positions=np.concatenate([batch.positions, np.zeros(num_pad, np.int64)]),
        slot_mapping=np.concatenate([batch.slot_mapping, np.full(num_pad, scratch_slot, np.int64)]),
        block_tables=tables,
        seq_lens=np.concatenate([batch.seq_lens, np.ones(num_pad, np.int32)]),
        query_start_loc=np.arange(size + 1, dtype=np.int32),
        logits_indices=np.arange(size, dtype=np.int64),
    )
