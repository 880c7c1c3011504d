"""Pure-PyTorch references for the paged KV-cache kernels.

They gather the paged cache into dense tensors and run a masked softmax in float32.
They are slow and host-synchronising (a Python loop over sequences): they exist to
check the Triton kernels and to run the model on CPU, never on the engine's hot path.
"""

from __future__ import annotations

import torch
from torch import Tensor


def store_kvcache_ref(
    k: Tensor, v: Tensor, k_cache: Tensor, v_cache: Tensor, slot_mapping: Tensor
) -> None:
    """Write k, v `[T, KVH, D]` into the paged caches `[num_blocks, block_size, KVH, D]`.

    Tokens with a negative slot are skipped (padding rows of a captured batch).
    """
    block_size = k_cache.shape[1]
    slots = slot_mapping.long()
    keep = slots >= 0
    slots = slots[keep]
    block_ids, offsets = slots // block_size, slots % block_size
    # Advanced-index assignment writes through non-contiguous views of the pool.
    k_cache[block_ids, offsets] = k[keep].to(k_cache.dtype)
    v_cache[block_ids, offsets] = v[keep].to(v_cache.dtype)


def gather_kv(cache: Tensor, block_table_row: Tensor, seq_len: int) -> Tensor:
    """Dense `[seq_len, KVH, D]` view of one sequence's paged keys or values."""
    block_size = cache.shape[1]
    num_blocks = (seq_len + block_size - 1) // block_size
    blocks = block_table_row[:num_blocks].long()
    # cache[blocks]: [num_blocks, block_size, KVH, D]
    return cache[blocks].reshape(-1, *cache.shape[2:])[:seq_len]


def paged_attention_ref(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    block_tables: Tensor,
    seq_lens: Tensor,
    query_start_loc: Tensor,
    scale: float,
) -> Tensor:
    """Varlen causal attention over a paged cache, float32 math, output in q's dtype.

    q: [T, H, D]; k_cache, v_cache: [num_blocks, block_size, KVH, D];
    block_tables: [S, max_blocks]; seq_lens: [S]; query_start_loc: [S+1].
    Query token j of sequence i sits at position seq_lens[i] - query_len_i + j and
    attends to every key position <= its own (lower-right aligned causal mask).
    """
    num_heads, num_kv_heads = q.shape[1], k_cache.shape[2]
    group = num_heads // num_kv_heads
    out = torch.zeros_like(q)
    starts = query_start_loc.tolist()
    lens = seq_lens.tolist()
    for i, seq_len in enumerate(lens):
        q_start, q_end = starts[i], starts[i + 1]
        query_len = q_end - q_start
        if query_len == 0:
            continue
        k = gather_kv(k_cache, block_tables[i], seq_len).float()  # [L, KVH, D]
        v = gather_kv(v_cache, block_tables[i], seq_len).float()
        k = k.repeat_interleave(group, dim=1)  # [L, H, D]
        v = v.repeat_interleave(group, dim=1)
        qi = q[q_start:q_end].float()  # [Q, H, D]
        scores = torch.einsum("qhd,khd->hqk", qi, k) * scale  # [H, Q, L]
        q_pos = seq_len - query_len + torch.arange(query_len, device=q.device)
        k_pos = torch.arange(seq_len, device=q.device)
        visible = k_pos[None, :] <= q_pos[:, None]  # [Q, L]
        scores = scores.masked_fill(~visible, float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        out[q_start:q_end] = torch.einsum("hqk,khd->qhd", probs, v).to(q.dtype)
    return out
