"""Each step's decode rows, rebuilt from a GPU replay's requests and steps.

steps.csv records a step's decode rows only as a count, their summed context and the longest
one. The split plan of the decode attention (gpu_backend.kernels.attention) depends on every
row's length, so studying it on a replay needs the rows themselves. They follow from the
requests: a request decodes in every step that starts after its first token and before it
finishes, and its context there is its prompt plus the tokens it has produced, one per step
since its first token. A step whose rebuilt rows disagree with its recorded count or context
(a preempted or prefix-cached request, a run cut short) gets None: `rebuilt_share` says how
many steps were rebuilt, so none is dropped unseen.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from validation.step_table import StepTable

REQUEST_COLUMNS = ("first_token_s", "finish_s", "prompt_tokens")


def _column(requests: Mapping[str, np.ndarray], name: str) -> np.ndarray:
    if name not in requests:
        raise ValueError(f"requests CSV has no {name!r} column; rebuilding decode rows needs "
                         f"{', '.join(REQUEST_COLUMNS)} (written by `python -m gpu_backend replay`)")
    values = np.asarray(requests[name])
    if values.dtype.kind in "US":  # read as text: an empty cell is a request that never ran
        values = np.where(values == "", "nan", values)
    return values.astype(np.float64)


def decode_rows(steps: StepTable, requests: Mapping[str, np.ndarray]) -> list[np.ndarray | None]:
    """The context of each step's decode rows (as steps.csv's decode_context_tokens counts
    it: the sequence after the step, prompt and tokens produced so far), in request order;
    None where the rebuilt rows do not match the step's num_decode_tokens and
    decode_context_tokens. Needs the steps' start_s (a replay's steps.csv has it)."""
    start = steps.start_s
    if start is None:
        raise ValueError("steps.csv has no start_s column: the decode rows cannot be placed in "
                         "time; replays written by `python -m gpu_backend replay` have it")
    first, finish = _column(requests, "first_token_s"), _column(requests, "finish_s")
    prompt = _column(requests, "prompt_tokens").astype(np.int64)
    ran = np.isfinite(first) & np.isfinite(finish)
    first, finish, prompt = first[ran], finish[ran], prompt[ran]
    order = np.argsort(start, kind="stable")
    sorted_start = start[order]
    # steps begun before each request's first token: at a later step s its context is its
    # prompt, its first token, and one token per step begun in [first token, s)
    before_first = np.searchsorted(sorted_start, first, side="left")
    rows: list[np.ndarray | None] = []
    for i in range(len(steps)):
        num = int(steps.num_decode_tokens[i])
        if num == 0:
            rows.append(np.zeros(0, dtype=np.int64))
            continue
        s = start[i]
        active = (first <= s) & (finish > s)
        produced = np.searchsorted(sorted_start, s, side="left") - before_first[active]
        lengths = prompt[active] + 1 + produced
        if len(lengths) != num or int(lengths.sum()) != int(steps.decode_context_tokens[i]):
            rows.append(None)
        else:
            rows.append(lengths)
    return rows


def rebuilt_share(rows: list[np.ndarray | None], steps: StepTable) -> float:
    """Share of the steps with decode rows whose rows were rebuilt (1.0: all)."""
    with_rows = steps.num_decode_tokens > 0
    total = int(with_rows.sum())
    if total == 0:
        return 1.0
    return sum(1 for i in np.nonzero(with_rows)[0] if rows[i] is not None) / total
