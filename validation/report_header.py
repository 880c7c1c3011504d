"""report.md's header: what was compared (model, GPU, trace slice), where the cost model's
figures came from, what the replays ran on and how fast their host was, so that a reader can
tell which measurement an error belongs to before reading any table."""

from __future__ import annotations

from collections.abc import Sequence

from sim.core.calibration.coverage import StepExtent
from validation.pipeline import Validation
from validation.report_format import nonempty

# the engine's kernels a replay records (gpu_backend.engine.replay.kernel_flags) that the cost
# model's prices assume: each turned off by an environment switch for an A/B or a fallback
KERNELS = {"fused_layers": "the fused norm, rotary and activation kernels (GPU_BACKEND_FUSED=0)",
           "decode_split_plan": "the decode split plan (GPU_BACKEND_DECODE_PLAN=0)"}


def header_lines(v: Validation, notes: Sequence[str] = ()) -> list[str]:
    """The title, the compared configuration, the environment, `notes` (where the replays came
    from) and the host's speed."""
    first = v.runs[0]
    ts = first.trace_slice
    return ["# Simulator vs GPU: validation report", "",
            f"Model {first.sim.summary['model']} on {first.sim.summary['gpu']}, TP "
            f"{first.sim.summary['tensor_parallel_size']}; trace {ts.trace} (limit {ts.limit}, "
            f"window {ts.window_s}, rate x{ts.rate_scale:g}); cost model efficiencies: "
            f"{v.calibration_source}; elastic transition costs: {vmm_source(v)}.", "",
            environment_line(v), "", *(line for note in notes for line in (note, "")),
            *nonempty(host_speed_line(
                v.profile_host_probe, [(r.label, r.gpu.summary) for r in v.runs])),
            *nonempty(grid_line(v))]


def grid_line(v: Validation) -> str:
    """The runs whose simulated steps went past the calibration's grid, with how far: those
    steps' prices carry the fitted rates beyond what the profile timed ("" where none did)."""
    if v.grid_extent is None:
        return ""
    rows = []
    for r in v.runs:
        run = StepExtent.from_dict(r.sim.summary.get("step_extent"))
        past = run.past(v.grid_extent) if run is not None else []
        if past:
            rows.append(f"- {r.label}: {'; '.join(past)}")
    return ("Steps past the calibration's grid, priced by carrying its fitted rates beyond what "
            "its profile timed:\n" + "\n".join(rows)) if rows else ""


def vmm_source(v: Validation) -> str:
    c = v.vmm_costs
    if c is None:
        return "the simulator's H200 driver figures"
    cache = (f" + {c.attach_cache_gib_s * 1e3:.2f} ms per GiB of cached activations"
             if c.attach_cache_gib_s else "")
    return (f"measured on the engine (attach {c.attach_fixed_s * 1e3:.2f} ms + "
            f"{c.attach_handle_s * 1e3:.3f} ms/handle{cache}, detach "
            f"{c.detach_fixed_s * 1e3:.2f} ms + {c.detach_handle_s * 1e3:.3f} ms/handle)")


def environment_line(v: Validation) -> str:
    """GPU, driver and library versions: the replays' own, else the calibration's."""
    measured = v.runs[0].gpu.summary.get("measured", {})
    gpu = measured.get("gpu_name") or "GPU not recorded"
    if measured.get("versions"):
        versions, source = measured["versions"], "recorded by the replays"
    elif v.calibration_versions:
        versions, source = v.calibration_versions, "of the calibration's profile run"
    else:
        return f"Measured on {gpu}; driver and library versions not recorded."
    listed = ", ".join(f"{k} {val}" for k, val in versions.items() if val)
    return f"Measured on {gpu}; {listed} ({source}).{_kernels_off(v)}"


def _kernels_off(v: Validation) -> str:
    """A warning naming the runs that replayed without a kernel the cost model assumes ("" when
    every run had them all, or recorded none): without the split plan a decode step of long
    rows lasts its longest row, which the model does not price (on Mooncake replays of
    Llama-3.1-8B and Llama-3.2-3B without the fused kernels and the split plan, TPOT p50 was
    29-35% off)."""
    off: dict[str, list[str]] = {}
    for run in v.runs:
        flags = run.gpu.summary.get("measured", {}).get("kernels") or {}
        for name in KERNELS:
            if flags.get(name) is False:
                off.setdefault(name, []).append(run.label)
    if not off:
        return ""
    parts = [f"{KERNELS[name]} in {', '.join(labels)}" for name, labels in off.items()]
    return (" **Replayed without " + "; without ".join(parts) + ": the cost model prices the "
            "engine with them, so these errors are not the model's on the shipped engine.**")


def host_speed_line(profile_probe: dict | None, runs: list[tuple[str, dict]]) -> str:
    """The host's speed (gpu_backend.engine.hostprobe's fixed loop) during the profile and
    during each replay (label, summary), when recorded: launch-bound steps take what the host
    takes to launch them. "" when nothing was recorded."""
    def ms(probe) -> float | None:
        return probe.get("median_s") if isinstance(probe, dict) else None

    profile = ms(profile_probe)
    replays = [(label, ms((summary.get("measured") or {}).get("host_probe")))
               for label, summary in runs]
    replays = [(label, s) for label, s in replays if s is not None]
    if profile is None and not replays:
        return ""
    parts = [f"profile {profile * 1e3:.2f} ms" if profile is not None else "profile not recorded"]
    for label, s in replays:
        ratio = f" ({s / profile:.2f}x the profile's)" if profile else ""
        parts.append(f"{label} {s * 1e3:.2f} ms{ratio}")
    return ("Host speed (a fixed Python loop, median; launch-bound steps scale with it): "
            + "; ".join(parts) + ".")
