"""Validation plots: TTFT CDFs, per-step time scatter and error, KV usage over time."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from sim.core.request import RequestStatus  # noqa: E402
from sim.recording.metrics import request_table  # noqa: E402
from validation.pipeline import RunComparison  # noqa: E402
from validation.steps import relative_errors  # noqa: E402


def plot_all(out_dir: Path, runs: Sequence[RunComparison]) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    return [ttft_cdfs(out_dir / "ttft_cdf.png", runs),
            step_time_scatter(out_dir / "step_time.png", runs),
            kv_usage(out_dir / "kv_usage.png", runs)]


def _cdf(ax, values: np.ndarray, **style) -> None:
    values = np.sort(values[np.isfinite(values)])
    if values.size:
        ax.plot(values, np.arange(1, values.size + 1) / values.size, **style)


def _sim_ttft(run: RunComparison) -> np.ndarray:
    table = request_table([q for rec in run.sim.recorders for q in rec.requests])
    done = table["status"] == RequestStatus.FINISHED.value
    return (table["first_token_s"] - table["arrival_s"])[done]


def _gpu_ttft(run: RunComparison) -> np.ndarray | None:
    table = run.gpu.requests
    if table is None or "first_token_s" not in table:
        return None
    done = table["status"] == RequestStatus.FINISHED.value if "status" in table else True
    return (table["first_token_s"] - table["arrival_s"])[done]


def ttft_cdfs(path: Path, runs: Sequence[RunComparison]) -> Path:
    fig, ax = plt.subplots(figsize=(8, 4.5))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, run in enumerate(runs):
        color = colors[i % len(colors)]
        _cdf(ax, _sim_ttft(run), color=color, linestyle="--", label=f"{run.label} predicted")
        measured = _gpu_ttft(run)
        if measured is not None:
            _cdf(ax, measured, color=color, label=f"{run.label} measured")
    ax.set_xscale("log")
    ax.set_xlabel("TTFT (s)")
    ax.set_ylabel("fraction of requests")
    ax.set_title("TTFT: simulated (dashed) vs measured (solid)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    return _save(fig, path)


def step_time_scatter(path: Path, runs: Sequence[RunComparison]) -> Path:
    """Cost model's price of every measured step vs its measured time, and the error histogram."""
    fig, (ax, ax_err) = plt.subplots(1, 2, figsize=(12, 4.8))
    measured = np.concatenate([r.gpu.steps.duration_s for r in runs])
    predicted = np.concatenate([r.step_predicted_s for r in runs])
    prefill = np.concatenate([r.gpu.steps.has_prefill for r in runs])
    ran = np.concatenate([r.gpu.steps.num_tokens > 0 for r in runs]) & (measured > 0)
    for mask, label, color in ((ran & prefill, "steps with prefill", "tab:orange"),
                               (ran & ~prefill, "decode-only steps", "tab:blue")):
        ax.scatter(measured[mask] * 1e3, predicted[mask] * 1e3, s=4, alpha=0.4, color=color,
                   label=label)
        errors = relative_errors(predicted[mask], measured[mask]) * 100
        if errors.size:
            ax_err.hist(np.clip(errors, -50, 50), bins=100, alpha=0.6, color=color, label=label)
    if ran.any():
        low = min(measured[ran].min(), predicted[ran].min()) * 1e3
        high = max(measured[ran].max(), predicted[ran].max()) * 1e3
        ax.plot([low, high], [low, high], color="k", linewidth=0.8, label="predicted = measured")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("measured step time (ms)")
    ax.set_ylabel("cost model, same composition (ms)")
    ax.set_title("per-step time, every measured step")
    ax_err.set_xlabel("relative error of the predicted step time (%, clipped to +-50)")
    ax_err.set_ylabel("steps")
    for a in (ax, ax_err):
        a.grid(True, alpha=0.3)
        a.legend(fontsize=8)
    return _save(fig, path)


def _gpu_kv(run: RunComparison) -> tuple[np.ndarray, np.ndarray] | None:
    steps = run.gpu.steps
    if "kv_blocks_used" in steps.extra and steps.start_s is not None:
        return steps.start_s, steps.extra["kv_blocks_used"]
    tl = run.gpu.timeline
    if tl is not None and "start_s" in tl and "kv_blocks_used" in tl:
        return tl["start_s"], tl["kv_blocks_used"]
    return None


def kv_usage(path: Path, runs: Sequence[RunComparison]) -> Path:
    fig, axes = plt.subplots(len(runs), 1, figsize=(11, 2.4 * len(runs)), squeeze=False)
    for ax, run in zip(axes[:, 0], runs):
        block_size = run.sim.spec.engine.block_size
        sim = run.sim_steps
        ax.step(sim.extra["start_s"], sim.extra["kv_blocks_used"] * block_size, where="post",
                linestyle="--", label="predicted used")
        ax.step(sim.extra["start_s"], sim.extra["kv_blocks_usable"] * block_size, where="post",
                linestyle=":", color="gray", label="predicted usable")
        measured = _gpu_kv(run)
        peak = float(sim.extra["kv_blocks_used"].max(initial=0))
        if measured is not None:
            ax.step(measured[0], measured[1] * block_size, where="post", label="measured used")
            peak = max(peak, float(measured[1].max(initial=0)))
        ax.set_ylim(0, max(peak, 1.0) * block_size * 1.25)  # usable may sit far above use
        ax.set_ylabel("KV tokens")
        capacity = run.metrics["kv_capacity_lent_tokens"]
        ax.set_title(f"{run.label}: KV capacity predicted {_tokens(capacity['predicted'])}, "
                     f"measured {_tokens(capacity['measured'])} (with the reserve lent)",
                     fontsize=9)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7, loc="upper right")
    axes[-1, 0].set_xlabel("time (s)")
    return _save(fig, path)


def _tokens(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
