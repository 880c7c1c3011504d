"""Triton kernels for varlen causal attention over a paged KV cache.

One kernel serves decode and prefill. A program owns one *query tile* of one sequence
and one KV head. The GQA group's query heads are packed into the tile's rows, so every
K/V tile loaded from the pool feeds all of them and `tl.dot` gets M >= 16 even in decode:

    row m of the tile  ->  query token  q0 + m // GROUP,  query head  kv_head * GROUP + m % GROUP
    BLOCK_Q = BLOCK_M // GROUP query tokens per tile

Tiles are numbered across the batch as `query_start_loc[i] // BLOCK_Q + i + local_tile`
(a binary search over query_start_loc maps a program back to its sequence), so the grid
size depends only on T and S: no host sync, capturable in a CUDA graph. The launch order of
the tiles is the launcher's TileConfig (longest_first, heads_inner); with TIMELINE each
program that works writes its SM and its start and end on the GPU's nanosecond timer
(benchmarks/launch_timeline.py).

Keys are walked BLOCK_N at a time through the block table (a gather per key, so BLOCK_N
is independent of block_size). Keys every row may see run in an unmasked loop; only the
diagonal tail is masked, and the walk stops at the tile's last visible key (causal early
exit), so a chunk of c tokens over a prefix p costs ~ c * (p + c / 2).

With num_splits > 1 (too few tiles x KV heads to fill the GPU: a short chunk over a long
prefix) each tile's key range is split across programs (flash-decoding) which write
un-normalised partials; `combine_splits_kernel` merges them.

Decode (one token per sequence) splits by a plan made on the device for each step
(`decode_split_plan_kernel`): one key share for the whole batch, sized so that the batch's
keys x KV heads spread over a target number of programs, and each sequence cut evenly into
as many shares as that size needs for its context. The launch holds every sequence's first
share and the extra shares of the long sequences, so a long sequence among short ones is
worked on by many programs instead of one: the step costs about the batch's total keys, not
its longest sequence. A sequence of one share writes its output directly; the others leave
partials indexed by share (first shares by sequence, extras after them), which
`combine_splits_kernel` merges.
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


@triton.jit(do_not_specialize=["num_seqs"])
def decode_split_plan_kernel(
    seq_lens_ptr, seq_shares_ptr, extra_start_ptr, extra_seq_ptr, extra_split_ptr,
    split_keys_ptr, num_seqs, num_kv_heads, target_programs,
    SEQS_PAD: tl.constexpr, MIN_KEYS: tl.constexpr, MAX_SPLITS: tl.constexpr,
    BLOCK_N: tl.constexpr, NUM_CANDIDATES: tl.constexpr,
):
    """One program: the decode split plan of a step.

    split_keys[0] = the most keys per share. The smallest candidate is ceil(total keys x KV
    heads / target_programs), at least MIN_KEYS and ceil(longest / MAX_SPLITS); the others
    are 1.25x, 1.5x, ... of it (NUM_CANDIDATES in all), each rounded up to BLOCK_N. Each is
    scored as a schedule of its programs on `target_programs` slots: the longest share, or
    the waves the programs need times their mean length, whichever is more; the best (the
    larger share on a tie: fewer partials to merge) wins. The waves matter: 20 sequences of
    12k keys in 4 shares each make 640 programs, a second wave on 528 slots, where 3 shares
    (480 programs) take one. A row of at most one key (a CUDA graph's padding row) takes no
    slot in the count: its program exits at once. Counted, the rows padding 17 sequences to
    a 32-row graph (15 x KV heads programs) pushed Mooncake's 200-250k-key steps into a
    two-wave plan, 1.4-1.9 ms slower per step than one wave (2026-11-30 replays).
    Sequence i has seq_shares[i] = ceil(len / split_keys) >= 1 shares (the attention kernel
    cuts it evenly into that many). Its first share is worked
    on by program i (as without a plan); its others, share k >= 1, by the "extra" shares
    e = extra_start[i] + k - 1, listed in extra_seq[e] = i, extra_split[e] = k
    (extra_start[num_seqs] = number of extras <= ceil(target_programs / KV heads)).
    """
    offs = tl.arange(0, SEQS_PAD)
    valid = offs < num_seqs
    lens = tl.load(seq_lens_ptr + offs, mask=valid, other=0).to(tl.int64)
    busy = valid & (lens > 1)  # rows whose programs hold a slot (not graph padding)
    total = tl.sum(lens, 0)
    base = tl.maximum(tl.cdiv(total * num_kv_heads, target_programs), MIN_KEYS)
    base = tl.maximum(base, tl.cdiv(tl.max(lens, 0), MAX_SPLITS))
    work = (total * num_kv_heads).to(tl.float32)
    best_keys = base * 0
    best_cost = work * 0.0 + float("inf")
    for j in tl.static_range(NUM_CANDIDATES):  # largest first: a tie keeps it
        keys = tl.cdiv(base * (3 + NUM_CANDIDATES - j), 4 * BLOCK_N) * BLOCK_N
        shares = tl.where(valid, tl.maximum(tl.cdiv(lens, keys), 1), 1)
        longest = tl.max(tl.where(valid, tl.cdiv(tl.cdiv(lens, shares), BLOCK_N), 0), 0)
        programs = tl.maximum(tl.sum(tl.where(busy, shares, 0), 0) * num_kv_heads, 1)
        waves = tl.cdiv(programs, target_programs).to(tl.float32)
        cost = tl.maximum((longest * BLOCK_N).to(tl.float32), waves * work / programs)
        better = cost < best_cost
        best_keys = tl.where(better, keys, best_keys)
        best_cost = tl.where(better, cost, best_cost)
    keys = best_keys
    shares = tl.where(valid, tl.maximum(tl.cdiv(lens, keys), 1), 0)
    extras = tl.where(valid, shares - 1, 0)
    starts = tl.cumsum(extras, 0) - extras
    tl.store(seq_shares_ptr + offs, shares.to(tl.int32), mask=valid)
    tl.store(extra_start_ptr + offs, starts.to(tl.int32), mask=valid)
    tl.store(extra_start_ptr + num_seqs, tl.sum(extras, 0).to(tl.int32))
    tl.store(split_keys_ptr, keys.to(tl.int32))
    for k in range(1, MAX_SPLITS):
        mine = valid & (k < shares)
        tl.store(extra_seq_ptr + starts + k - 1, offs.to(tl.int32), mask=mine)
        tl.store(extra_split_ptr + starts + k - 1, (offs * 0 + k).to(tl.int32), mask=mine)


@triton.jit
def _global_ns():
    """The GPU's global nanosecond timer (the launch timeline's clock)."""
    return tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64,
                                     is_pure=False, pack=1)


@triton.jit
def _sm_id():
    return tl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r", [], dtype=tl.int32,
                                     is_pure=False, pack=1)


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


# Batch sizes and split counts change every step: specialising on them (divisibility by 16,
# == 1, or a constexpr) would compile a variant for each, seconds apiece in a replay.
@triton.jit(do_not_specialize=["num_seqs", "num_splits"])
def paged_attention_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, out_ptr,
    block_tables_ptr, seq_lens_ptr, query_start_loc_ptr,
    part_acc_ptr, part_ml_ptr,
    seq_shares_ptr, extra_start_ptr, extra_seq_ptr, extra_split_ptr, timeline_ptr,
    scale_log2, num_seqs, num_heads, num_splits,
    stride_qt, stride_qh, stride_ot, stride_oh, stride_bt,
    stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
    BLOCK_SIZE: tl.constexpr, GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_N: tl.constexpr,
    ONE_TILE_PER_SEQ: tl.constexpr, SPLIT_PLAN: tl.constexpr, LONGEST_FIRST: tl.constexpr,
    HEADS_INNER: tl.constexpr, TIMELINE: tl.constexpr,
):
    if TIMELINE:  # the program's start; its SM and end are written where it finishes
        started = _global_ns()
    tile_idx = tl.program_id(0)
    kv_head = tl.program_id(1)
    num_tiles = tl.num_programs(0)
    if HEADS_INNER and not SPLIT_PLAN:  # grid axis 0 walks a tile's KV heads, then the next
        kv_heads = num_heads // GROUP
        kv_head = tile_idx % kv_heads
        tile_idx = tile_idx // kv_heads
        num_tiles = num_tiles // kv_heads
    if LONGEST_FIRST and not SPLIT_PLAN:  # the grid's last tile first (TileConfig)
        tile_idx = num_tiles - 1 - tile_idx
    split = tl.program_id(2)
    num_shares = num_splits  # programs sharing this tile's keys (plan: launched with 1)
    if SPLIT_PLAN:  # decode: each program is one share (a first or an extra) of one KV head
        # One flat launch: every sequence's first share (head by head, as without a plan),
        # then the plan's extra shares (the KV heads of one share side by side), then the
        # launch's unused extra slots, which exit at once: idle programs between real ones
        # cost a step up to 1.5x (measured, 32 x 4k). Starting the extra shares (long
        # sequences) first instead measured the same within 1%.
        num_kv_heads = num_heads // GROUP
        firsts = num_seqs * num_kv_heads
        if tile_idx >= firsts + tl.load(extra_start_ptr + num_seqs) * num_kv_heads:
            return
        is_extra = tile_idx >= firsts
        rel = tile_idx - tl.where(is_extra, firsts, 0)
        kv_head = tl.where(is_extra, rel % num_kv_heads, rel // num_seqs)
        extra = tl.where(is_extra, rel // num_kv_heads, 0)
        tile_idx = tl.where(is_extra, num_seqs + extra, rel % num_seqs)
        seq_idx = tile_idx
        split = tile_idx * 0
        if is_extra:
            seq_idx = tl.load(extra_seq_ptr + extra)
            split = tl.load(extra_split_ptr + extra)
        num_shares = tl.load(seq_shares_ptr + seq_idx)
        q0 = 0
    elif ONE_TILE_PER_SEQ:
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
    # An even split of the tile's keys over its shares (all of them for one share). With a
    # plan the count comes from the plan's share size, and cutting evenly keeps the shares of
    # a sequence equal (4,096 keys in 2 x 2,048, not 4,032 + 64 for a 4,032-key share).
    share = tl.cdiv(tl.cdiv(kv_end, num_shares), BLOCK_N) * BLOCK_N
    lo = tl.minimum(split * share, kv_end)
    hi = tl.minimum(lo + share, kv_end)
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

    if num_shares == 1:
        l_safe = tl.where(l_i == 0.0, 1.0, l_i)
        out = acc / l_safe[:, None]
        o_rows = (q_start + q_pos).to(tl.int64) * stride_ot + head * stride_oh
        tl.store(out_ptr + o_rows[:, None] + offs_d[None, :],
                 out.to(out_ptr.dtype.element_ty), mask=io_mask)
    else:
        if SPLIT_PLAN:  # partials indexed [program, head]
            part = tile_idx.to(tl.int64) * num_heads + head
        else:  # partials indexed [token, head, split]
            part = ((q_start + q_pos).to(tl.int64) * num_heads + head) * num_splits + split
        tl.store(part_acc_ptr + part[:, None] * HEAD_DIM_PAD + offs_d[None, :], acc,
                 mask=row_valid[:, None])
        tl.store(part_ml_ptr + part * 2, m_i, mask=row_valid)
        tl.store(part_ml_ptr + part * 2 + 1, l_i, mask=row_valid)
    if TIMELINE:  # (SM, start ns, end ns) by grid position; programs that exit early: zeros
        slot = (tl.program_id(2) * tl.num_programs(1) + tl.program_id(1)) * tl.num_programs(0)
        slot = (slot + tl.program_id(0)).to(tl.int64) * 3
        tl.store(timeline_ptr + slot, _sm_id().to(tl.int64))
        tl.store(timeline_ptr + slot + 1, started)
        tl.store(timeline_ptr + slot + 2, _global_ns())


@triton.jit(do_not_specialize=["num_seqs", "num_splits"])
def combine_splits_kernel(
    out_ptr, part_acc_ptr, part_ml_ptr, query_start_loc_ptr, seq_shares_ptr, extra_start_ptr,
    num_seqs, num_heads, num_splits, stride_ot, stride_oh,
    HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
    SPLITS_PAD: tl.constexpr, SPLIT_PLAN: tl.constexpr,
):
    """Merge the split-K partials of one (token, head) into the final output.

    With SPLIT_PLAN program 0 is a sequence (decode: one token each): its partials are
    those of program seq and of programs num_seqs + extra_start[seq] + k - 1 for its shares
    k >= 1; a sequence of one share already has its output written."""
    token = tl.program_id(0)
    head = tl.program_id(1)
    offs_s = tl.arange(0, SPLITS_PAD)
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    if SPLIT_PLAN:
        seq = token
        if seq >= num_seqs:
            return
        token = tl.load(query_start_loc_ptr + seq)
        if tl.load(query_start_loc_ptr + seq + 1) == token:  # no query token
            return
        num_shares = tl.load(seq_shares_ptr + seq)
        if num_shares == 1:
            return
        s_valid = offs_s < num_shares
        program = tl.where(offs_s == 0, seq, num_seqs + tl.load(extra_start_ptr + seq) + offs_s - 1)
        part = program.to(tl.int64) * num_heads + head  # [SPLITS_PAD]
    else:
        if token >= tl.load(query_start_loc_ptr + num_seqs):  # padding past the last sequence
            return
        s_valid = offs_s < num_splits
        part = (token.to(tl.int64) * num_heads + head) * num_splits + offs_s  # [SPLITS_PAD]
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
