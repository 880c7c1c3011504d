"""The map as a heatmap: one panel per TP degree, models down, prompt lengths across.

Colour is elastic's goodput gain over the best static chunk (percent); grey cells do not
fit in memory or have a TP degree that does not divide the model's heads; hatched grey cells
are beyond the model's context (the prompt and its output run past max_position_embeddings,
which vLLM refuses); a thick black line outlines the region where elastic pays.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from sim.planning.gain_map import OUTPUT_TOKENS, Cell, MapQuery
from sim.planning.sweep import BEYOND_CONTEXT
from sim.recording.reclaims import RECLAIM_MARK

STATUS_TEXT = {"does not fit": "no fit", "invalid": "TP n/a"}
UNRUN_GREY = "0.85"
CONTEXT_HATCH = "///"


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
        ax.set_facecolor(UNRUN_GREY)
        _hatch_beyond_context(ax, cells, query, tp)
        _annotate(ax, cells, query, tp, gains)
        _outline(ax, pays)
        ax.set_title(f"TP {tp}")
        ax.set_xticks(range(len(query.prompts)), [_k(p) for p in query.prompts])
        ax.set_xlabel("prompt tokens")
    axes[0][0].set_yticks(range(len(query.models)), query.models)
    fig.colorbar(image, ax=axes[0].tolist(), label="elastic goodput gain over best static, %")
    fig.suptitle(f"Where elastic reclamation pays on {query.gpu} "
                 f"(outlined: gain >= {query.pays_pct:g}%)")
    _legend(fig, any(c.reclaims_often for c in cells))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return path


def _legend(fig, reclaims: bool) -> None:
    from matplotlib.patches import Patch

    handles = [
        Patch(facecolor=UNRUN_GREY, edgecolor="0.5", label="no fit: weights, reserve or one "
              "request's KV exceed memory; TP n/a: TP does not divide the heads"),
        Patch(facecolor=UNRUN_GREY, edgecolor="0.5", hatch=CONTEXT_HATCH,
              label=f"ctx N: beyond the model's context of N tokens (prompt + up to "
                    f"{OUTPUT_TOKENS[1]} output tokens > max_position_embeddings)"),
    ]
    if reclaims:
        handles.append(Patch(facecolor="none", edgecolor="none",
                             label=f"{RECLAIM_MARK} (README, Limits)"))
    fig.legend(handles=handles, loc="upper center", fontsize=8, frameon=False,
               bbox_to_anchor=(0.45, -0.02))  # below the panels' axis labels


def _hatch_beyond_context(ax, cells: Sequence[Cell], query: MapQuery, tp: int) -> None:
    from matplotlib.patches import Rectangle

    index = {(c.model, c.prompt_tokens): c for c in cells if c.tp == tp}
    for i, model in enumerate(query.models):
        for j, prompt in enumerate(query.prompts):
            if index[(model, prompt)].status == BEYOND_CONTEXT:
                ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, facecolor=UNRUN_GREY,
                                       edgecolor="0.55", hatch=CONTEXT_HATCH, lw=0))


def _annotate(ax, cells: Sequence[Cell], query: MapQuery, tp: int, gains: np.ndarray) -> None:
    index = {(c.model, c.prompt_tokens): c for c in cells if c.tp == tp}
    for i, model in enumerate(query.models):
        for j, prompt in enumerate(query.prompts):
            cell = index[(model, prompt)]
            # a label on hatching gets a tight grey box, to stay legible
            box = ({"bbox": {"facecolor": UNRUN_GREY, "edgecolor": "none", "pad": 0.6}}
                   if cell.status == BEYOND_CONTEXT else {})
            ax.text(j, i, _cell_text(cell, gains[i, j]), ha="center", va="center", fontsize=7,
                    **box)


def _cell_text(cell: Cell, gain_pct: float) -> str:
    if np.isfinite(gain_pct):
        return f"{gain_pct:+.0f}{' !' if cell.reclaims_often else ''}"
    if cell.status == BEYOND_CONTEXT:
        return f"ctx\n{_k(cell.context_tokens)}"
    return STATUS_TEXT.get(cell.status, "")


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
