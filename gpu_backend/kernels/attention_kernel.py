"""Triton kernels for varlen causal attention over a paged KV cache.

One kernel serves decode and prefill. A program owns one *query tile* of one sequence
and one KV head. The GQA group's query heads are packed into the tile's rows, so every
K/V tile loaded from the pool feeds all of them and `tl.dot` gets M >= 16 even in decode:

    row m of the tile  ->  query token  q0 + m // GROUP,  query head  kv_head * GROUP + m % GROUP
    BLOCK_Q = BLOCK_M // GROUP query tokens per tile

Tiles are numbered across the batch as `query_start_loc[i] // BLOCK_Q + i + local_tile`
(a binary search over query_start_loc maps a program back to its sequence), so the grid
size depends only on T and S: no host sync, capturable in a CUDA graph.

Keys are walked BLOCK_N at a time through the block table (a gather per key, so BLOCK_N
is independent of block_size). Keys every row may see run in an unmasked loop; only the
diagonal tail is masked, and the walk stops at the tile's last visible key (causal early
exit), so a chunk of c tokens over a prefix p costs ~ c * (p + c / 2).

With NUM_SPLITS > 1 (too few tiles x KV heads to fill the GPU: decode of a small batch,
or a short chunk over a long prefix) each tile's key range is split across programs
(flash-decoding) which write un-normalised partials; `combine_splits_kernel` merges them.
"""

from __future__ import annotations

import triton
import triton.language as tl

LOG2E = 1.4426950408889634


@triton.jit
def _find_seq_idx(query_start_loc_ptr, tile_idx, num_seqs, BLOCK_Q: tl.constexpr):
    """Largest i with query_start_loc[i] // BLOCK_Q + i <= tile_idx."""
    left = 0
    right = num_seqs
    while left < right:
        mid = (left + right) // 2
        first_tile = tl.load(query_start_loc_ptr + mid) // BLOCK_Q + mid
        if first_tile <= tile_idx:
            left = mid + 1
        else:
            right = mid
    return left - 1


