"""The activation peak of vLLM's profiling step: what the memory plan reserves for activations.

vLLM v1's ``profile_run`` runs one dummy forward of ``max_num_batched_tokens`` tokens, then the
sampler on one logit row per dummy request; torch's caching allocator records the peak. Layers
run one after another and free their temporaries, so the forward peak is the tensors that live
through every layer plus the largest single block (attention, a dense MLP or an MoE layer).
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.core.catalog import ModelSpec

# Bytes the profiled forward holds per token outside the layer temporaries: input ids (int32),
# positions (int64) and the slot mapping (int64) of vLLM's model runner.
INPUT_BUFFER_BYTES_PER_TOKEN = 4 + 8 + 8
# Sampler temporaries per logit in vLLM v1's dummy sampler run (temperature, top-k and top-p
# all on): fp32 upcast 4, sort values 4 + int64 indices 8, two bool masks 2, softmax of the
# sorted logits 4, scattered-back logits 4, final softmax 4, exponential noise 4 = 34 bytes.
# With the model-dtype logits (2) that is 36 B per logit; vLLM's logged peaks (4.76 GiB for
# Llama-3.1-8B, 5.56 GiB for Qwen3-0.6B at 8192 tokens and 1024 rows on H100) imply ~38.
SAMPLER_FP32_BYTES_PER_LOGIT = 34
# vLLM's fused MoE runs at most VLLM_FUSED_MOE_CHUNK_SIZE (16,384) tokens at a time and sizes
# its expert workspaces for one such chunk.
FUSED_MOE_CHUNK_TOKENS = 16 * 1024
# top-k routing weights (fp32) and expert ids (int32) per token and chosen expert
ROUTING_BYTES_PER_CHOICE = 4 + 4


@dataclass(frozen=True)
class ActivationProfile:
    """Calibration measured on a GPU; replaces the analytic activation formula.

    ``fixed_bytes`` covers everything that does not scale with tokens (sampler included).
    ``non_torch_bytes``, when given, replaces the non-torch constants. It holds the CUDA
    graphs' pool, whose piecewise graphs keep the activations of the largest one:
    ``graph_tokens`` is that graph's token count (0: no piecewise graphs; None: not known), so
    that an engine capturing up to another size is planned with the pool grown or shrunk by
    ``bytes_per_token`` a token (sim.core.memory_plan.plan_memory).
    """

    bytes_per_token: float
    fixed_bytes: int
    non_torch_bytes: int | None = None
    graph_tokens: int | None = None


def _attention_block_width(model: ModelSpec, tp: int) -> int:
    """Elements per token alive in one attention block on one rank."""
    h, heads = model.hidden_size, model.num_attention_heads // tp
    if model.mla is not None:
        m = model.mla
        qk = m.qk_nope_head_dim + m.qk_rope_head_dim
        # q [T, heads x qk]; latent and rotary key [T, kv_lora + rope]; kv_b_proj output
        # [T, heads x (nope + v)]; keys with the rotary part [T, heads x qk]; attention output
        # [T, heads x v]; o_proj output [T, H]
        return (heads * qk + m.cache_width + heads * (m.qk_nope_head_dim + m.v_head_dim)
                + heads * qk + heads * m.v_head_dim + h)
    hd = model.head_dim
    q_width = model.num_attention_heads * hd // tp
    kv_width = model.kv_heads_per_gpu(tp) * hd
    # qkv output [T, q + 2 kv], attention output [T, q], o_proj output [T, H] (row-parallel
    # output is full width on every rank before the all-reduce)
    return (q_width + 2 * kv_width) + q_width + h


def _mlp_block_width(model: ModelSpec, tp: int) -> int:
    """Elements per token of one dense SwiGLU MLP: gate_up output [T, 2I/tp] (still referenced
    while down_proj runs), SiLU-and-mul output [T, I/tp], down_proj output [T, H]."""
    inter = model.intermediate_size // tp
    return 2 * inter + inter + model.hidden_size


def _moe_block_bytes(model: ModelSpec, num_tokens: int, tp: int) -> int:
    """One MoE layer: router logits [T, E]; routing weights and ids [T, k]; the shared
    experts' output [T, H] beside the routed experts' work, or the shared MLP's own block;
    the routed output [T, H]; and the fused-MoE workspaces for one chunk of tokens,
    [M x k, max(2N, H)] (gate_up output, reused for the down output) and [M x k, N] (the
    SiLU product), N = moe_intermediate / tp, M = min(T, 16,384)."""
    moe, h, d = model.moe, model.hidden_size, model.dtype_bytes
    assert moe is not None
    k, n = moe.num_experts_per_tok, moe.moe_intermediate_size // tp
    chunk = min(num_tokens, FUSED_MOE_CHUNK_TOKENS)
    routed = chunk * k * (max(2 * n, h) + n) * d + num_tokens * h * d
    shared_width = moe.shared_expert_intermediate_size // tp
    if shared_width:
        shared_block = num_tokens * (3 * shared_width + h) * d
        routed = max(routed + num_tokens * h * d, shared_block)
    router = num_tokens * (moe.num_experts * d + k * ROUTING_BYTES_PER_CHOICE)
    return router + routed


def forward_peak_bytes(model: ModelSpec, num_tokens: int, tp: int) -> int:
    """Peak of the dummy forward: hidden_states + residual [T, H] each (vLLM's fused
    add-RMSNorm works in place on them), the input buffers, and the largest layer block."""
    d = model.dtype_bytes
    persistent = num_tokens * (2 * model.hidden_size * d + INPUT_BUFFER_BYTES_PER_TOKEN)
    blocks = [num_tokens * _attention_block_width(model, tp) * d]
    if model.num_moe_layers < model.num_layers:
        blocks.append(num_tokens * _mlp_block_width(model, tp) * d)
    if model.moe is not None:
        blocks.append(_moe_block_bytes(model, num_tokens, tp))
    return persistent + max(blocks)


def sampler_peak_bytes(model: ModelSpec, num_tokens: int, tp: int, num_rows: int) -> int:
    """Peak of the dummy sampler run after the forward: the final hidden states [T, H] are
    still alive; lm_head gives [rows, V/tp] per rank, all-gathered to the full vocabulary
    [rows, V] on every rank (vLLM v1 all-gathers logits), then the sampler's fp32 temporaries."""
    d, vocab = model.dtype_bytes, model.vocab_size
    hidden = num_tokens * model.hidden_size * d
    if num_rows == 0:
        return hidden
    local_logits = num_rows * model.padded_vocab_size(tp) * d
    gathered_logits = num_rows * vocab * d if tp > 1 else 0
    temporaries = num_rows * vocab * SAMPLER_FP32_BYTES_PER_LOGIT
    return hidden + local_logits + gathered_logits + temporaries


def activation_bytes(
    model: ModelSpec,
    num_tokens: int,
    *,
    tp: int = 1,
    num_sample_rows: int = 0,
    profile: ActivationProfile | None = None,
) -> int:
    """Peak activation bytes on one rank for a step of ``num_tokens`` tokens, as torch's
    caching allocator would record it in vLLM's profile_run.

    The forward peak grows linearly with tokens (an MoE model's expert workspaces stop growing
    past one fused-MoE chunk); the sampler peak (``num_sample_rows`` logit rows) is flat in
    tokens and does not shrink with tp. The result is the larger of the two.
    """
    if num_tokens < 0 or num_sample_rows < 0:
        raise ValueError("num_tokens and num_sample_rows must be >= 0")
    if profile is not None:
        return int(profile.fixed_bytes + profile.bytes_per_token * num_tokens)
    return max(
        forward_peak_bytes(model, num_tokens, tp),
        sampler_peak_bytes(model, num_tokens, tp, num_sample_rows),
    )
