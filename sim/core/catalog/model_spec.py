"""A model's static shapes, and what they cost: parameters, weight bytes, KV bytes, FLOPs.

Tensor-parallel (TP) accounting follows vLLM:
* embeddings and lm_head are ``VocabParallelEmbedding``/``ParallelLMHead``: the vocabulary is
  padded to a multiple of 64 and split across ranks;
* q/o projections and the MLP are split by ``tp``; k/v heads are split while
  ``tp <= num_kv_heads`` and replicated (one head per rank) beyond that;
* RMSNorm weights and MoE routers are replicated on every rank;
* MoE experts follow vLLM's default tensor-parallel ``FusedMoE`` (no expert parallelism): every
  rank holds every expert, each expert's intermediate dimension split by ``tp``;
* multi-head latent attention (MLA): ``q_a_proj``/``kv_a_proj_with_mqa`` are replicated,
  ``q_b_proj``/``kv_b_proj``/``o_proj`` split by heads; the latent KV cache is replicated.

fp8 quantization (``linear_dtype_bytes=1``) stores the decoder's linear weights in one byte;
embeddings, lm_head, norms, biases and MoE routers keep the model dtype, as vLLM's fp8 does.

Not modelled: expert parallelism; skewed routing (decode reads assume uniform routing); MLA's
absorbed decode attention and its prefill up-projection of a prefix's latents (``head_dim``
stands for both the QK^T and PV widths); fp8 scales (a few bytes per tensor or channel).
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.core.catalog.units import ceil_div

# vLLM's DEFAULT_VOCAB_PADDING_SIZE (vllm/model_executor/layers/vocab_parallel_embedding.py).
VOCAB_PADDING_SIZE = 64
ELEMENT_BYTES = (1, 2, 4)


@dataclass(frozen=True)
class MoeSpec:
    """The routed MLP of a mixture-of-experts model (SwiGLU experts: gate, up, down)."""

    num_experts: int
    num_experts_per_tok: int
    moe_intermediate_size: int  # one expert's intermediate width
    # always-on shared experts, as one MLP of this width (Qwen2-MoE's shared_expert,
    # DeepSeek's n_shared_experts x moe_intermediate_size); 0 where there is none
    shared_expert_intermediate_size: int = 0
    shared_expert_gate: bool = False  # Qwen2-MoE scales the shared expert by sigmoid(x W), W [H, 1]
    num_dense_layers: int = 0  # leading layers with a dense MLP (DeepSeek's first_k_dense_replace)

    def __post_init__(self) -> None:
        for name in ("num_experts", "num_experts_per_tok", "moe_intermediate_size"):
            if getattr(self, name) <= 0:
                raise ValueError(f"MoE {name} must be positive")
        if self.num_experts_per_tok > self.num_experts:
            raise ValueError(f"MoE num_experts_per_tok ({self.num_experts_per_tok}) exceeds "
                             f"num_experts ({self.num_experts})")
        if self.shared_expert_intermediate_size < 0 or self.num_dense_layers < 0:
            raise ValueError("MoE shared_expert_intermediate_size and num_dense_layers must be >= 0")

    def expected_experts_touched(self, num_tokens: float) -> float:
        """Distinct experts a step of ``num_tokens`` tokens reads, per MoE layer.

        Under uniform routing each token leaves a given expert out with probability
        1 - k/E, so E x (1 - (1 - k/E)^T) are touched on average: k for one token, never more
        than min(E, T x k), and all E once T x k is a few times E. Real routers are skewed,
        which touches fewer; this is the upper-end expectation a capacity planner should use.
        """
        e, k = self.num_experts, self.num_experts_per_tok
        return e * (1.0 - (1.0 - k / e) ** max(num_tokens, 0.0))


@dataclass(frozen=True)
class MlaSpec:
    """DeepSeek's multi-head latent attention: keys and values cached as one latent vector."""

    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    q_lora_rank: int | None = None  # None: q_proj is one full matrix (DeepSeek-V2-Lite)

    def __post_init__(self) -> None:
        for name in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
            if getattr(self, name) <= 0:
                raise ValueError(f"MLA {name} must be positive")
        if self.q_lora_rank is not None and self.q_lora_rank <= 0:
            raise ValueError("MLA q_lora_rank must be positive (or None)")

    @property
    def cache_width(self) -> int:
        """Elements cached per token per layer: the latent plus the shared rotary key."""
        return self.kv_lora_rank + self.qk_rope_head_dim


