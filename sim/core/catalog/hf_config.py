"""Read a ModelSpec from a Hugging Face ``config.json``: dense, mixture-of-experts (Mixtral,
Qwen2/Qwen3-MoE, DeepSeek-V2/V3) and multi-head latent attention (DeepSeek).

Every field is type-checked: a bad value is an error naming the file, the line and the key.
Not modelled: sliding-window or hybrid attention layers, MoE layers at a stride
(``decoder_sparse_step``/``moe_layer_freq`` > 1, ``mlp_only_layers``), Qwen3's per-head q/k
norms (256 parameters a layer), multimodal towers.

The context (``ModelSpec.max_position_embeddings``) is the maximum vLLM derives
(``_get_and_verify_max_len``), past which it refuses a max_model_len:
``max_position_embeddings`` (or the model type's default), times ``rope_scaling["factor"]``
unless the rope type is "su", "longrope" or "llama3", whose ``max_position_embeddings``
already holds the extended context. For "yarn" the base is
``original_max_position_embeddings`` (in ``rope_scaling``, else at the top level, else
``max_position_embeddings`` itself, as transformers' YaRN reads it). So a Qwen2.5 config
with the YaRN block its model card suggests (factor 4 on 32,768) reads as 131,072, as vLLM
serves it, and Llama 3.1's llama3 scaling leaves its 131,072 alone.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sim.core.catalog.dtypes import DTYPE_BYTES
from sim.core.catalog.model_spec import MlaSpec, ModelSpec, MoeSpec

# rope types whose max_position_embeddings is already the extended context (vLLM skips
# their factor)
CONTEXT_SCALED_ROPE = ("su", "longrope", "llama3")
# transformers' class defaults, which vLLM sees where config.json leaves the key out
DEFAULT_MAX_POSITIONS = {
    "llama": 2048, "qwen2": 32768, "qwen2_moe": 32768, "qwen3": 32768, "qwen3_moe": 32768,
    "mistral": 131072, "mixtral": 131072, "deepseek_v2": 2048, "deepseek_v3": 4096,
}
BIAS_BY_DEFAULT = ("qwen2", "qwen2_moe")  # q/k/v biases without an attention_bias key


class _Config:
    """A parsed config.json and the file it came from, for errors that point at a line."""

    def __init__(self, file: Path, text: str, data: dict) -> None:
        self.file, self.text = file, text
        # multimodal wrappers keep the language model's fields in text_config
        nested = data.get("text_config")
        self.data = {**nested, **data} if isinstance(nested, dict) else data

    def where(self, key: str) -> str:
        needle = f'"{key}"'
        for number, line in enumerate(self.text.splitlines(), start=1):
            if needle in line:
                return f"{self.file}, line {number}, key {key!r}"
        return f"{self.file}, key {key!r}"

    def has(self, key: str) -> bool:
        return self.data.get(key) is not None

    def get_int(self, key: str, default: int | None = None, minimum: int = 1) -> int:
        if not self.has(key):
            if default is None:
                raise ValueError(f"{self.file}: missing key {key!r} in the model config")
            return default
        value = self.data[key]
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{self.where(key)}: expected an integer, got {value!r}")
        if value < minimum:
            raise ValueError(f"{self.where(key)}: must be >= {minimum}, got {value}")
        return value

    def get_bool(self, key: str, default: bool) -> bool:
        if not self.has(key):
            return default
        value = self.data[key]
        if not isinstance(value, bool):
            raise ValueError(f"{self.where(key)}: expected true or false, got {value!r}")
        return value

    def get_str(self, key: str, default: str) -> str:
        value = self.data[key] if self.has(key) else default
        if not isinstance(value, str):
            raise ValueError(f"{self.where(key)}: expected a string, got {value!r}")
        return value


def _load(path: str | Path) -> _Config:
    file = Path(path).expanduser()
    if file.is_dir():
        file = file / "config.json"
    try:
        text = file.read_text()
    except OSError as exc:
        raise ValueError(f"cannot read model config {file}: {exc.strerror}") from exc
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{file}, line {exc.lineno}: not valid JSON: {exc.msg}") from exc
    if not isinstance(data, dict):
        raise ValueError(f"{file}: expected a JSON object")
    return _Config(file, text, data)


def model_from_hf_config(path: str | Path, name: str | None = None) -> ModelSpec:
    """Build a ModelSpec from a Hugging Face ``config.json`` (or a folder containing one);
    ``name`` defaults to the folder's (or file's) name."""
    cfg = _load(path)
    model_type = cfg.get_str("model_type", "").lower()
    hidden, heads = cfg.get_int("hidden_size"), cfg.get_int("num_attention_heads")
    if not cfg.has("head_dim") and hidden % heads and not cfg.has("kv_lora_rank"):
        raise ValueError(f"{cfg.where('num_attention_heads')}: {heads} heads do not divide "
                         f"hidden_size {hidden}, and there is no head_dim key")
    dtype_key = "torch_dtype" if cfg.has("torch_dtype") else "dtype"
    dtype_name = cfg.get_str(dtype_key, "bfloat16").lower()
    if dtype_name not in DTYPE_BYTES:
        raise ValueError(f"{cfg.where(dtype_key)}: unsupported dtype {dtype_name!r}; "
                         f"known: {sorted(DTYPE_BYTES)}")
    mla = _mla(cfg)
    head_dim = (mla.qk_nope_head_dim + mla.qk_rope_head_dim if mla is not None
                else cfg.get_int("head_dim", hidden // heads))
    file = cfg.file
    fields: dict[str, Any] = dict(
        name=name or (file.parent.name if file.name == "config.json" else file.stem),
        num_layers=cfg.get_int("num_hidden_layers"),
        hidden_size=hidden,
        intermediate_size=cfg.get_int("intermediate_size"),
        num_attention_heads=heads,
        num_kv_heads=cfg.get_int("num_key_value_heads", heads),
        head_dim=head_dim,
        vocab_size=cfg.get_int("vocab_size"),
        dtype_bytes=DTYPE_BYTES[dtype_name],
        tie_word_embeddings=cfg.get_bool("tie_word_embeddings", False),
        attention_bias=cfg.get_bool("attention_bias", model_type in BIAS_BY_DEFAULT),
        max_position_embeddings=_context(cfg, model_type),
        moe=_moe(cfg, model_type),
        mla=mla,
    )
    try:
        return ModelSpec(**fields)
    except ValueError as exc:  # shapes that disagree with one another
        raise ValueError(f"{file}: {exc}") from exc


def _context(cfg: _Config, model_type: str) -> int:
    """The context vLLM derives from the config (module docstring): the positions, scaled by
    the rope factor unless the rope type's positions are scaled already."""
    default_positions = DEFAULT_MAX_POSITIONS.get(model_type)
    if not cfg.has("max_position_embeddings") and default_positions is None:
        raise ValueError(f"{cfg.file}: missing key 'max_position_embeddings' (model_type "
                         f"{model_type!r} has no default we know)")
    positions = cfg.get_int("max_position_embeddings", default_positions)
    key = "rope_parameters" if cfg.has("rope_parameters") else "rope_scaling"
    rope = cfg.data.get(key)
    if rope is None or "gemma3" in model_type:  # Gemma 3's positions are scaled already
        return positions
    if not isinstance(rope, dict):
        raise ValueError(f"{cfg.where(key)}: expected a mapping or null, got {rope!r}")
    # transformers 5 may give one set of parameters per layer type: vLLM takes one factor
    per_layer_type = bool(rope) and all(isinstance(v, dict) for v in rope.values())
    layers = list(rope.values()) if per_layer_type else [rope]
    base, factor = positions, 1.0
    for params in layers:
        kind = params.get("rope_type", params.get("type", "default"))
        if kind in CONTEXT_SCALED_ROPE:
            continue
        factor = _rope_number(cfg, key, params, "factor", factor)
        if kind == "yarn":
            base = int(_rope_number(cfg, key, params, "original_max_position_embeddings",
                                    cfg.get_int("original_max_position_embeddings", positions)))
    return int(base * factor)


