"""The GPU engine refuses a configuration it would otherwise run as something else (it builds
dense bf16 Llama-family decoders); the simulator prices those configurations."""

from __future__ import annotations

import pytest


def test_gpu_engine_refuses_what_it_would_run_as_something_else():
    from gpu_backend.engine.support import check_supported
    from sim.core.catalog import get_model
    from sim.core.engine_config import EngineConfig

    check_supported(EngineConfig(model=get_model("llama-3.1-8b")))  # dense bf16: runs
    for config, words in (
        (EngineConfig(model=get_model("mixtral-8x7b")), "MoE"),
        (EngineConfig(model=get_model("llama-3.1-8b"), kv_cache_dtype="fp8"), "kv-cache-dtype"),
        (EngineConfig(model=get_model("llama-3.1-8b"), quantization="fp8"), "quantization"),
        (EngineConfig(model=get_model("llama-3.1-8b"), dtype="float32"), "float32"),
    ):
        with pytest.raises(ValueError, match=words):
            check_supported(config)
