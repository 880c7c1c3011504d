"""GPU and model presets: the static shapes every memory and cost model starts from.

Presets follow gpt-fast's ``from_name`` style: dicts of named, frozen specs, looked up
case-insensitively. A model can also be read from a Hugging Face ``config.json`` or found by
its repo id; a GPU from a YAML or JSON spec file.

* ``model_spec``: ModelSpec (with MoeSpec, MlaSpec) and its parameter, byte and FLOP counts;
* ``models``: model presets and ``get_model``; ``hf_config``: config.json parsing;
* ``dtypes``: serving precision (``apply_dtypes``); ``gpus``: GPU presets and ``get_gpu``.
"""

from sim.core.catalog.dtypes import (
    DTYPE_BYTES,
    DTYPES,
    KV_CACHE_DTYPE_BYTES,
    QUANTIZATION_BYTES,
    apply_dtypes,
    with_dtype,
)
from sim.core.catalog.gpus import GPU_ALIASES, GPUS, GpuSpec, get_gpu, gpu_from_file
from sim.core.catalog.hf_config import model_from_hf_config
from sim.core.catalog.model_spec import VOCAB_PADDING_SIZE, MlaSpec, ModelSpec, MoeSpec
from sim.core.catalog.models import MODEL_ALIASES, MODELS, get_model, hf_cache_config
from sim.core.catalog.units import GIB, MIB

__all__ = [
    "DTYPES", "DTYPE_BYTES", "GIB", "GPUS", "GPU_ALIASES", "KV_CACHE_DTYPE_BYTES", "MIB",
    "MODELS", "MODEL_ALIASES", "QUANTIZATION_BYTES", "VOCAB_PADDING_SIZE", "GpuSpec",
    "MlaSpec", "ModelSpec", "MoeSpec", "apply_dtypes", "get_gpu", "get_model", "gpu_from_file",
    "hf_cache_config", "model_from_hf_config", "with_dtype",
]
