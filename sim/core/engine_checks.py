"""The checks `EngineConfig.__post_init__` runs: what vLLM's EngineArgs refuses, and values out
of range, each refused with a message that names the flag and says what to change.

Two kinds of refusal. A value out of range (a TP degree of 0, a memory share above 1, a block
size vLLM does not offer) raises `SettingRangeError`: no model could run it, so a sweep stops
on it before its first case. A value one model cannot run (a max_model_len past its context)
or a pair vLLM refuses together raises a plain ValueError: in a sweep, that case's row.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from sim.core.memory_plan import BLOCK_SIZES
from sim.core.settings import setting_of
from sim.core.split_shapes import ATTENTION_BACKENDS

RECLAIM_MODES = ("remap", "release")
_INTS = ("tensor_parallel_size", "max_num_batched_tokens", "max_num_seqs", "max_model_len",
         "block_size", "vmm_handle_bytes", "hash_block_tokens", "mixed_split_bytes")


class SettingRangeError(ValueError):
    """A setting out of the range every configuration must keep, whatever its model: `setting`
    (the EngineConfig field) given `value` (as its flag `flag` shows it), and `advice`, what to
    give instead. Its text is `--flag value: advice`; `at` says it of a YAML key instead."""

    def __init__(self, setting: str, flag: str, value: str, advice: str) -> None:
        super().__init__(f"{flag} {value}: {advice}")
        self.setting, self.flag, self.value, self.advice = setting, flag, value, advice

    def __reduce__(self) -> tuple:
        return type(self), (self.setting, self.flag, self.value, self.advice)

    def at(self, where: str) -> str:
        """The refusal said of `where` (a file's key, an argparse flag)."""
        return f"{where}: {self.advice}, got {self.value}"


def check_config(config: Any) -> None:
    """Raise ValueError for the first setting of `config` (an EngineConfig) that vLLM or the
    engine would refuse. The range checks (SettingRangeError) come first, so a configuration
    refused for another reason holds no value out of range."""
    for name in _INTS:
        value = getattr(config, name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise _out_of_range(config, name, repr(value), "give an integer")
    _check_ranges(config)
    _check_sizes(config)
    _check_context(config)
    _check_vllm_rules(config)


def _out_of_range(config: Any, name: str, value: object, advice: str) -> SettingRangeError:
    """The refusal of setting `name`, named by its flag (the field's name where it has none)."""
    setting = setting_of(next(f for f in fields(config) if f.name == name))
    return SettingRangeError(name, setting.flag if setting.flags else name, str(value), advice)


def _at_least_one(config: Any, name: str, what: str, default: str = "") -> None:
    value = getattr(config, name)
    if value is not None and value < 1:
        raise _out_of_range(config, name, value, f"give 1 or more {what}{default}")


def _check_ranges(config: Any) -> None:
    left_out = ", or leave it out for vLLM's default"
    _at_least_one(config, "tensor_parallel_size", "GPUs")
    _at_least_one(config, "max_num_batched_tokens", "tokens", left_out)
    _at_least_one(config, "max_num_seqs", "sequences", left_out)
    _at_least_one(config, "max_model_len", "tokens", ", or leave it out for the model's own")
    if not 0.0 < config.gpu_memory_utilization <= 1.0:
        raise _out_of_range(config, "gpu_memory_utilization", config.gpu_memory_utilization,
                            "give a share of the GPU's memory above 0 and at most 1 (vLLM's "
                            "default 0.9)")
    if config.block_size not in BLOCK_SIZES:
        raise _out_of_range(config, "block_size", config.block_size,
                            f"give one of {', '.join(map(str, BLOCK_SIZES))} (vLLM's choices)")
    _check_handle_size(config)
    if config.mixed_split_bytes < 0:
        raise _out_of_range(config, "mixed_split_bytes", f"{config.mixed_split_bytes / 2**20:g}",
                            "give 0 (never) or more MiB")
    if config.reclaim not in RECLAIM_MODES:
        raise _out_of_range(config, "reclaim", repr(config.reclaim),
                            f"give one of {', '.join(RECLAIM_MODES)}")
    if config.attention_backend not in ATTENTION_BACKENDS:
        raise _out_of_range(config, "attention_backend", repr(config.attention_backend),
                            f"give one of {', '.join(ATTENTION_BACKENDS)}")
    if config.hash_block_tokens < 1 or config.hash_block_tokens % config.block_size:
        raise _out_of_range(config, "hash_block_tokens", config.hash_block_tokens,
                            f"give a positive multiple of --block-size {config.block_size}")


def _check_handle_size(config: Any) -> None:
    """The elastic reserve's handles are cut at the GPU's VMM granularity, 2 MiB on every GPU
    of the catalog; a GPU spec file may give a larger multiple of 2 MiB, so a handle size
    valid on one GPU can be refused on another. It is refused as out of range all the same:
    the handle size is one setting a sweep holds for every GPU of its grid, and a size some
    grid GPU cannot cut is a sweep to fix, not a row of that GPU's."""
    granularity = config.gpu.vmm_granularity_bytes
    if config.vmm_handle_bytes < granularity or config.vmm_handle_bytes % granularity:
        raise _out_of_range(config, "vmm_handle_bytes", f"{config.vmm_handle_bytes / 2**20:g}",
                            f"give a positive multiple of the {config.gpu.name} VMM "
                            f"granularity ({granularity // 2**20} MiB)")


def _check_sizes(config: Any) -> None:
    for name in ("cuda_graph_sizes", "piecewise_graph_sizes"):
        sizes = getattr(config, name)
        if not isinstance(sizes, tuple) or not all(
                isinstance(s, int) and not isinstance(s, bool) and s >= 1 for s in sizes):
            shown = ",".join(map(str, sizes)) if isinstance(sizes, tuple) else repr(sizes)
            raise _out_of_range(config, name, shown, "give sizes of 1 or more (or none)")


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
