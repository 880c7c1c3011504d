"""Triton kernels for the paged KV cache, with float32 PyTorch references.

    store_kvcache    scatter new K/V rows into cache slots
    paged_attention  varlen causal attention (decode, prefill chunks, mixed batches)
    add_rms_norm, rotary_store_kv, silu_and_mul
                     the layer's elementwise groups, one launch each (fused.py)
"""

from gpu_backend.kernels.attention import paged_attention
from gpu_backend.kernels.fused import add_rms_norm, rotary_store_kv, silu_and_mul
from gpu_backend.kernels.kv_store import store_kvcache
from gpu_backend.kernels.reference import paged_attention_ref, store_kvcache_ref

__all__ = ["add_rms_norm", "paged_attention", "paged_attention_ref", "rotary_store_kv",
           "silu_and_mul", "store_kvcache", "store_kvcache_ref"]
