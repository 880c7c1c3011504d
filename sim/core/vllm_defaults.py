"""vLLM v1's engine defaults that depend on the GPU, and the presets a command starts from.

`EngineConfig` (sim.core.engine_config) resolves each of these from an Optional field (None:
the rule applies), as vLLM's `EngineArgs._set_default_args` resolves them:

* max_model_len: the model's `max_position_embeddings` (vLLM's ModelConfig derives it from
  the Hugging Face config);
* max_num_batched_tokens: with chunked prefill, 8192 on GPUs of at least 70 GiB that are not
  A100s, else 2048 (the OpenAI server's usage-context defaults; vLLM keeps A100s on the small
  ones, its PR #17885); without chunked prefill max(max_model_len, 2048), as vLLM's
  SchedulerConfig does, so that any prompt fits in one step;
* max_num_seqs: 1024 on the same large GPUs, else 256, and never above
  max_num_batched_tokens (vLLM takes the smaller);
* prefix caching and chunked prefill on (vLLM v1's default for generative models).
"""

from __future__ import annotations

from sim.core.catalog import GIB, GpuSpec

DEFAULT_MODEL = "llama-3.1-8b"
DEFAULT_GPU = "h200"
# vLLM's SchedulerConfig.DEFAULT_MAX_NUM_BATCHED_TOKENS: the floor of the non-chunked default
NON_CHUNKED_MIN_BATCHED_TOKENS = 2048
_LARGE = "8192 on GPUs of >= 70 GiB other than A100, else 2048"
# The rules as a flag's help shows them (EngineConfig's default_text)
MAX_NUM_BATCHED_TOKENS_RULE = (
    f"vLLM's: {_LARGE}; without chunked prefill max(max_model_len, 2048)")
MAX_NUM_SEQS_RULE = (
    "vLLM's: 1024 on GPUs of >= 70 GiB other than A100, else 256; at most max_num_batched_tokens")


def _large_gpu(gpu: GpuSpec) -> bool:
    """vLLM's test for its larger defaults: at least 70 GiB and not an A100
    (vllm/engine/arg_utils.py, EngineArgs.get_batch_defaults)."""
    return gpu.memory_bytes >= 70 * GIB and "a100" not in gpu.name.lower()


def vllm_default_chunk(gpu: GpuSpec) -> int:
    """vLLM v1's default max_num_batched_tokens for the OpenAI server with chunked prefill."""
    return 8192 if _large_gpu(gpu) else 2048


def vllm_default_max_num_seqs(gpu: GpuSpec) -> int:
    """vLLM v1's default max_num_seqs for the OpenAI server, before the max_num_batched_tokens
    cap (`EngineConfig.num_seqs` applies it)."""
    return 1024 if _large_gpu(gpu) else 256