@dataclass(frozen=True)
class ModelSpec:
    name: str
    num_layers: int
    hidden_size: int
    intermediate_size: int  # the dense MLP's width (MoE models: their dense layers', if any)
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int  # MLA: the query-key width, qk_nope_head_dim + qk_rope_head_dim
    vocab_size: int
    dtype_bytes: int = 2
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # q/k/v projections carry a bias (Qwen2)
    # the context vLLM derives from config.json (max_position_embeddings, rope scaling
    # applied: hf_config), past which it refuses a max_model_len; 32,768 (Qwen2's default)
    # where a hand-built spec leaves it out
    max_position_embeddings: int = 32768
    kv_dtype_bytes: int | None = None  # KV cache element bytes; None: dtype_bytes
    linear_dtype_bytes: int | None = None  # decoder linear weights; None: dtype_bytes
    moe: MoeSpec | None = None
    mla: MlaSpec | None = None

    def __post_init__(self) -> None:
        for field_name in ("num_layers", "hidden_size", "intermediate_size",
                           "num_attention_heads", "num_kv_heads", "head_dim", "vocab_size",
                           "max_position_embeddings"):
            if getattr(self, field_name) <= 0:
                raise ValueError(f"model {self.name!r}: {field_name} must be positive")
        if self.num_attention_heads % self.num_kv_heads:
            raise ValueError(
                f"model {self.name!r}: num_attention_heads "
                f"({self.num_attention_heads}) must be a multiple of num_kv_heads "
                f"({self.num_kv_heads})"
            )
        for field_name in ("dtype_bytes", "kv_dtype_bytes", "linear_dtype_bytes"):
            value = getattr(self, field_name)
            if value is not None and value not in ELEMENT_BYTES:
                raise ValueError(f"model {self.name!r}: {field_name} must be 1, 2 or 4")
        if self.moe is not None and self.moe.num_dense_layers >= self.num_layers:
            raise ValueError(f"model {self.name!r}: every layer is dense; drop the MoE spec")

    # --- element sizes and layer kinds -----------------------------------------------------
    @property
    def kv_element_bytes(self) -> int:
        return self.dtype_bytes if self.kv_dtype_bytes is None else self.kv_dtype_bytes

    @property
    def linear_element_bytes(self) -> int:
        return self.dtype_bytes if self.linear_dtype_bytes is None else self.linear_dtype_bytes

    @property
    def num_moe_layers(self) -> int:
        return 0 if self.moe is None else self.num_layers - self.moe.num_dense_layers

    # --- per-rank shapes -------------------------------------------------------------------
    def kv_heads_per_gpu(self, tp: int = 1) -> int:
        """KV heads stored per rank; replicated (ceil-div) when tp > num_kv_heads, as vLLM does."""
        return ceil_div(self.num_kv_heads, tp)

    def padded_vocab_size(self, tp: int = 1) -> int:
        """Vocabulary rows per rank: padded to a multiple of 64, then split by tp."""
        padded = ceil_div(self.vocab_size, VOCAB_PADDING_SIZE) * VOCAB_PADDING_SIZE
        return ceil_div(padded, tp)

    # --- parameter counts ------------------------------------------------------------------
    def _attention_params(self, tp: int) -> tuple[int, int]:
        """(linear, other) parameters of one layer's attention on one rank; other: biases and
        MLA's latent norms, kept in the model dtype."""
        h, heads = self.hidden_size, self.num_attention_heads
        if self.mla is not None:
            m = self.mla
            qk = m.qk_nope_head_dim + m.qk_rope_head_dim
            if m.q_lora_rank is None:
                q, q_norm = h * heads * qk // tp, 0
            else:
                q, q_norm = h * m.q_lora_rank + m.q_lora_rank * heads * qk // tp, m.q_lora_rank
            kv_a = h * m.cache_width  # replicated
            kv_b = m.kv_lora_rank * heads * (m.qk_nope_head_dim + m.v_head_dim) // tp
            o = heads * m.v_head_dim * h // tp
            return q + kv_a + kv_b + o, q_norm + m.kv_lora_rank
        hd = self.head_dim
        kv_heads = self.num_kv_heads if tp == 1 else self.kv_heads_per_gpu(tp)
        linear = 2 * h * (heads * hd) // tp + 2 * h * kv_heads * hd
        bias = (heads * hd) // tp + 2 * kv_heads * hd if self.attention_bias else 0
        return linear, bias

    def _decoder_params(self, tp: int, experts: float | None = None) -> tuple[float, int, int]:
        """(linear, router, other) parameters of all decoder layers on one rank, with
        ``experts`` routed experts per MoE layer (None: all of them)."""
        h = self.hidden_size
        attention, attention_other = self._attention_params(tp)
        dense_layers = self.num_layers - self.num_moe_layers
        linear: float = self.num_layers * attention + dense_layers * (
            3 * h * self.intermediate_size // tp)  # gate, up, down
        router = 0
        if self.moe is not None:
            m = self.moe
            held = m.num_experts if experts is None else experts
            expert = 3 * h * m.moe_intermediate_size // tp
            shared = 3 * h * m.shared_expert_intermediate_size // tp
            linear += self.num_moe_layers * (held * expert + shared)
            router = self.num_moe_layers * h * (m.num_experts + int(m.shared_expert_gate))
        other = self.num_layers * (attention_other + 2 * h)  # + 2 norms per layer
        return linear, router, other

    def _embedding_params(self, tp: int) -> int:
        vocab = self.vocab_size if tp == 1 else self.padded_vocab_size(tp)
        return vocab * self.hidden_size * (1 if self.tie_word_embeddings else 2)

    def num_params(self) -> int:
        """Parameters of the whole (unsharded, unpadded) model; a tied lm_head counts once."""
        linear, router, other = self._decoder_params(1)
        return int(linear) + router + other + self._embedding_params(1) + self.hidden_size

    def num_active_params(self) -> int:
        """Parameters one token runs through: all but the routed experts it skips. Both
        embedding tables count, as Mixtral's 12.9B and Qwen1.5-MoE's 2.7B do."""
        if self.moe is None:
            return self.num_params()
        skipped = self.moe.num_experts - self.moe.num_experts_per_tok
        expert = 3 * self.hidden_size * self.moe.moe_intermediate_size
        return self.num_params() - self.num_moe_layers * skipped * expert

    def weight_bytes(self, tp: int = 1) -> int:
        """Weight bytes held by one rank under tensor parallelism ``tp``."""
        linear, router, other = self._decoder_params(tp)
        kept = router + other + self._embedding_params(tp) + self.hidden_size  # + final norm
        return int(linear) * self.linear_element_bytes + kept * self.dtype_bytes

    def kv_bytes_per_token(self, tp: int = 1) -> int:
        """KV cache bytes one token occupies on one rank, all layers together. MLA caches one
        latent of kv_lora_rank + qk_rope_head_dim per layer, replicated on every rank."""
        if self.mla is not None:
            return self.num_layers * self.mla.cache_width * self.kv_element_bytes
        return (2 * self.num_layers * self.kv_heads_per_gpu(tp) * self.head_dim
                * self.kv_element_bytes)

    def linear_flops_per_token(self, tp: int = 1) -> float:
        """Matmul FLOPs per token per rank: 2 x (the decoder's linear weights a token runs
        through, MoE routers and only its active experts included, and lm_head) / tp."""
        active = None if self.moe is None else self.moe.num_experts_per_tok
        linear, router, _ = self._decoder_params(1, active)
        return 2.0 * (linear + router + self.vocab_size * self.hidden_size) / tp

    def layer_weight_bytes_read(self, num_tokens: float, tp: int = 1) -> float:
        """Decoder weight bytes one rank reads in a step of ``num_tokens`` tokens: every dense
        weight once, and of each MoE layer's experts the expected number a batch that size
        touches (MoeSpec.expected_experts_touched). lm_head is priced apart."""
        touched = None if self.moe is None else self.moe.expected_experts_touched(num_tokens)
        linear, router, _ = self._decoder_params(1, touched)
        return (linear * self.linear_element_bytes + router * self.dtype_bytes) / tp
