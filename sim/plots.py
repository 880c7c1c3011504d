"""PNG plots of simulated runs: TTFT and TPOT CDFs per run, KV usage and lent reserve over time."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from sim.core.request import RequestStatus  # noqa: E402
from sim.recording.metrics import TIMELINE_COLUMNS, request_table, timeline_array  # noqa: E402


def _cdf(ax, values: np.ndarray, label: str) -> None:
    values = np.sort(values[np.isfinite(values)])
    if values.size:
        ax.plot(values, np.arange(1, values.size + 1) / values.size, label=label)


def plot_runs(out_dir: Path, results: Sequence) -> list[Path]:
    paths = [_latency_cdfs(out_dir, results), _kv_over_time(out_dir, results)]
    return paths


def _latency_cdfs(out_dir: Path, results: Sequence) -> Path:
    fig, (ax_ttft, ax_tpot) = plt.subplots(1, 2, figsize=(11, 4))
    for r in results:
        table = request_table([q for rec in r.recorders for q in rec.requests])
        done = table["status"] == RequestStatus.FINISHED.value
        ttft = (table["first_token_s"] - table["arrival_s"])[done]
        outputs = table["output_tokens"][done]
        multi = outputs > 1
        tpot = (table["finish_s"] - table["first_token_s"])[done][multi] / (outputs[multi] - 1)
        _cdf(ax_ttft, ttft, r.spec.label)
        _cdf(ax_tpot, tpot, r.spec.label)
    for ax, name in ((ax_ttft, "TTFT (s)"), (ax_tpot, "TPOT (s)")):
        ax.set_xscale("log")
        ax.set_xlabel(name)
        ax.set_ylabel("fraction of requests")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    path = out_dir / "latency_cdfs.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _kv_over_time(out_dir: Path, results: Sequence) -> Path:
    fig, axes = plt.subplots(len(results), 1, figsize=(11, 2.4 * len(results)), squeeze=False,
                             sharex=True)
    col = {name: i for i, name in enumerate(TIMELINE_COLUMNS)}
    for ax, r in zip(axes[:, 0], results):
        tl = timeline_array(r.recorders[0])
        block_size = r.recorders[0].block_size
        t = tl[:, col["start_s"]]
        ax.step(t, tl[:, col["kv_blocks_used"]] * block_size, where="post", label="KV used")
        ax.step(t, tl[:, col["kv_blocks_usable"]] * block_size, where="post", label="KV usable")
        ax.fill_between(t, 0, tl[:, col["reserve_lent_blocks"]] * block_size, step="post",
                        alpha=0.3, label="reserve lent")
        ax.set_ylabel("tokens")
        ax.set_title(f"{r.spec.label} (replica 0)", fontsize=9)
        ax.legend(fontsize=7, loc="upper right")
        ax.grid(True, alpha=0.3)
    axes[-1, 0].set_xlabel("time (s)")
    fig.tight_layout()
    path = out_dir / "kv_usage.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
