"""Carry a calibration to a model or GPU that has none (docs/calibration.md).

What a calibration holds, and how each part moves:

    device rates      linear_compute, memory, kv_memory, attention_compute, attention_program,
                      interconnect: shares of the datasheet peak. The cost model multiplies
                      them by the target GPU's datasheet rates and the target model's FLOPs
                      and bytes, so they carry as they are (same kernels, similar shapes).
                      mixed_decode_compute (a share too) carries likewise, and
                      attention_query_s, per query token and layer, as it is.
    shares            the *_serial_fraction terms: dimensionless, carried as they are.
    launch terms      eager_launch_s, piecewise_launch_s, split_launch_s: host time to
                      enqueue a step's kernels, a fixed number per layer, so scaled by the
                      target's layer count over the source's. Host-bound: on another host
                      they do not carry (`host_slower` is the what-if for that).
    per-step host     step_overhead_s, per_seq_overhead_s: the engine's Python work per step
                      and per sequence, independent of the model; host-bound as above.
                      host_gap_s and decode_host_gap_s (measured, not fitted)
                      likewise.
    activation        the engine's measured activation bytes per token, scaled by the
                      analytic per-token bytes of the target over the source
                      (sim.core.memory_plan); fixed and non-torch bytes carried.
    vmm costs         driver time per handle: the same driver and GPU family carries them.
"""

from __future__ import annotations

from dataclasses import asdict, replace

from sim.core.calibration.schema import CARRIED, Calibration, parse_calibration
from sim.core.catalog import GpuSpec, ModelSpec, get_gpu, get_model
from sim.core.cost_model import HOST_TERMS
from sim.core.efficiency import GAP_TERMS
from sim.core.memory_plan import ActivationProfile, activation_bytes

LAUNCH_TERMS = ("eager_launch_s", "piecewise_launch_s", "split_launch_s")  # per layer, host
# what a host and engine set: their per-step terms and how launches overlap the device
HOST_FIELDS = (*HOST_TERMS, "launch_serial_fraction", *GAP_TERMS)
# the errors of the source's own fit: they tell how well it priced its own grid
FIT_KEYS = ("fit_error", "attention_fit_error", "fit")
# the source model's measured bytes: dropped where the model changes
MODEL_KEYS = ("activation_peaks", "weights_bytes")
# The grid's records stay: their steps say where the carried terms were measured (the
# extrapolation note, `coverage.grid_extent`) and which launches timed them (the piecewise
# note, `schema.timed_launch_kinds`). Their times are the source's, so GRID_OF names the
# model and GPU that ran them, and a refit refuses them (`records.check_fit_records`). With
# `host_from` they go: the launch terms are then the other calibration's, which the source's
# records would misreport.
GRID_OF = "grid_of"
GRID_KEYS = ("measurements", "attention_measurements")
SLOPE_TOKENS = 8192  # tokens at which the analytic activation slope is read (forward-bound)


def transfer(calibration: Calibration, model: ModelSpec | str,
             gpu: GpuSpec | str | None = None,
             host_from: Calibration | None = None) -> Calibration:
    """`calibration` carried to `model` (and `gpu`, default the calibration's): launch terms
    scaled by layer count, activation bytes per token by the models' analytic ratio, the rest
    as measured (module docstring). `host_from`: a calibration measured on the target's host
    and engine, whose host terms (HOST_TERMS, launch_serial_fraction), engine (piecewise
    sizes) and VMM costs replace the source's: the device terms alone are carried. Its
    provenance keeps the measurement's and says where it came from."""
    source = calibration.provenance
    if source.model is None:
        raise ValueError(f"{calibration.source}: its model is not recorded; a transfer scales "
                         "from the model it was measured on")
    before = get_model(source.model)
    after = model if isinstance(model, ModelSpec) else get_model(model)
    target_gpu = gpu if isinstance(gpu, GpuSpec) else get_gpu(gpu or source.gpu_preset or "")
    eff = calibration.efficiency
    layers = after.num_layers / before.num_layers
    efficiency = replace(eff, **{name: getattr(eff, name) * layers for name in LAUNCH_TERMS
                                 if getattr(eff, name) is not None})
    dropped = (FIT_KEYS + (MODEL_KEYS if after.name != before.name else ())
               + (GRID_KEYS + (GRID_OF,) if host_from is not None else ()))
    data = {key: value for key, value in calibration.data.items() if key not in dropped}
    if data.get("measurements") and GRID_OF not in data:
        data[GRID_OF] = {"model": before.name, "gpu_preset": source.gpu_preset}
    note = (f"transferred from {source.model}"
            + (f" on {source.gpu_preset}" if target_gpu.name != source.gpu_preset else "")
            + f" ({calibration.source})")
    provenance = replace(source, model=after.name, gpu_preset=target_gpu.name, derived_from=note)
    if host_from is not None:
        efficiency = replace(efficiency, **{name: getattr(host_from.efficiency, name)
                                            for name in HOST_FIELDS})
        data.update(piecewise_sizes=list(host_from.piecewise_sizes) or None,
                    vmm=host_from.data.get("vmm"))
        provenance = replace(provenance, engine=host_from.engine,
                             derived_from=f"{note}; host terms from {host_from.source}")
    data.update(model=after.name, gpu_preset=target_gpu.name, efficiency=asdict(efficiency),
                provenance=provenance.to_dict())
    if calibration.activation is not None:
        data["activation"] = asdict(scaled_activation(calibration.activation, before, after))
    moved = f" on {target_gpu.name}" if target_gpu.name != source.gpu_preset else ""
    return parse_calibration(data, f"{calibration.source}{CARRIED}{after.name}{moved}")


def scaled_activation(profile: ActivationProfile, before: ModelSpec,
                      after: ModelSpec) -> ActivationProfile:
    """`profile` measured on `before`, its bytes per token scaled to `after` by the analytic
    forward's bytes per token (the MLP intermediate dominates both)."""
    def slope(model: ModelSpec) -> float:
        return (activation_bytes(model, 2 * SLOPE_TOKENS)
                - activation_bytes(model, SLOPE_TOKENS)) / SLOPE_TOKENS

    return replace(profile, bytes_per_token=profile.bytes_per_token * slope(after) / slope(before))

