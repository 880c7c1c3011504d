"""What the GPU engine can run, checked before anything touches a GPU (no torch here): the
command line refuses a configuration with the same words the engine builders would."""

from __future__ import annotations

from sim.core.engine_config import EngineConfig


def check_supported(config: EngineConfig) -> None:
    """Refuse, with what to change, a configuration this engine would otherwise run as
    something else: it builds dense Llama-family decoders (no MoE or MLA layers) in bf16, with
    bf16 weights and a bf16 KV cache. The simulator prices all of these; only the GPU engine,
    which measures them, is narrower."""
    model = config.model
    unsupported = [what for what, present in (
        ("MoE layers", model.moe is not None), ("MLA attention", model.mla is not None),
        (f"dtype {config.dtype}", config.dtype not in ("auto", "bfloat16", "bf16")),
        (f"--kv-cache-dtype {config.kv_cache_dtype}", model.kv_element_bytes != 2),
        (f"--quantization {config.quantization}", model.linear_element_bytes != 2),
    ) if present]
    if model.dtype_bytes != 2 and not unsupported:
        unsupported.append(f"{model.dtype_bytes}-byte weights")
    if unsupported:
        raise ValueError(f"the GPU engine runs dense bf16 models only; {model.name} here has "
                         f"{', '.join(unsupported)}: replay another model or drop those flags "
                         "(the simulator, `python -m sim`, prices it)")


def missing_gpu() -> str | None:
    """Why this host cannot run the engine (no torch, a torch without CUDA, no driver or no
    device), or None when it can."""
    try:
        import torch
    except ModuleNotFoundError:
        return "torch is not installed here (pip install -e '.[gpu]')"
    if torch.version.cuda is None:
        return f"this torch ({torch.__version__}) is built without CUDA"
    if not torch.cuda.is_available():
        return "no CUDA device or NVIDIA driver is visible on this host"
    return None
