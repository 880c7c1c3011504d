"""PNG plots of simulated runs: one figure of each run over time, and the latency CDFs.

    timeline_<run>.png   replica 0 over simulated time, in four panels sharing the time axis:
                         the waiting queue each arrival found; the running batch (requests
                         per step); the KV cache in GiB (used, usable, the reserve lent, the
                         base pool as a dashed line); prefill and decode tokens per second
    latency_cdfs.png     TTFT and TPOT CDFs of every run, with the SLOs as vertical lines and
                         each run's share within them

A run of an hour has ~300k steps; the panels show them in NUM_BINS time bins. Batch and KV
are means over the bin's busy time (a gap where the engine was idle), tokens per second the
bin's tokens over its length: exact integrals of the step rows, not samples of them.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator, NullFormatter  # noqa: E402

from sim.recording.metrics import TIMELINE_COLUMNS, Slo, timeline_array  # noqa: E402

NUM_BINS = 400
GIB = 2**30
_COL = {name: i for i, name in enumerate(TIMELINE_COLUMNS)}


class Binned:
    """Step rows of one replica as cumulative integrals, read back over time bins."""

    def __init__(self, rows: np.ndarray, num_bins: int = NUM_BINS) -> None:
        start = rows[:, _COL["start_s"]]
        self.duration = rows[:, _COL["duration_s"]]
        end = start + self.duration
        t0, t1 = (float(start[0]), float(end[-1])) if len(rows) else (0.0, 1.0)
        self.edges = np.linspace(t0, max(t1, t0 + 1e-9), num_bins + 1)
        self.centers = (self.edges[:-1] + self.edges[1:]) / 2
        self._knots = np.maximum.accumulate(np.column_stack([start, end]).ravel())
        self._busy = self._integral(self.duration)

    def _integral(self, amount: np.ndarray) -> np.ndarray:
        """Per bin, the `amount` each row spreads evenly over its own duration."""
        cumulative = np.cumsum(amount)
        at_knots = np.column_stack([cumulative - amount, cumulative]).ravel()
        if at_knots.size == 0:
            return np.zeros(len(self.centers))
        return np.diff(np.interp(self.edges, self._knots, at_knots))

    def rate(self, amount: np.ndarray) -> np.ndarray:
        """Amount per second of the bin (idle time counts)."""
        return self._integral(amount) / np.diff(self.edges)

    def busy_mean(self, value: np.ndarray) -> np.ndarray:
        """Mean of a per-row value over the bin's busy time; NaN where it was idle."""
        busy = self._busy
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(busy > 0, self._integral(value * self.duration) / busy, np.nan)


