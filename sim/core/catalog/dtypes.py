"""Serving precision: the model dtype, the KV cache dtype and weight quantization, named as
vLLM's ``--dtype``, ``--kv-cache-dtype`` and ``--quantization`` name them."""

from __future__ import annotations

from dataclasses import replace

from sim.core.catalog.model_spec import ModelSpec

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
DTYPES = ("auto", "bfloat16", "float16", "float32")  # auto: the config's torch_dtype
# auto: as the model dtype; vLLM's fp8 variants all store one byte per element
KV_CACHE_DTYPE_BYTES: dict[str, int | None] = {
    "auto": None, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1,
}
QUANTIZATION_BYTES: dict[str, int] = {"fp8": 1}  # bytes per linear weight


def apply_dtypes(model: ModelSpec, *, dtype: str = "auto", kv_cache_dtype: str = "auto",
                 quantization: str | None = None) -> ModelSpec:
    """The same model served at ``dtype`` (auto: as configured), with its KV cache in
    ``kv_cache_dtype`` (auto: as dtype; fp8: one byte) and its linear weights quantized by
    ``quantization`` (None, or fp8: one byte; embeddings, norms and routers keep dtype)."""
    key = dtype.strip().lower()
    if key != "auto" and key not in DTYPE_BYTES:
        raise ValueError(f"unknown dtype {dtype!r}; known: {', '.join(DTYPES)}")
    kv_key = kv_cache_dtype.strip().lower()
    if kv_key not in KV_CACHE_DTYPE_BYTES:
        raise ValueError(f"unknown kv_cache_dtype {kv_cache_dtype!r}; known: "
                         f"{', '.join(KV_CACHE_DTYPE_BYTES)}")
    quant_key = None if quantization is None else quantization.strip().lower()
    if quant_key is not None and quant_key not in QUANTIZATION_BYTES:
        raise ValueError(f"unknown quantization {quantization!r}; known: None (unquantized), "
                         f"{', '.join(QUANTIZATION_BYTES)}")
    return replace(
        model,
        dtype_bytes=model.dtype_bytes if key == "auto" else DTYPE_BYTES[key],
        kv_dtype_bytes=KV_CACHE_DTYPE_BYTES[kv_key],
        linear_dtype_bytes=None if quant_key is None else QUANTIZATION_BYTES[quant_key],
    )


def with_dtype(model: ModelSpec, dtype: str) -> ModelSpec:
    """The same model with weights and KV cache in ``dtype`` (bf16, fp16 or fp32)."""
    key = dtype.strip().lower()
    if key not in DTYPE_BYTES:
        raise ValueError(f"unknown dtype {dtype!r}; known: {', '.join(sorted(DTYPE_BYTES))}")
    return replace(model, dtype_bytes=DTYPE_BYTES[key])