def _rope_number(cfg: _Config, key: str, params: dict, name: str, default: float) -> float:
    value = params.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise ValueError(f"{cfg.where(key)}: {name} must be a positive number, got {value!r}")
    return value


def _mla(cfg: _Config) -> MlaSpec | None:
    if not cfg.has("kv_lora_rank"):
        return None
    return MlaSpec(
        kv_lora_rank=cfg.get_int("kv_lora_rank"),
        qk_nope_head_dim=cfg.get_int("qk_nope_head_dim"),
        qk_rope_head_dim=cfg.get_int("qk_rope_head_dim"),
        v_head_dim=cfg.get_int("v_head_dim"),
        q_lora_rank=cfg.get_int("q_lora_rank") if cfg.has("q_lora_rank") else None,
    )


def _moe(cfg: _Config, model_type: str) -> MoeSpec | None:
    experts_key = next((key for key in ("num_local_experts", "num_experts", "n_routed_experts")
                        if cfg.has(key)), None)
    if experts_key is None:
        return None
    for stride_key in ("decoder_sparse_step", "moe_layer_freq"):
        if cfg.get_int(stride_key, 1) != 1:
            raise ValueError(f"{cfg.where(stride_key)}: MoE layers at a stride are not modelled")
    if cfg.data.get("mlp_only_layers"):
        raise ValueError(f"{cfg.where('mlp_only_layers')}: dense layers among the MoE layers "
                         "are not modelled")
    expert_width = (cfg.get_int("moe_intermediate_size") if cfg.has("moe_intermediate_size")
                    else cfg.get_int("intermediate_size"))
    if cfg.has("shared_expert_intermediate_size"):
        shared = cfg.get_int("shared_expert_intermediate_size", minimum=0)
    else:
        shared = cfg.get_int("n_shared_experts", 0, minimum=0) * expert_width
    try:
        return MoeSpec(
            num_experts=cfg.get_int(experts_key),
            num_experts_per_tok=cfg.get_int("num_experts_per_tok"),
            moe_intermediate_size=expert_width,
            shared_expert_intermediate_size=shared,
            shared_expert_gate=model_type == "qwen2_moe" and shared > 0,
            num_dense_layers=cfg.get_int("first_k_dense_replace", 0, minimum=0),
        )
    except ValueError as exc:
        raise ValueError(f"{cfg.where('num_experts_per_tok')}: {exc}") from exc