@triton.jit
def _attend_tile(
    acc, m_i, l_i, q, start_n, block_table_row, k_base, v_base, q_pos, prefix, seq_len,
    offs_d, d_valid, stride_kb, stride_ks, stride_vb, stride_vs, scale_log2,
    HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, MASKED: tl.constexpr,
):
    """One online-softmax step over keys [start_n, start_n + BLOCK_N)."""
    offs_n = start_n + tl.arange(0, BLOCK_N)
    if MASKED:
        kv_valid = offs_n < seq_len
        block_ids = tl.load(block_table_row + offs_n // BLOCK_SIZE, mask=kv_valid, other=0)
    else:
        block_ids = tl.load(block_table_row + offs_n // BLOCK_SIZE)
    in_block = offs_n % BLOCK_SIZE
    block_ids = block_ids.to(tl.int64)
    k_off = block_ids * stride_kb + in_block * stride_ks  # [BLOCK_N] token rows in the pool
    v_off = block_ids * stride_vb + in_block * stride_vs
    k_ptrs = k_base + k_off[:, None] + offs_d[None, :]  # [BLOCK_N, HEAD_DIM_PAD]
    v_ptrs = v_base + v_off[:, None] + offs_d[None, :]  # [BLOCK_N, HEAD_DIM_PAD]
    if MASKED:
        # Keys past seq_len point at block 0, whose values may be uninitialised (NaN):
        # zero them so that p == 0 cannot turn into 0 * NaN.
        k = tl.load(k_ptrs, mask=kv_valid[:, None] & d_valid[None, :], other=0.0)
        v = tl.load(v_ptrs, mask=kv_valid[:, None] & d_valid[None, :], other=0.0)
    elif HEAD_DIM == HEAD_DIM_PAD:
        k = tl.load(k_ptrs)
        v = tl.load(v_ptrs)
    else:
        k = tl.load(k_ptrs, mask=d_valid[None, :], other=0.0)
        v = tl.load(v_ptrs, mask=d_valid[None, :], other=0.0)
    s = tl.dot(q, tl.trans(k)) * scale_log2  # [BLOCK_M, BLOCK_N], log2 units
    if MASKED:
        visible = (offs_n[None, :] <= (prefix + q_pos)[:, None]) & kv_valid[None, :]
        s = tl.where(visible, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows with nothing visible yet
    p = tl.exp2(s - m_safe[:, None])
    alpha = tl.exp2(m_i - m_safe)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
    return acc, m_new, l_i


@triton.jit
def paged_attention_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, out_ptr,
    block_tables_ptr, seq_lens_ptr, query_start_loc_ptr,
    part_acc_ptr, part_ml_ptr,
    scale_log2, num_seqs, num_heads,
    stride_qt, stride_qh, stride_ot, stride_oh, stride_bt,
    stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
    BLOCK_SIZE: tl.constexpr, GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_N: tl.constexpr,
    ONE_TILE_PER_SEQ: tl.constexpr, NUM_SPLITS: tl.constexpr,
):
    tile_idx = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    if ONE_TILE_PER_SEQ:
        seq_idx = tile_idx
        q0 = 0
    else:
        seq_idx = _find_seq_idx(query_start_loc_ptr, tile_idx, num_seqs, BLOCK_Q)
        first_tile = tl.load(query_start_loc_ptr + seq_idx) // BLOCK_Q + seq_idx
        q0 = (tile_idx - first_tile) * BLOCK_Q
    q_start = tl.load(query_start_loc_ptr + seq_idx)
    query_len = tl.load(query_start_loc_ptr + seq_idx + 1) - q_start
    if q0 >= query_len:
        return
    seq_len = tl.load(seq_lens_ptr + seq_idx)
    prefix = seq_len - query_len

    offs_m = tl.arange(0, BLOCK_M)
    q_pos = q0 + offs_m // GROUP  # [BLOCK_M] query index within the sequence
    head = kv_head * GROUP + offs_m % GROUP  # [BLOCK_M]
    row_valid = (offs_m < BLOCK_Q * GROUP) & (q_pos < query_len)
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    d_valid = offs_d < HEAD_DIM
    q_rows = (q_start + q_pos).to(tl.int64) * stride_qt + head * stride_qh
    io_mask = row_valid[:, None] & d_valid[None, :]
    q = tl.load(q_ptr + q_rows[:, None] + offs_d[None, :], mask=io_mask, other=0.0)

    # Keys < kv_end are visible to some row; keys < kv_all to every row.
    kv_end = prefix + tl.minimum(q0 + BLOCK_Q, query_len)
    kv_all = prefix + q0 + 1
    if NUM_SPLITS == 1:
        lo = 0
        hi = kv_end
    else:
        per_split = tl.cdiv(tl.cdiv(kv_end, NUM_SPLITS), BLOCK_N) * BLOCK_N
        lo = tl.minimum(split * per_split, kv_end)
        hi = tl.minimum(lo + per_split, kv_end)
    mid = tl.maximum(tl.minimum(kv_all // BLOCK_N * BLOCK_N, hi), lo)

    block_table_row = block_tables_ptr + seq_idx.to(tl.int64) * stride_bt
    k_base = k_cache_ptr + kv_head * stride_kh
    v_base = v_cache_ptr + kv_head * stride_vh
    acc = tl.zeros([BLOCK_M, HEAD_DIM_PAD], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    for start_n in range(lo, mid, BLOCK_N):
        acc, m_i, l_i = _attend_tile(
            acc, m_i, l_i, q, start_n, block_table_row, k_base, v_base, q_pos, prefix,
            seq_len, offs_d, d_valid, stride_kb, stride_ks, stride_vb, stride_vs, scale_log2,
            HEAD_DIM, HEAD_DIM_PAD, BLOCK_SIZE, BLOCK_N, False,
        )
    for start_n in range(mid, hi, BLOCK_N):
        acc, m_i, l_i = _attend_tile(
            acc, m_i, l_i, q, start_n, block_table_row, k_base, v_base, q_pos, prefix,
            seq_len, offs_d, d_valid, stride_kb, stride_ks, stride_vb, stride_vs, scale_log2,
            HEAD_DIM, HEAD_DIM_PAD, BLOCK_SIZE, BLOCK_N, True,
        )

    if NUM_SPLITS == 1:
        l_safe = tl.where(l_i == 0.0, 1.0, l_i)
        out = acc / l_safe[:, None]
        o_rows = (q_start + q_pos).to(tl.int64) * stride_ot + head * stride_oh
        tl.store(out_ptr + o_rows[:, None] + offs_d[None, :],
                 out.to(out_ptr.dtype.element_ty), mask=io_mask)
    else:
        # Partials indexed [token, head, split].
        part = ((q_start + q_pos).to(tl.int64) * num_heads + head) * NUM_SPLITS + split
        tl.store(part_acc_ptr + part[:, None] * HEAD_DIM_PAD + offs_d[None, :], acc,
                 mask=row_valid[:, None])
        tl.store(part_ml_ptr + part * 2, m_i, mask=row_valid)
        tl.store(part_ml_ptr + part * 2 + 1, l_i, mask=row_valid)


@triton.jit
def combine_splits_kernel(
    out_ptr, part_acc_ptr, part_ml_ptr, query_start_loc_ptr,
    num_seqs, num_heads, stride_ot, stride_oh,
    HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
    NUM_SPLITS: tl.constexpr, SPLITS_PAD: tl.constexpr,
):
    """Merge the split-K partials of one (token, head) into the final output."""
    token = tl.program_id(0)
    head = tl.program_id(1)
    if token >= tl.load(query_start_loc_ptr + num_seqs):  # padding past the last sequence
        return
    offs_s = tl.arange(0, SPLITS_PAD)
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    s_valid = offs_s < NUM_SPLITS
    part = (token.to(tl.int64) * num_heads + head) * NUM_SPLITS + offs_s  # [SPLITS_PAD]
    m = tl.load(part_ml_ptr + part * 2, mask=s_valid, other=float("-inf"))
    l_part = tl.load(part_ml_ptr + part * 2 + 1, mask=s_valid, other=0.0)
    m_max = tl.max(m, 0)
    m_max = tl.where(m_max == float("-inf"), 0.0, m_max)
    w = tl.exp2(m - m_max)  # [SPLITS_PAD]
    l_total = tl.sum(w * l_part, 0)
    l_total = tl.where(l_total == 0.0, 1.0, l_total)
    acc = tl.load(part_acc_ptr + part[:, None] * HEAD_DIM_PAD + offs_d[None, :],
                  mask=s_valid[:, None], other=0.0)  # [SPLITS_PAD, HEAD_DIM_PAD]
    out = tl.sum(acc * w[:, None], 0) / l_total  # [HEAD_DIM_PAD]
    o_ptr = out_ptr + token.to(tl.int64) * stride_ot + head * stride_oh + offs_d
    tl.store(o_ptr, out.to(out_ptr.dtype.element_ty), mask=offs_d < HEAD_DIM)
