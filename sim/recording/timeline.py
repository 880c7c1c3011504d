"""Running totals over a replica's timeline rows, so the summary needs no row kept."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from sim.recording.sinks import TIMELINE_COLUMNS

_COL = {name: i for i, name in enumerate(TIMELINE_COLUMNS)}


@dataclass
class TimelineTotals:
    num_engine_steps: int = 0
    busy_s: float = 0.0
    decode_only_s: float = 0.0
    kv_used_share_s: float = 0.0  # sum of used / usable x duration
    lent_s: float = 0.0  # time with any reserve block lent
    lent_blocks_s: float = 0.0  # sum of lent blocks x duration
    max_lent_blocks: int = 0
    num_oom: int = 0

    def add(self, rows: np.ndarray) -> None:
        """Fold a block of timeline rows (float64 [steps, len(TIMELINE_COLUMNS)]) in."""
        duration = rows[:, _COL["duration_s"]]
        prefill, decode = rows[:, _COL["prefill_tokens"]], rows[:, _COL["decode_tokens"]]
        used, usable = rows[:, _COL["kv_blocks_used"]], rows[:, _COL["kv_blocks_usable"]]
        lent = rows[:, _COL["reserve_lent_blocks"]]
        self.num_engine_steps += int(rows[:, _COL["num_steps"]].sum())
        self.busy_s += float(duration.sum())
        self.decode_only_s += float(duration[(prefill == 0) & (decode > 0)].sum())
        self.kv_used_share_s += float((used / np.maximum(usable, 1) * duration).sum())
        self.lent_s += float(duration[lent > 0].sum())
        self.lent_blocks_s += float((lent * duration).sum())
        if lent.size:
            self.max_lent_blocks = max(self.max_lent_blocks, int(lent.max()))
        self.num_oom += int(rows[:, _COL["oom"]].sum())

    @staticmethod
    def merged(totals: Sequence[TimelineTotals]) -> TimelineTotals:
        out = TimelineTotals()
        for t in totals:
            out.num_engine_steps += t.num_engine_steps
            out.busy_s += t.busy_s
            out.decode_only_s += t.decode_only_s
            out.kv_used_share_s += t.kv_used_share_s
            out.lent_s += t.lent_s
            out.lent_blocks_s += t.lent_blocks_s
            out.max_lent_blocks = max(out.max_lent_blocks, t.max_lent_blocks)
            out.num_oom += t.num_oom
        return out

    def summary(self, block_size: int) -> dict:
        busy_s = self.busy_s

        def share(seconds: float) -> float:
            return float(seconds / busy_s) if busy_s else 0.0

        return {
            "num_engine_steps": self.num_engine_steps,
            "busy_s": busy_s,
            "decode_only_time_share": share(self.decode_only_s),
            "kv_utilization_mean": share(self.kv_used_share_s),
            "reserve_lent_time_share": share(self.lent_s),
            "reserve_lent_tokens_max": self.max_lent_blocks * block_size,
            "reserve_lent_tokens_mean": share(self.lent_blocks_s) * block_size,
            "num_oom": self.num_oom,
        }
