"""How an engine launches a step, as the cost model prices it: into how many programs its
attention splits each tile's keys, and which CUDA graph size a batch or a step runs padded to.

Plain integers and numpy arrays: the simulator asks these for every step, and the GPU engine
imports the graph-size rules so that the simulator pads as the engine does.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from sim.core.step import SchedulerOutput

# The engine's prefill attention (gpu_backend/kernels/attention.py) tiles 128 query rows
# (tokens x GQA group) per program; when tiles x KV heads leave SMs idle it splits every
# tile's keys (at least MIN_KEYS_PER_SPLIT each) and launches a second kernel to combine the
# parts, as flash-attention's split-KV heuristic does. tests/test_cost_model.py holds this
# rule to the kernel's choose_num_splits.
ATTENTION_TILE_ROWS = 128
MIN_KEYS_PER_SPLIT = 256
SPLIT_TARGET_WAVES = 2  # programs per SM a split aims for
MAX_NUM_SPLITS = 32


def attention_num_splits(num_tokens: int, num_seqs: int, max_query_len: int, max_seq_len: int,
                         num_kv_heads: int, group: int, num_sms: int) -> int:
    """Into how many programs the attention of a step with prefill tokens splits each tile's
    keys (1: no split; num_sms 0, an unknown GPU: never). Plain integers: the simulator asks
    this for every step."""
    block_q = max(1, ATTENTION_TILE_ROWS // group)
    tiles = num_seqs if max_query_len <= block_q else num_tokens // block_q + num_seqs
    programs = tiles * num_kv_heads
    if programs >= num_sms:
        return 1
    splits = min(-(-SPLIT_TARGET_WAVES * num_sms // max(1, programs)),
                 -(-max_seq_len // MIN_KEYS_PER_SPLIT))
    return max(1, min(splits, MAX_NUM_SPLITS))


def attention_num_splits_array(num_tokens: np.ndarray, num_seqs: np.ndarray,
                               max_query_len: np.ndarray, max_seq_len: np.ndarray,
                               num_kv_heads: int, group: int, num_sms: int) -> np.ndarray:
    """`attention_num_splits` of many steps at once (int64 array): tiles x KV heads below
    the SMs split into enough programs for SPLIT_TARGET_WAVES per SM, each of at least
    MIN_KEYS_PER_SPLIT of the longest sequence's keys, at most MAX_NUM_SPLITS."""
    block_q = max(1, ATTENTION_TILE_ROWS // group)
    tiles = np.where(max_query_len <= block_q, num_seqs, num_tokens // block_q + num_seqs)
    programs = np.maximum(1, tiles * num_kv_heads)
    splits = np.minimum(-(-SPLIT_TARGET_WAVES * num_sms // programs),
                        -(-np.asarray(max_seq_len) // MIN_KEYS_PER_SPLIT))
    splits = np.clip(splits, 1, MAX_NUM_SPLITS)
    return np.where(tiles * num_kv_heads < num_sms, splits, 1).astype(np.int64)


# A mixed step whose decode rows run apart (EngineConfig.mixed_split_bytes) launches, per
# layer, their attention and its merge besides the chunks' launch: priced as two launches of
# a split's merge kernel each (Efficiency.split_launch_s).
APART_LAUNCHES = 2


def mixed_split_min_keys(kv_bytes_per_token: int, num_layers: int, min_bytes: int) -> int:
    """The fewest keys (context tokens of the decode rows together) at which a step with
    prefill tokens on the Triton kernel runs its decode rows apart: EngineConfig's
    mixed_split_bytes of KV per layer and GPU, `kv_bytes_per_token` being one token's over
    every layer on one GPU. 0: never. The GPU engine and the cost model both decide by it."""
    if min_bytes <= 0:
        return 0
    return max(1, -(-min_bytes * num_layers // kv_bytes_per_token))


def step_extents(out: SchedulerOutput) -> tuple[int, int]:
    """(longest query, longest sequence after the step) of one step's scheduled rows."""
    max_query = max_seq = 0
    for row in out.scheduled:
        max_query = max(max_query, row.num_new_tokens)
        max_seq = max(max_seq, row.num_computed_tokens + row.num_new_tokens)
    return max_query, max_seq


def padded_batch(num_rows: int, sizes: Sequence[int]) -> int | None:
    """Smallest of `sizes` (ascending) >= num_rows, or None when the batch is larger than all."""
    for size in sizes:
        if size >= num_rows:
            return size
    return None


def padded_batch_array(num_rows: np.ndarray,
                       sizes: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """`padded_batch` of many batches: (the padded size, or the batch itself beyond every
    size; beyond every size?). `sizes` ascending and not empty."""
    sizes_array = np.asarray(sizes, dtype=np.int64)
    index = np.searchsorted(sizes_array, num_rows)  # the first size >= the rows
    beyond = index == len(sizes_array)
    return np.where(beyond, num_rows, sizes_array[np.minimum(index, len(sizes_array) - 1)]), beyond


def piecewise_capture_sizes(max_tokens: int) -> tuple[int, ...]:
    """Token counts to capture piecewise CUDA graphs at for steps of up to `max_tokens`
    tokens (the GPU engine imports this rule, so the simulator pads as the engine does).

    16 to 256 in steps of 16, 320 to 1,024 in steps of 64, 1,280 to 8,192 in steps of 256,
    then steps of 512: fine where a step is short and padding a large share of it, coarse
    where it is long (fewer graphs to capture and hold). The sizes below `max_tokens`, then
    `max_tokens` itself, so every step the scheduler can build has a graph.
    """
    if max_tokens < 1:
        raise ValueError(f"piecewise_capture_sizes needs max_tokens >= 1, got {max_tokens}")
    grid = [*range(16, 257, 16), *range(320, 1025, 64), *range(1280, 8193, 256),
            *range(8704, max_tokens, 512)]
    return (*(size for size in grid if size < max_tokens), max_tokens)


def piecewise_sizes_for(chunk: int, max_tokens: int | None = None) -> tuple[int, ...]:
    """`piecewise_capture_sizes` of an engine whose chunk is `chunk` and whose piecewise
    graphs stop at `max_tokens` (None: at the chunk). A step of more tokens runs fully eager;
    vLLM captures up to 512 by default, where a step's launches still outweigh its compute."""
    if max_tokens is not None and max_tokens < 1:
        raise ValueError(f"a piecewise graph cap of {max_tokens} tokens: give 1 or more")
    return piecewise_capture_sizes(chunk if max_tokens is None else min(chunk, max_tokens))

