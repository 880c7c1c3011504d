"""The map as a heatmap: one panel per TP degree, models down, prompt lengths across.

Colour is elastic's goodput gain over the best static chunk (percent); grey cells do not
fit (or the TP degree does not divide the model's heads); a thick black line outlines the
region where elastic pays.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from sim.planning.gain_map import Cell, MapQuery

STATUS_TEXT = {"does not fit": "no fit", "invalid": "TP n/a"}


def gain_grid(cells: Sequence[Cell], query: MapQuery, tp: int) -> tuple[np.ndarray, np.ndarray]:
    """(gain % [models, prompts] with NaN where not run, pays mask) for one TP degree."""
    gains = np.full((len(query.models), len(query.prompts)), np.nan)
    pays = np.zeros_like(gains, dtype=bool)
    index = {(c.model, c.prompt_tokens): c for c in cells if c.tp == tp}
    for i, model in enumerate(query.models):
        for j, prompt in enumerate(query.prompts):
            cell = index[(model, prompt)]
            if cell.gain_pct is not None:
                gains[i, j] = cell.gain_pct
                pays[i, j] = cell.pays
    return gains, pays


def plot_map(cells: Sequence[Cell], query: MapQuery, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import TwoSlopeNorm

    grids = [gain_grid(cells, query, tp) for tp in query.tps]
    finite = np.concatenate([g[np.isfinite(g)] for g, _ in grids] + [np.array([0.0])])
    span = max(10.0, float(np.abs(finite).max()))
    norm = TwoSlopeNorm(vcenter=0.0, vmin=-span, vmax=span)
    fig, axes = plt.subplots(1, len(query.tps), figsize=(3.2 * len(query.tps) + 1.5,
                                                         0.45 * len(query.models) + 1.8),
                             sharey=True, squeeze=False)
    for ax, tp, (gains, pays) in zip(axes[0], query.tps, grids):
        image = ax.imshow(np.ma.masked_invalid(gains), cmap="RdYlGn", norm=norm, aspect="auto")
        ax.set_facecolor("0.85")
        _annotate(ax, cells, query, tp, gains)
        _outline(ax, pays)
        ax.set_title(f"TP {tp}")
        ax.set_xticks(range(len(query.prompts)), [_k(p) for p in query.prompts])
        ax.set_xlabel("prompt tokens")
    axes[0][0].set_yticks(range(len(query.models)), query.models)
    fig.colorbar(image, ax=axes[0].tolist(), label="elastic goodput gain over best static, %")
    fig.suptitle(f"Where elastic reclamation pays on {query.gpu} "
                 f"(outlined: gain >= {query.pays_pct:g}%)")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return path


def _annotate(ax, cells: Sequence[Cell], query: MapQuery, tp: int, gains: np.ndarray) -> None:
    index = {(c.model, c.prompt_tokens): c for c in cells if c.tp == tp}
    for i, model in enumerate(query.models):
        for j, prompt in enumerate(query.prompts):
            cell = index[(model, prompt)]
            text = f"{gains[i, j]:+.0f}" if np.isfinite(gains[i, j]) else STATUS_TEXT.get(
                cell.status, "")
            ax.text(j, i, text, ha="center", va="center", fontsize=7)


def _outline(ax, pays: np.ndarray) -> None:
    """Draw the boundary of the paying region: every edge between a paying cell and a
    non-paying cell (or the border)."""
    rows, cols = pays.shape
    for i in range(rows):
        for j in range(cols):
            if not pays[i, j]:
                continue
            for di, dj in ((-1, 0), (1, 0), (0, -1), (0, 1)):
                ni, nj = i + di, j + dj
                if 0 <= ni < rows and 0 <= nj < cols and pays[ni, nj]:
                    continue
                if di:
                    y = i + di / 2
                    ax.plot([j - 0.5, j + 0.5], [y, y], color="black", lw=2.5)
                else:
                    x = j + dj / 2
                    ax.plot([x, x], [i - 0.5, i + 0.5], color="black", lw=2.5)


def _k(tokens: int) -> str:
    return f"{tokens // 1024}k" if tokens >= 1024 and tokens % 1024 == 0 else str(tokens)
