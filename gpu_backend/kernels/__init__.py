"""Triton kernels for the paged KV cache, with float32 PyTorch references.

    store_kvcache    scatter new K/V rows into cache slots
    paged_attention  varlen causal attention (decode, prefill chunks, mixed batches)
"""

from gpu_backend.kernels.attention import paged_attention
from gpu_backend.kernels.kv_store import store_kvcache
from gpu_backend.kernels.reference import paged_attention_ref, store_kvcache_ref

__all__ = ["paged_attention", "paged_attention_ref", "store_kvcache", "store_kvcache_ref"]
