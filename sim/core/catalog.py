"""GPU and model presets: the static shapes every memory and cost model starts from.

Presets follow gpt-fast's ``from_name`` style: a dict of named, frozen specs, looked up
case-insensitively. A model can also be read from a Hugging Face ``config.json``.

Tensor-parallel (TP) accounting follows vLLM:
* embeddings and lm_head are ``VocabParallelEmbedding``/``ParallelLMHead``: the vocabulary is
  padded to a multiple of 64 and split across ranks;
* q/o projections and the MLP are split by ``tp``; k/v heads are split while
  ``tp <= num_kv_heads`` and replicated (one head per rank) beyond that;
* RMSNorm weights are replicated on every rank.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TypeVar

GIB = 1024**3
MIB = 1024**2
# vLLM's DEFAULT_VOCAB_PADDING_SIZE (vllm/model_executor/layers/vocab_parallel_embedding.py).
VOCAB_PADDING_SIZE = 64


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class GpuSpec:
    name: str
    memory_bytes: int  # total as cudaMemGetInfo / torch report it (less than nvidia-smi shows)
    peak_bf16_flops: float  # dense tensor-core FLOP/s
    memory_bandwidth_bytes_s: float
    interconnect_bytes_s: float  # per-GPU unidirectional NVLink (or PCIe) bandwidth
    vmm_granularity_bytes: int = 2 * MIB
    # streaming multiprocessors: whether an attention launch fills the GPU or splits its keys
    # (CostModel's split_launch_s); 0: unknown, no split priced
    num_sms: int = 0

    def __post_init__(self) -> None:
        if self.memory_bytes <= 0 or self.vmm_granularity_bytes <= 0:
            raise ValueError(f"GPU {self.name!r}: memory and VMM granularity must be positive")
        if self.num_sms < 0:
            raise ValueError(f"GPU {self.name!r}: num_sms must be >= 0 (0: unknown)")


@dataclass(frozen=True)
class ModelSpec:
    name: str
    num_layers: int
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    dtype_bytes: int = 2
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # q/k/v projections carry a bias (Qwen2)

    def __post_init__(self) -> None:
        for field_name in (
            "num_layers",
            "hidden_size",
            "intermediate_size",
            "num_attention_heads",
            "num_kv_heads",
            "head_dim",
            "vocab_size",
        ):
            if getattr(self, field_name) <= 0:
                raise ValueError(f"model {self.name!r}: {field_name} must be positive")
        if self.num_attention_heads % self.num_kv_heads:
            raise ValueError(
                f"model {self.name!r}: num_attention_heads "
                f"({self.num_attention_heads}) must be a multiple of num_kv_heads "
                f"({self.num_kv_heads})"
            )
        if self.dtype_bytes not in (1, 2, 4):
            raise ValueError(f"model {self.name!r}: dtype_bytes must be 1, 2 or 4")

    # --- per-rank shapes -------------------------------------------------------------------
    def kv_heads_per_gpu(self, tp: int = 1) -> int:
        """KV heads stored per rank; replicated (ceil-div) when tp > num_kv_heads, as vLLM does."""
        return _ceil_div(self.num_kv_heads, tp)

    def padded_vocab_size(self, tp: int = 1) -> int:
        """Vocabulary rows per rank: padded to a multiple of 64, then split by tp."""
        padded = _ceil_div(self.vocab_size, VOCAB_PADDING_SIZE) * VOCAB_PADDING_SIZE
        return _ceil_div(padded, tp)

    # --- parameter counts ------------------------------------------------------------------
    def _layer_linear_params(self, tp: int, kv_heads: int) -> int:
        h, hd = self.hidden_size, self.head_dim
        q_and_o = 2 * h * (self.num_attention_heads * hd) // tp
        k_and_v = 2 * h * kv_heads * hd
        mlp = 3 * h * self.intermediate_size // tp  # gate, up, down
        return q_and_o + k_and_v + mlp

    def _params_per_gpu(self, tp: int) -> int:
        kv_heads = self.num_kv_heads if tp == 1 else self.kv_heads_per_gpu(tp)
        vocab = self.vocab_size if tp == 1 else self.padded_vocab_size(tp)
        per_layer = self._layer_linear_params(tp, kv_heads) + 2 * self.hidden_size  # 2 norms
        if self.attention_bias:
            per_layer += (self.num_attention_heads * self.head_dim) // tp
            per_layer += 2 * kv_heads * self.head_dim
        embeddings = vocab * self.hidden_size * (1 if self.tie_word_embeddings else 2)
        return self.num_layers * per_layer + embeddings + self.hidden_size  # + final norm

    def num_params(self) -> int:
        """Parameters of the whole (unsharded, unpadded) model; a tied lm_head counts once."""
        return self._params_per_gpu(1)

    def weight_bytes(self, tp: int = 1) -> int:
        """Weight bytes held by one rank under tensor parallelism ``tp``."""
        return self._params_per_gpu(tp) * self.dtype_bytes

    def kv_bytes_per_token(self, tp: int = 1) -> int:
        """K and V bytes one token occupies on one rank, all layers together."""
        return 2 * self.num_layers * self.kv_heads_per_gpu(tp) * self.head_dim * self.dtype_bytes

    def linear_flops_per_token(self, tp: int = 1) -> float:
        """Matmul FLOPs per token per rank: 2 x (q, k, v, o, MLP and lm_head weights) / tp."""
        h, hd = self.hidden_size, self.head_dim
        attn = h * hd * (2 * self.num_attention_heads + 2 * self.num_kv_heads)
        per_layer = attn + 3 * h * self.intermediate_size
        linear_params = self.num_layers * per_layer + self.vocab_size * h
        return 2.0 * linear_params / tp


# --- GPU presets ---------------------------------------------------------------------------
# memory_bytes is what the CUDA driver reports as total (torch.cuda.mem_get_info()[1]), which is
# a few hundred MiB below nvidia-smi's figure. Compute, bandwidth and NVLink figures are from
# NVIDIA's datasheets; NVLink is quoted there bidirectional, we store half (one direction).
GPUS: dict[str, GpuSpec] = {
    spec.name: spec
    for spec in (
        # A100 datasheet (SXM): 312 TFLOPS bf16 dense, HBM2 1,555 GB/s, NVLink3 600 GB/s bidir.
        # 39.59 GiB: the total PyTorch prints in OOM messages on A100-SXM4-40GB.
        GpuSpec("a100-40gb", int(39.59 * GIB), 312e12, 1555e9, 300e9, num_sms=108),
        # A100 80GB datasheet (SXM): HBM2e 2,039 GB/s. 79.35 GiB: PyTorch OOM messages.
        GpuSpec("a100-80gb", int(79.35 * GIB), 312e12, 2039e9, 300e9, num_sms=108),
        # H100 SXM datasheet: 989 TFLOPS bf16 dense (1,979 with sparsity), HBM3 3.35 TB/s,
        # NVLink4 900 GB/s bidir. 79.18 GiB: total in vLLM memory-profiling logs on H100.
        GpuSpec("h100-80gb", int(79.18 * GIB), 989.4e12, 3.35e12, 450e9, num_sms=132),
        # H200 datasheet: same compute as H100, HBM3e 4.8 TB/s, NVLink4 900 GB/s bidir.
        # 150,109,880,320 B = 139.80 GiB: measured with torch.cuda.mem_get_info on an H200
        # (nvidia-smi shows 143,771 MiB).
        GpuSpec("h200-141gb", 150_109_880_320, 989.4e12, 4.8e12, 450e9, num_sms=132),
        # L40S datasheet: 362 TFLOPS bf16 dense (733 sparse), GDDR6 864 GB/s, no NVLink:
        # PCIe Gen4 x16, 64 GB/s bidir. 44.40 GiB: PyTorch OOM messages on L40S (approximate).
        GpuSpec("l40s", int(44.40 * GIB), 362e12, 864e9, 32e9, num_sms=142),
        # HGX B200 datasheet (per GPU): 2.25 PFLOPS bf16 dense (4.5 sparse), HBM3e 8 TB/s,
        # NVLink5 1.8 TB/s bidir. 178.35 GiB: PyTorch OOM messages on B200.
        GpuSpec("b200", int(178.35 * GIB), 2.25e15, 8e12, 900e9, num_sms=148),
    )
}
GPU_ALIASES: dict[str, str] = {
    "a100": "a100-80gb",
    "a100-40g": "a100-40gb",
    "a100-80g": "a100-80gb",
    "h100": "h100-80gb",
    "h100-sxm": "h100-80gb",
    "h200": "h200-141gb",
    "h200-141g": "h200-141gb",
}

# --- model presets -------------------------------------------------------------------------
# Shapes copied from each model's config.json on the Hugging Face Hub (num_hidden_layers,
# hidden_size, intermediate_size, num_attention_heads, num_key_value_heads, head_dim or
# hidden/heads, vocab_size, tie_word_embeddings). All bf16.
MODELS: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in (
        ModelSpec("llama-3.2-1b", 16, 2048, 8192, 32, 8, 64, 128256, tie_word_embeddings=True),
        ModelSpec("llama-3.2-3b", 28, 3072, 8192, 24, 8, 128, 128256, tie_word_embeddings=True),
        ModelSpec("llama-3.1-8b", 32, 4096, 14336, 32, 8, 128, 128256),
        ModelSpec("llama-3.1-70b", 80, 8192, 28672, 64, 8, 128, 128256),
        ModelSpec(
            "qwen2.5-0.5b",
            24,
            896,
            4864,
            14,
            2,
            64,
            151936,
            tie_word_embeddings=True,
            attention_bias=True,
        ),
        ModelSpec(
            "qwen2.5-1.5b",
            28,
            1536,
            8960,
            12,
            2,
            128,
            151936,
            tie_word_embeddings=True,
            attention_bias=True,
        ),
        ModelSpec("qwen2.5-7b", 28, 3584, 18944, 28, 4, 128, 152064, attention_bias=True),
        ModelSpec("qwen2.5-14b", 48, 5120, 13824, 40, 8, 128, 152064, attention_bias=True),
        ModelSpec("qwen2.5-32b", 64, 5120, 27648, 40, 8, 128, 152064, attention_bias=True),
        ModelSpec("qwen2.5-72b", 80, 8192, 29568, 64, 8, 128, 152064, attention_bias=True),
        ModelSpec("mistral-7b", 32, 4096, 14336, 32, 8, 128, 32768),  # v0.3
    )
}
MODEL_ALIASES: dict[str, str] = {"mistral-7b-v0.3": "mistral-7b"}

SpecT = TypeVar("SpecT", GpuSpec, ModelSpec)

DTYPE_BYTES: dict[str, int] = {
    "bfloat16": 2,
    "bf16": 2,
    "float16": 2,
    "fp16": 2,
    "half": 2,
    "float32": 4,
    "fp32": 4,
    "float": 4,
}


def _lookup(kind: str, name: str, table: dict[str, SpecT], aliases: dict[str, str]) -> SpecT:
    key = name.strip().lower()
    key = aliases.get(key, key)
    if key in table:
        return table[key]
    known = ", ".join(sorted(table) + sorted(aliases))
    raise ValueError(f"unknown {kind} {name!r}; known: {known}")


def get_gpu(name: str) -> GpuSpec:
    """Look up a GPU preset by name or alias, case-insensitively."""
    return _lookup("GPU", name, GPUS, GPU_ALIASES)


def get_model(name_or_path: str | Path) -> ModelSpec:
    """A preset by name (case-insensitive), or a Hugging Face config.json (file or folder)."""
    path = Path(name_or_path).expanduser()
    if path.is_dir() or path.is_file():
        return model_from_hf_config(path)
    return _lookup("model", str(name_or_path), MODELS, MODEL_ALIASES)


def model_from_hf_config(path: str | Path) -> ModelSpec:
    """Build a ModelSpec from a Hugging Face ``config.json`` (or a folder containing one)."""
    file = Path(path).expanduser()
    if file.is_dir():
        file = file / "config.json"
    try:
        cfg = json.loads(file.read_text())
    except OSError as exc:
        raise ValueError(f"cannot read model config {file}: {exc.strerror}") from exc
    except json.JSONDecodeError as exc:
        raise ValueError(f"{file} is not valid JSON: {exc}") from exc
    if not isinstance(cfg, dict):
        raise ValueError(f"{file}: expected a JSON object")
    # Multimodal wrappers keep the language model's fields in text_config.
    cfg = {**(cfg.get("text_config") or {}), **cfg}

    def need(key: str) -> int:
        if key not in cfg or cfg[key] is None:
            raise ValueError(f"{file}: missing field {key!r} in the model config")
        return int(cfg[key])

    hidden, heads = need("hidden_size"), need("num_attention_heads")
    dtype_name = str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16").lower()
    if dtype_name not in DTYPE_BYTES:
        raise ValueError(f"{file}: unsupported dtype {dtype_name!r}; known: {sorted(DTYPE_BYTES)}")
    model_type = str(cfg.get("model_type", "")).lower()
    name = file.parent.name if file.name == "config.json" else file.stem
    return ModelSpec(
        name=name,
        num_layers=need("num_hidden_layers"),
        hidden_size=hidden,
        intermediate_size=need("intermediate_size"),
        num_attention_heads=heads,
        num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
        head_dim=int(cfg.get("head_dim") or hidden // heads),
        vocab_size=need("vocab_size"),
        dtype_bytes=DTYPE_BYTES[dtype_name],
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        attention_bias=bool(cfg.get("attention_bias", model_type == "qwen2")),
    )


def with_dtype(model: ModelSpec, dtype: str) -> ModelSpec:
    """The same model with weights and KV cache in ``dtype`` (bf16, fp16 or fp32)."""
    key = dtype.strip().lower()
    if key not in DTYPE_BYTES:
        raise ValueError(f"unknown dtype {dtype!r}; known: {', '.join(sorted(DTYPE_BYTES))}")
    return replace(model, dtype_bytes=DTYPE_BYTES[key])
