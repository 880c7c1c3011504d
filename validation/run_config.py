"""The EngineConfig a GPU run ran, so that its simulation runs the same one: the replay's
config.json as it is, or, for a replay written before config.json, one rebuilt from its
summary's columns and the capture sizes it measured."""

from __future__ import annotations

from sim.core.catalog import GPUS, get_gpu, get_model
from sim.core.elastic import DrainStrategy, Policy
from sim.core.engine_config import EngineConfig

# The EngineConfig a replay ran (gpu_backend.engine.replay.CONFIG_FILE), and the summary key
# load_summary keeps it under.
CONFIG_FILE = "config.json"
ENGINE_CONFIG_KEY = "engine_config"


def engine_config(summary: dict, gpu_name: str | None = None) -> EngineConfig:
    """The EngineConfig a GPU run used: its config.json (which `load_summary` puts in the
    summary under ENGINE_CONFIG_KEY), else, for a replay written before config.json, one
    rebuilt from its summary's columns (`legacy_config`). `gpu_name` (a preset or a device
    name) replaces its GPU."""
    saved = summary.get(ENGINE_CONFIG_KEY)
    config = (EngineConfig.from_dict(saved, CONFIG_FILE) if saved is not None
              else legacy_config(summary))
    return config if gpu_name is None else config.with_(gpu=_gpu(gpu_name))


# The defaults a replay written before config.json ran under where its summary has no value:
# max_model_len 32,768 (the memory plan's then), prefix caching off, the preempt drain.
LEGACY_DEFAULTS = {"max_model_len": 32768, "enable_prefix_caching": False, "drain": "preempt",
                   "gpu": "h200", "tensor_parallel_size": 1, "gpu_memory_utilization": 0.9,
                   "block_size": 16, "policy": "static", "vmm_handle_bytes": 512 * 1024**2}


def legacy_config(summary: dict) -> EngineConfig:
    """The configuration of a replay without config.json, from its summary's columns (the
    graph sizes from what it measured), with LEGACY_DEFAULTS where a column is missing."""
    def get(key: str, convert=str):
        value = summary.get(key)
        value = LEGACY_DEFAULTS.get(key) if value is None else value
        if value is None:
            raise ValueError(f"it has no {key!r}")
        try:
            return convert(value)
        except (TypeError, ValueError):
            kind = {int: "an integer", float: "a number"}.get(convert, convert.__name__)
            raise ValueError(f"field {key} is {value!r}, not {kind}") from None

    return EngineConfig(
        model=get_model(get("model")), gpu=_gpu(get("gpu")),
        tensor_parallel_size=get("tensor_parallel_size", int),
        max_num_batched_tokens=get("chunk", int), max_num_seqs=summary.get("max_num_seqs"),
        gpu_memory_utilization=get("gpu_memory_utilization", float),
        max_model_len=get("max_model_len", int), block_size=get("block_size", int),
        policy=Policy.parse(get("policy")), drain=DrainStrategy.parse(get("drain")),
        vmm_handle_bytes=get("vmm_handle_bytes", int),
        reclaim=str(summary.get("reclaim") or _default_reclaim(summary)),
        enable_prefix_caching=get("enable_prefix_caching", bool),
        cuda_graph_sizes=measured_sizes(summary, "graph_sizes"),
        piecewise_graph_sizes=measured_sizes(summary, "piecewise_sizes"),
        # what the engine ran before config.json, whatever the defaults are now
        attention_backend="triton", async_scheduling=False, mixed_split_bytes=0,
    )


# What the capture sizes a replay records under "measured" count.
MEASURED_SIZES = {"graph_sizes": "batch sizes (decode graphs)",
                  "piecewise_sizes": "token counts (piecewise prefill graphs)"}


def measured_sizes(summary: dict, key: str, source: object = "summary.json") -> tuple[int, ...]:
    """The capture sizes a gpu_backend replay recorded as measured.`key` (a MEASURED_SIZES
    key), ascending; () when absent or null (nothing padded). `source` names the file in
    errors."""
    measured = summary.get("measured")
    sizes = measured.get(key) if isinstance(measured, dict) else None
    return _sizes(sizes, source, f"measured.{key}", MEASURED_SIZES[key])


def _sizes(sizes: object, source: object, field: str, what: str) -> tuple[int, ...]:
    if sizes is None:
        return ()
    if not isinstance(sizes, list) or not all(isinstance(s, int) and not isinstance(s, bool)
                                              and s > 0 for s in sizes):
        raise ValueError(f"{source}: {field} is {sizes!r}; expected null or a list of positive "
                         f"{what}, as `python -m gpu_backend` writes it")
    return tuple(sorted(sizes))


def _default_reclaim(summary: dict) -> str:
    """What a summary without a reclaim column ran: gpu_backend replays release the
    reserve's handles; the simulator then remapped them."""
    return "release" if summary.get("executor") == "gpu" else "remap"


def _gpu(name: str):
    """A GPU preset from a preset name or a device name such as 'NVIDIA H200'."""
    try:
        return get_gpu(name)
    except ValueError:
        lowered = name.lower().replace(" ", "-")
        for preset in sorted(GPUS, key=len, reverse=True):
            if preset.split("-")[0] in lowered:
                return GPUS[preset]
        raise
