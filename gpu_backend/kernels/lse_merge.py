"""Merge partial attentions over disjoint key sets by their log-sum-exps.

A query row attended over keys A alone gives the normalised output o_A and the natural
log-sum-exp of its scaled scores, lse_A = log sum_{j in A} exp(s_j); likewise o_B, lse_B, ...
Attention over all the sets together is their softmax-weighted mean:

    lse = log(sum_i exp(lse_i))
    o   = sum_i exp(lse_i - lse) o_i

computed against m = max_i lse_i so that no exponent overflows. A part with no keys has
lse = -inf and weight 0; all parts empty give o = 0 and lse = -inf.

`merge_parts` merges any number of parts in one Triton launch (one program per token, all
heads; the parts' pointers and strides passed as tuples), each part read once, the sum kept
in float32 registers. A SPLIT sequence's square and its prefix segments (split_attention.py)
are one launch that way where a chain of pairwise merges took one per segment and wrote a
float32 result between them. Every operand is read through its strides, so the views SDPA
ops return ([1, H, S, D] seen as [S, H, D], LSE [1, H, S] seen as [S, H]) need no copy.
`merge_partials_ref` is the float32 torch reference the tests compare against.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import triton
import triton.language as tl
from torch import Tensor

Part = tuple[Tensor, Tensor]  # (o [T, H, D], lse [T, H] float32)


@triton.jit
def _merge_kernel(
    out_ptr, out_lse_ptr, num_heads, s_ot, s_oh, s_olt, s_olh,
    o_ptrs, lse_ptrs, o_strides, lse_strides,  # per part: its pointers, (token, head) strides
    NUM_PARTS: tl.constexpr, WRITE_LSE: tl.constexpr, HEAD_DIM: tl.constexpr,
    HEADS_PAD: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    h = tl.arange(0, HEADS_PAD)
    d = tl.arange(0, HEAD_DIM_PAD)
    h_ok = h < num_heads
    mask = h_ok[:, None] & (d < HEAD_DIM)[None, :]
    m_raw = tl.full((HEADS_PAD,), float("-inf"), tl.float32)
    for i in tl.static_range(NUM_PARTS):  # pass 1: the rows' largest LSE over the parts
        lse = tl.load(lse_ptrs[i] + t * lse_strides[2 * i] + h * lse_strides[2 * i + 1],
                      mask=h_ok, other=float("-inf"))
        m_raw = tl.maximum(m_raw, lse.to(tl.float32))
    m = tl.where(m_raw == float("-inf"), 0.0, m_raw)
    total = tl.zeros((HEADS_PAD,), tl.float32)
    acc = tl.zeros((HEADS_PAD, HEAD_DIM_PAD), tl.float32)
    for i in tl.static_range(NUM_PARTS):  # pass 2: every part read before `out` is written
        lse = tl.load(lse_ptrs[i] + t * lse_strides[2 * i] + h * lse_strides[2 * i + 1],
                      mask=h_ok, other=float("-inf"))
        w = tl.exp(lse.to(tl.float32) - m)
        o = tl.load(o_ptrs[i] + t * o_strides[2 * i] + h[:, None] * o_strides[2 * i + 1]
                    + d[None, :], mask=mask, other=0.0)
        total += w
        acc += o.to(tl.float32) * w[:, None]
    total = tl.where(total == 0.0, 1.0, total)
    tl.store(out_ptr + t * s_ot + h[:, None] * s_oh + d[None, :],
             (acc / total[:, None]).to(out_ptr.dtype.element_ty), mask=mask)
    if WRITE_LSE:
        lse = tl.where(m_raw == float("-inf"), float("-inf"), m + tl.log(total))
        tl.store(out_lse_ptr + t * s_olt + h * s_olh, lse, mask=h_ok)


def _check(name: str, x: Tensor, shape: tuple[int, ...], dense_last: bool) -> None:
    if tuple(x.shape) != shape:
        raise ValueError(f"merge: {name} has shape {tuple(x.shape)}, expected {shape}")
    if dense_last and x.stride(-1) != 1:
        raise ValueError(f"merge: {name} must be contiguous in head_dim, strides {x.stride()}")


def merge_parts(out: Tensor, parts: Sequence[Part], out_lse: Tensor | None = None) -> Tensor:
    """out [T, H, D] = the merge of parts (o [T, H, D], lse [T, H] natural log, float32) by
    their LSEs, in one launch; the merged LSE into `out_lse` [T, H] float32 when given. Any
    strides with head_dim dense; `out` may be one of the parts' o (each program reads its row
    before writing it). Each number of parts compiles the kernel once."""
    if not parts:
        raise ValueError("merge: no parts to merge")
    num_tokens, num_heads, head_dim = out.shape
    _check("out", out, (num_tokens, num_heads, head_dim), dense_last=True)
    lses = [("out_lse", out_lse)] if out_lse is not None else []
    for i, (o, lse) in enumerate(parts):
        _check(f"part {i}", o, (num_tokens, num_heads, head_dim), dense_last=True)
        lses.append((f"part {i} lse", lse))
    for name, x in lses:
        _check(name, x, (num_tokens, num_heads), dense_last=False)
        if x.dtype != torch.float32:
            raise ValueError(f"merge: {name} must be float32, got {x.dtype}")
    if num_tokens == 0:
        return out
    lse_out = out_lse if out_lse is not None else parts[0][1]  # unused without WRITE_LSE
    _merge_kernel[(num_tokens,)](
        out, lse_out, num_heads, out.stride(0), out.stride(1), lse_out.stride(0),
        lse_out.stride(1), tuple(o for o, _ in parts), tuple(lse for _, lse in parts),
        tuple(s for o, _ in parts for s in o.stride()[:2]),
        tuple(s for _, lse in parts for s in lse.stride()),
        NUM_PARTS=len(parts), WRITE_LSE=out_lse is not None, HEAD_DIM=head_dim,
        HEADS_PAD=triton.next_power_of_2(num_heads),
        HEAD_DIM_PAD=triton.next_power_of_2(head_dim), num_warps=4)
    return out


def merge_partials(out: Tensor, a: Tensor, lse_a: Tensor, b: Tensor, lse_b: Tensor,
                   out_lse: Tensor | None = None) -> Tensor:
    """`merge_parts` of two parts: out [T, H, D] = the merge of a, b [T, H, D] by lse_a,
    lse_b [T, H]."""
    return merge_parts(out, [(a, lse_a), (b, lse_b)], out_lse)


def merge_partials_ref(a: Tensor, lse_a: Tensor, b: Tensor,
                       lse_b: Tensor) -> tuple[Tensor, Tensor]:
    """float32 torch merge: (out [T, H, D], lse [T, H]) of a, b [T, H, D] by lse_a, lse_b."""
    la, lb = lse_a.float(), lse_b.float()
    m_raw = torch.maximum(la, lb)
    m = torch.where(m_raw == float("-inf"), torch.zeros_like(m_raw), m_raw)
    wa, wb = torch.exp(la - m), torch.exp(lb - m)
    total = wa + wb
    safe = torch.where(total == 0, torch.ones_like(total), total)
    out = (a.float() * (wa / safe)[..., None] + b.float() * (wb / safe)[..., None])
    lse = torch.where(m_raw == float("-inf"), m_raw, m + torch.log(safe))
    return out, lse
