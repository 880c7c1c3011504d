"""The checks `EngineConfig.__post_init__` runs: what vLLM's EngineArgs refuses, and values out
of range, each refused with a message that names the flag and says what to change."""

from __future__ import annotations

from typing import Any

from sim.core.memory_plan import BLOCK_SIZES
from sim.core.split_shapes import ATTENTION_BACKENDS

RECLAIM_MODES = ("remap", "release")
_INTS = ("tensor_parallel_size", "max_num_batched_tokens", "max_num_seqs", "max_model_len",
         "block_size", "vmm_handle_bytes", "hash_block_tokens", "mixed_split_bytes")


def check_config(config: Any) -> None:
    """Raise ValueError for the first setting of `config` (an EngineConfig) that vLLM or the
    engine would refuse."""
    for name in _INTS:
        value = getattr(config, name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise ValueError(f"{name} must be an integer, got {value!r}")
    _check_ranges(config)
    _check_sizes(config)
    _check_context(config)
    _check_vllm_rules(config)


def _at_least_one(name: str, value: int | None, what: str, default: str = "") -> None:
    if value is not None and value < 1:
        raise ValueError(f"{_flag(name)} {value}: give 1 or more {what}{default}")


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _check_ranges(config: Any) -> None:
    left_out = ", or leave it out for vLLM's default"
    _at_least_one("tensor_parallel_size", config.tensor_parallel_size, "GPUs")
    _at_least_one("max_num_batched_tokens", config.max_num_batched_tokens, "tokens", left_out)
    _at_least_one("max_num_seqs", config.max_num_seqs, "sequences", left_out)
    _at_least_one("max_model_len", config.max_model_len, "tokens",
                  ", or leave it out for the model's own")
    if not 0.0 < config.gpu_memory_utilization <= 1.0:
        raise ValueError(f"--gpu-memory-utilization {config.gpu_memory_utilization}: give a "
                         "share of the GPU's memory above 0 and at most 1 (vLLM's default 0.9)")
    if config.block_size not in BLOCK_SIZES:
        raise ValueError(f"--block-size {config.block_size}: give one of "
                         f"{', '.join(map(str, BLOCK_SIZES))} (vLLM's choices)")
    granularity = config.gpu.vmm_granularity_bytes
    if config.vmm_handle_bytes < granularity or config.vmm_handle_bytes % granularity:
        raise ValueError(f"--vmm-handle-mib {config.vmm_handle_bytes / 2**20:g}: give a "
                         f"positive multiple of the {config.gpu.name} VMM granularity "
                         f"({granularity // 2**20} MiB)")
    if config.mixed_split_bytes < 0:
        raise ValueError(f"--mixed-split-mib {config.mixed_split_bytes / 2**20:g}: give 0 "
                         "(never) or more MiB")
    if config.reclaim not in RECLAIM_MODES:
        raise ValueError(f"--reclaim {config.reclaim!r}: give one of {', '.join(RECLAIM_MODES)}")
    if config.attention_backend not in ATTENTION_BACKENDS:
        raise ValueError(f"--attention-backend {config.attention_backend!r}: give one of "
                         f"{', '.join(ATTENTION_BACKENDS)}")
    if config.hash_block_tokens < 1 or config.hash_block_tokens % config.block_size:
        raise ValueError(f"--hash-block-tokens {config.hash_block_tokens}: give a positive "
                         f"multiple of --block-size {config.block_size}")


def _check_sizes(config: Any) -> None:
    for name in ("cuda_graph_sizes", "piecewise_graph_sizes"):
        sizes = getattr(config, name)
        if not isinstance(sizes, tuple) or not all(
                isinstance(s, int) and not isinstance(s, bool) and s >= 1 for s in sizes):
            raise ValueError(f"{name} {sizes!r}: give a tuple of positive sizes (or ())")


def _check_context(config: Any) -> None:
    """vLLM's ModelConfig refuses a max_model_len past the model's derived maximum (its
    `_get_and_verify_max_len`) unless VLLM_ALLOW_LONG_MAX_MODEL_LEN=1: a RoPE model gives nan
    at positions it was not trained for, an absolute-position one reads out of bounds. The
    engine here would run such requests without complaint, so the refusal is vLLM's."""
    context = config.model.max_position_embeddings
    if (config.max_model_len is None or config.max_model_len <= context
            or config.allow_long_max_model_len):
        return
    raise ValueError(
        f"--max-model-len {config.max_model_len} is longer than {config.model.name}'s context "
        f"(max_position_embeddings {context}), which vLLM refuses: positions past it were "
        f"never trained (RoPE models give nan there); give --max-model-len {context} or less, "
        "leave it out for the model's own, or pass --allow-long-max-model-len to run it "
        "anyway (vLLM's VLLM_ALLOW_LONG_MAX_MODEL_LEN=1)")


def _check_vllm_rules(config: Any) -> None:
    """vLLM's SchedulerConfig.verify_max_model_len, on the resolved values."""
    chunk, seqs = config.chunk_tokens, config.num_seqs
    if chunk < seqs:
        raise ValueError(f"max_num_batched_tokens ({chunk}) must be at least max_num_seqs "
                         f"({seqs}), as vLLM requires: raise --max-num-batched-tokens or lower "
                         "--max-num-seqs")
    max_len = config.effective_max_model_len
    if not config.enable_chunked_prefill and chunk < max_len:
        raise ValueError(f"max_num_batched_tokens ({chunk}) is smaller than max_model_len "
                         f"({max_len}) without chunked prefill, so longer prompts could never "
                         "run (vLLM refuses it): raise --max-num-batched-tokens, lower "
                         "--max-model-len, or drop --no-enable-chunked-prefill")
