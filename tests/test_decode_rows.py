"""validation.decode_rows: each step's decode rows rebuilt from a replay's requests."""

from __future__ import annotations

import numpy as np
import pytest

from validation.decode_rows import decode_rows, rebuilt_share
from validation.step_table import StepTable


def table(prefill: list[int], decode: list[int], context: list[int],
          start: list[float] | None) -> StepTable:
    n = len(prefill)
    ints = lambda values: np.asarray(values, dtype=np.int64)  # noqa: E731
    extra = {} if start is None else {"start_s": np.asarray(start, dtype=np.float64)}
    return StepTable(ints(prefill), ints(decode), ints(context), ints([1] * n), ints([1] * n),
                     np.zeros(n), np.full(n, 0.01), True, extra)


# Request A: a 10-token prompt, prefilled in the step at t=0, first token at t=1, finished at
# t=3.5. Request B: a 5-token prompt, prefilled beside A's first decode at t=1, first token
# at t=2, finished at t=5. A decode row's context is its prompt plus every token it has
# produced: A has 11 keys at t=1, 12 at t=2, 13 at t=3; B 6 at t=2, 7 at t=3, 8 at t=3.5.
REQUESTS = {"first_token_s": np.array([1.0, 2.0]), "finish_s": np.array([3.5, 5.0]),
            "prompt_tokens": np.array([10.0, 5.0])}
STARTS = [0.0, 1.0, 2.0, 3.0, 3.5]
PREFILL = [10, 5, 0, 0, 0]
DECODE = [0, 1, 2, 2, 1]


def test_rows_follow_each_request_from_its_first_token_to_its_finish():
    steps = table(PREFILL, DECODE, [0, 11, 18, 20, 8], STARTS)
    rows = decode_rows(steps, REQUESTS)
    assert [r.tolist() for r in rows] == [[], [11], [12, 6], [13, 7], [8]]
    assert rebuilt_share(rows, steps) == 1.0


def test_a_step_whose_rows_disagree_with_its_record_is_none_and_counted():
    # step 3 records 21 keys where the requests give 20 (a preempted or cached request)
    steps = table(PREFILL, DECODE, [0, 11, 18, 21, 8], STARTS)
    rows = decode_rows(steps, REQUESTS)
    assert rows[3] is None
    assert rows[2] is not None and rows[2].tolist() == [12, 6]
    assert rebuilt_share(rows, steps) == pytest.approx(3 / 4)


def test_a_request_that_never_ran_is_left_out():
    requests = {"first_token_s": np.array(["1.0", "2.0", ""]),
                "finish_s": np.array(["3.5", "5.0", ""]),
                "prompt_tokens": np.array(["10", "5", "7"])}
    rows = decode_rows(table(PREFILL, DECODE, [0, 11, 18, 20, 8], STARTS), requests)
    assert rows[2] is not None and rows[2].tolist() == [12, 6]


def test_missing_start_times_or_columns_are_named():
    with pytest.raises(ValueError, match="start_s"):
        decode_rows(table(PREFILL, DECODE, [0, 11, 18, 20, 8], None), REQUESTS)
    with pytest.raises(ValueError, match="prompt_tokens"):
        decode_rows(table(PREFILL, DECODE, [0, 11, 18, 20, 8], STARTS),
                    {k: v for k, v in REQUESTS.items() if k != "prompt_tokens"})
