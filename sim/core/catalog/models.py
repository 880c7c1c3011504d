"""Model presets, and ``get_model``: a preset, a config.json, or a Hugging Face repo id.

Shapes are copied from each model's config.json on the Hugging Face Hub (num_hidden_layers,
hidden_size, intermediate_size, num_attention_heads, num_key_value_heads, head_dim or
hidden/heads, vocab_size, tie_word_embeddings, max_position_embeddings; the MoE and MLA keys).
All bf16. Where a base and an instruct model differ, the preset is the instruct model (the
one served): Qwen2.5-7B-Instruct's context is 32,768, the base model's 131,072.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from sim.core.catalog.hf_config import model_from_hf_config
from sim.core.catalog.model_spec import MlaSpec, ModelSpec, MoeSpec

_QWEN: dict[str, Any] = {"attention_bias": True, "max_position_embeddings": 32768}
_QWEN_SMALL: dict[str, Any] = {**_QWEN, "tie_word_embeddings": True}
MODELS: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in (
        ModelSpec("llama-3.2-1b", 16, 2048, 8192, 32, 8, 64, 128256, tie_word_embeddings=True,
                  max_position_embeddings=131072),
        ModelSpec("llama-3.2-3b", 28, 3072, 8192, 24, 8, 128, 128256, tie_word_embeddings=True,
                  max_position_embeddings=131072),
        ModelSpec("llama-3.1-8b", 32, 4096, 14336, 32, 8, 128, 128256,
                  max_position_embeddings=131072),
        ModelSpec("llama-3.1-70b", 80, 8192, 28672, 64, 8, 128, 128256,
                  max_position_embeddings=131072),
        ModelSpec("qwen2.5-0.5b", 24, 896, 4864, 14, 2, 64, 151936, **_QWEN_SMALL),
        ModelSpec("qwen2.5-1.5b", 28, 1536, 8960, 12, 2, 128, 151936, **_QWEN_SMALL),
        ModelSpec("qwen2.5-7b", 28, 3584, 18944, 28, 4, 128, 152064, **_QWEN),
        ModelSpec("qwen2.5-14b", 48, 5120, 13824, 40, 8, 128, 152064, **_QWEN),
        ModelSpec("qwen2.5-32b", 64, 5120, 27648, 40, 8, 128, 152064, **_QWEN),
        ModelSpec("qwen2.5-72b", 80, 8192, 29568, 64, 8, 128, 152064, **_QWEN),
        ModelSpec("mistral-7b", 32, 4096, 14336, 32, 8, 128, 32768,  # v0.3
                  max_position_embeddings=32768),
        # mistralai/Mixtral-8x7B-v0.1: 8 experts of 14,336, top 2
        ModelSpec("mixtral-8x7b", 32, 4096, 14336, 32, 8, 128, 32000,
                  max_position_embeddings=32768, moe=MoeSpec(8, 2, 14336)),
        # Qwen/Qwen1.5-MoE-A2.7B: 60 experts of 1,408, top 4, a gated shared expert of 5,632
        ModelSpec("qwen1.5-moe-a2.7b", 24, 2048, 5632, 16, 16, 128, 151936, **_QWEN,
                  moe=MoeSpec(60, 4, 1408, shared_expert_intermediate_size=5632,
                              shared_expert_gate=True)),
        # Qwen/Qwen3-30B-A3B: 128 experts of 768, top 8, no shared expert, no biases
        ModelSpec("qwen3-30b-a3b", 48, 2048, 6144, 32, 4, 128, 151936,
                  max_position_embeddings=40960, moe=MoeSpec(128, 8, 768)),
        # deepseek-ai/DeepSeek-V2-Lite: MLA (latent 512 + rope 64), 64 experts of 1,408, top 6,
        # 2 shared experts, layer 0 dense (10,944)
        ModelSpec("deepseek-v2-lite", 27, 2048, 10944, 16, 16, 192, 102400,
                  max_position_embeddings=163840,
                  moe=MoeSpec(64, 6, 1408, shared_expert_intermediate_size=2 * 1408,
                              num_dense_layers=1),
                  mla=MlaSpec(kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64,
                              v_head_dim=128)),
    )
}
MODEL_ALIASES: dict[str, str] = {
    "mistral-7b-v0.3": "mistral-7b",
    "mixtral-8x7b-v0.1": "mixtral-8x7b",
}
# words a Hugging Face repo name adds to a preset's name
_REPO_NAME_NOISE = re.compile(r"^meta-|-(instruct|chat|base|hf)(?=-|$)")


def get_model(name_or_path_or_repo_id: str | Path) -> ModelSpec:
    """A preset by name (case-insensitive); a config.json (file or folder); or a Hugging Face
    repo id such as ``meta-llama/Llama-3.1-8B-Instruct``, read from the local Hugging Face
    cache when it holds the config, else the matching preset."""
    text = str(name_or_path_or_repo_id).strip()
    path = Path(text).expanduser()
    if path.is_dir() or path.is_file() or text.lower().endswith(".json"):
        return model_from_hf_config(path)  # a missing .json file: "cannot read" names it
    key = text.lower()
    key = MODEL_ALIASES.get(key, key)
    if key in MODELS:
        return MODELS[key]
    if text.count("/") == 1 and not text.startswith((".", "/", "~")):
        return _from_repo_id(text)
    raise ValueError(f"unknown model {text!r}; known: {_known()}; or give a config.json path "
                     "or a Hugging Face repo id (org/name)")


def _known() -> str:
    return ", ".join(sorted(MODELS) + sorted(MODEL_ALIASES))


def hf_cache_config(repo_id: str) -> Path | None:
    """The cached config.json of ``repo_id`` (the snapshot refs/main names, else the newest),
    under $HF_HUB_CACHE, $HF_HOME/hub or ~/.cache/huggingface/hub; None if not cached."""
    hub = os.environ.get("HF_HUB_CACHE") or os.path.join(
        os.environ.get("HF_HOME") or os.path.expanduser("~/.cache/huggingface"), "hub")
    repo = Path(hub) / ("models--" + repo_id.replace("/", "--"))
    main = repo / "refs" / "main"
    if main.is_file():
        pinned = repo / "snapshots" / main.read_text().strip() / "config.json"
        if pinned.is_file():
            return pinned
    cached = sorted(repo.glob("snapshots/*/config.json"), key=lambda p: p.stat().st_mtime)
    return cached[-1] if cached else None


def _from_repo_id(repo_id: str) -> ModelSpec:
    cached = hf_cache_config(repo_id)
    if cached is not None:
        return model_from_hf_config(cached, name=repo_id)
    preset = _REPO_NAME_NOISE.sub("", repo_id.split("/")[1].lower())
    preset = MODEL_ALIASES.get(preset, preset)
    if preset in MODELS:
        return MODELS[preset]
    raise ValueError(
        f"model {repo_id!r} is not in the local Hugging Face cache and matches no preset; "
        f"download its config (huggingface-cli download {repo_id} config.json), give a "
        f"config.json path, or use a preset: {_known()}"
    )