def plot_run(path: Path, result) -> Path:
    """The timeline figure of one run (a `sim.runner.RunResult`)."""
    rec = result.recorders[0]
    rows = timeline_array(rec)
    b = Binned(rows)
    fig, (ax_q, ax_b, ax_kv, ax_tok) = plt.subplots(4, 1, figsize=(10, 9), sharex=True)
    _queue_panel(ax_q, rec.queue, result.summary)
    ax_b.plot(b.centers, b.busy_mean(rows[:, _COL["num_seqs"]]), lw=1)
    ax_b.set_ylabel("running batch\n(requests/step)")
    _kv_panel(ax_kv, b, rows, result.core.plan.block_bytes, result.core.plan.num_kv_blocks)
    _tokens_panel(ax_tok, b, rows)
    ax_tok.set_xlabel("simulated time (s)")
    for ax in (ax_q, ax_b, ax_kv, ax_tok):
        ax.grid(True, alpha=0.3)
        ax.set_ylim(bottom=0)
    replicas = f", replica 0 of {len(result.recorders)}" if len(result.recorders) > 1 else ""
    fig.suptitle(f"{result.spec.label}{replicas}", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _queue_panel(ax, queue, summary: dict) -> None:
    ax.step(queue.times_s, queue.lengths, where="post", lw=1)
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel("waiting queue\n(at each arrival)")
    if summary.get("overloaded"):
        ax.set_title(f"overloaded: the queue grew {summary['queue_growth_req_s']:+.2f} req/s "
                     f"and held {summary['queue_at_last_arrival']:,} at the last arrival",
                     fontsize=9, color="tab:red")


def _kv_panel(ax, b: Binned, rows: np.ndarray, block_bytes: int, base_blocks: int) -> None:
    gib = block_bytes / GIB
    used = b.busy_mean(rows[:, _COL["kv_blocks_used"]]) * gib
    usable = b.busy_mean(rows[:, _COL["kv_blocks_usable"]]) * gib
    lent = b.busy_mean(rows[:, _COL["reserve_lent_blocks"]]) * gib
    ax.fill_between(b.centers, base_blocks * gib, base_blocks * gib + np.nan_to_num(lent),
                    color="tab:green", alpha=0.3, label="reserve lent")
    ax.plot(b.centers, usable, lw=1, color="tab:green", label="usable")
    ax.plot(b.centers, used, lw=1, color="tab:blue", label="used")
    ax.axhline(base_blocks * gib, ls="--", lw=0.8, color="grey", label="base pool")
    ax.set_ylabel("KV cache\n(GiB per GPU)")
    ax.legend(fontsize=8, loc="best", ncol=4)
    share = 100 / (base_blocks * gib)
    pct = ax.secondary_yaxis("right", functions=(lambda g: g * share, lambda p: p / share))
    pct.set_ylabel("% of base pool")


def _tokens_panel(ax, b: Binned, rows: np.ndarray) -> None:
    """Prefill tokens/s on the left axis, decode (output) tokens/s on the right: decode
    rates are often a tenth of prefill bursts and would be flat on one axis."""
    steps = rows[:, _COL["num_steps"]]
    ax.plot(b.centers, b.rate(rows[:, _COL["prefill_tokens"]] * steps), lw=1,
            color="tab:blue")
    ax.set_ylabel("prefill\ntokens/s", color="tab:blue")
    right = ax.twinx()
    right.plot(b.centers, b.rate(rows[:, _COL["decode_tokens"]] * steps), lw=1.2,
               color="tab:orange")
    right.set_ylabel("decode\ntokens/s", color="tab:orange")
    right.set_ylim(bottom=0)


def plot_latency_cdfs(path: Path, results: Sequence, slo: Slo) -> Path:
    """TTFT and TPOT CDFs of `results` (RunResults), with the SLO lines when given."""
    fig, (ax_ttft, ax_tpot) = plt.subplots(1, 2, figsize=(11, 4.2))
    for r in results:
        ttft = np.concatenate([rec.ttft_s.array() for rec in r.recorders])
        tpot = np.concatenate([rec.tpot_s.array() for rec in r.recorders])
        _cdf(ax_ttft, ttft, r.spec.label, slo.ttft_s)
        _cdf(ax_tpot, tpot, r.spec.label, slo.tpot_s)
    for ax, name, limit in ((ax_ttft, "TTFT (s)", slo.ttft_s), (ax_tpot, "TPOT (s)", slo.tpot_s)):
        if limit is not None:
            ax.axvline(limit, color="tab:red", ls="--", lw=1, label=f"SLO {limit:g} s")
        ax.set_xscale("log")
        ax.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel(name + ", log scale")
        ax.set_ylabel("fraction of finished requests")
        ax.set_ylim(0, 1.02)
        ax.grid(True, which="both", alpha=0.3)
        if ax.get_legend_handles_labels()[0]:  # no line: every request rejected, say
            ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _cdf(ax, values: np.ndarray, label: str, limit: float | None) -> None:
    values = np.sort(values[np.isfinite(values) & (values > 0)])
    if not values.size:
        return
    if limit is not None:
        label += f" ({np.mean(values <= limit):.0%} within SLO)"
    ax.plot(values, np.arange(1, values.size + 1) / values.size, label=label)
