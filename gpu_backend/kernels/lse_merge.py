"""Merge two partial attentions over disjoint key sets by their log-sum-exps.

A query row attended over keys A alone gives the normalised output o_A and the natural
log-sum-exp of its scaled scores, lse_A = log sum_{j in A} exp(s_j); the same over keys B
gives o_B, lse_B. Attention over A and B together is their softmax-weighted mean:

    lse = log(exp(lse_A) + exp(lse_B))
    o   = (exp(lse_A - lse) o_A + exp(lse_B - lse) o_B)

computed against m = max(lse_A, lse_B) so that no exponent overflows. A side with no keys
has lse = -inf and weight 0; both sides empty give o = 0 and lse = -inf.

`merge_partials` is one Triton launch (one program per token, all heads); every operand is
read through its strides, so the views SDPA ops return ([1, H, S, D] seen as [S, H, D],
LSE [1, H, S] seen as [S, H]) need no copy. `merge_partials_ref` is the float32 torch
reference the tests compare against.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor


@triton.jit
def _merge_kernel(
    out_ptr, out_lse_ptr, a_ptr, la_ptr, b_ptr, lb_ptr, num_heads,
    s_ot, s_oh, s_olt, s_olh, s_at, s_ah, s_lat, s_lah, s_bt, s_bh, s_lbt, s_lbh,
    WRITE_LSE: tl.constexpr, HEAD_DIM: tl.constexpr, HEADS_PAD: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    h = tl.arange(0, HEADS_PAD)
    d = tl.arange(0, HEAD_DIM_PAD)
    h_ok = h < num_heads
    mask = h_ok[:, None] & (d < HEAD_DIM)[None, :]
    la = tl.load(la_ptr + t * s_lat + h * s_lah, mask=h_ok, other=float("-inf")).to(tl.float32)
    lb = tl.load(lb_ptr + t * s_lbt + h * s_lbh, mask=h_ok, other=float("-inf")).to(tl.float32)
    m_raw = tl.maximum(la, lb)
    m = tl.where(m_raw == float("-inf"), 0.0, m_raw)
    wa = tl.exp(la - m)
    wb = tl.exp(lb - m)
    total = wa + wb
    total = tl.where(total == 0.0, 1.0, total)
    a = tl.load(a_ptr + t * s_at + h[:, None] * s_ah + d[None, :], mask=mask, other=0.0)
    b = tl.load(b_ptr + t * s_bt + h[:, None] * s_bh + d[None, :], mask=mask, other=0.0)
    o = (a.to(tl.float32) * (wa / total)[:, None] + b.to(tl.float32) * (wb / total)[:, None])
    tl.store(out_ptr + t * s_ot + h[:, None] * s_oh + d[None, :],
             o.to(out_ptr.dtype.element_ty), mask=mask)
    if WRITE_LSE:
        lse = tl.where(m_raw == float("-inf"), float("-inf"), m + tl.log(total))
        tl.store(out_lse_ptr + t * s_olt + h * s_olh, lse, mask=h_ok)


def _check(name: str, x: Tensor, shape: tuple[int, ...], dense_last: bool) -> None:
    if tuple(x.shape) != shape:
        raise ValueError(f"merge: {name} has shape {tuple(x.shape)}, expected {shape}")
    if dense_last and x.stride(-1) != 1:
        raise ValueError(f"merge: {name} must be contiguous in head_dim, strides {x.stride()}")


def merge_partials(out: Tensor, a: Tensor, lse_a: Tensor, b: Tensor, lse_b: Tensor,
                   out_lse: Tensor | None = None) -> Tensor:
    """out [T, H, D] = the merge of a, b [T, H, D] by lse_a, lse_b [T, H] (natural log,
    float32); the merged LSE into `out_lse` [T, H] float32 when given. Any strides with
    head_dim dense; `out` may be `a` or `b` (each program reads its row before writing it)."""
    num_tokens, num_heads, head_dim = out.shape
    for name, x in (("out", out), ("a", a), ("b", b)):
        _check(name, x, (num_tokens, num_heads, head_dim), dense_last=True)
    for name, x in (("lse_a", lse_a), ("lse_b", lse_b), ("out_lse", out_lse)):
        if x is not None:
            _check(name, x, (num_tokens, num_heads), dense_last=False)
            if x.dtype != torch.float32:
                raise ValueError(f"merge: {name} must be float32, got {x.dtype}")
    if num_tokens == 0:
        return out
    lse_out = out_lse if out_lse is not None else lse_a  # unused without WRITE_LSE
    _merge_kernel[(num_tokens,)](
        out, lse_out, a, lse_a, b, lse_b, num_heads,
        out.stride(0), out.stride(1), lse_out.stride(0), lse_out.stride(1),
        a.stride(0), a.stride(1), lse_a.stride(0), lse_a.stride(1),
        b.stride(0), b.stride(1), lse_b.stride(0), lse_b.stride(1),
        WRITE_LSE=out_lse is not None, HEAD_DIM=head_dim,
        HEADS_PAD=triton.next_power_of_2(num_heads),
        HEAD_DIM_PAD=triton.next_power_of_2(head_dim), num_warps=4)
    return out


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
