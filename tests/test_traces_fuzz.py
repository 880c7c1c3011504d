"""Mutated trace files of every format load correctly or raise TraceError, never anything else.

Two properties over small hand-written files (expected values written out below):
- re-encoding that keeps the data (line endings, BOM, gzip/zstd, deleted, duplicated or
  blank rows, truncation at a record) loads exactly the expected requests;
- damage (byte flips, insertions, stray quotes, truncation, huge numbers, foreign
  encodings, CR endings, gzip of the damaged bytes) gives a TraceError or a trace that passes every invariant, and
  reading in tiny chunks agrees with reading whole.
Derandomized and bounded, so CI sees the same examples every run in a few seconds.
"""

from __future__ import annotations

import gzip
import re
from dataclasses import dataclass

import numpy as np
import pytest
import zstandard
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from traces import FORMATS, TraceError, load_trace
from traces.limits import MAX_TOKENS_PER_REQUEST
from traces.loader import read_columns

FUZZ = settings(derandomize=True, database=None, deadline=None, max_examples=40,
                suppress_health_check=[HealthCheck.too_slow])


@dataclass(frozen=True)
class Seed:
    """A valid file as a header plus one text per record, and what each record loads as."""

    header: str
    records: tuple[str, ...]
    arrival_s: tuple[float, ...]  # as written, before re-basing
    prompt: tuple[int, ...]
    output: tuple[int, ...]  # 0: a BurstGPT failed request, dropped on load
    hashes: tuple[tuple[int, ...], ...] | None = None


SEEDS = {
    "azure": Seed(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n",
        ("2023-11-16 18:17:03.9799600,4808,10\n", "2023-11-16 18:17:04.0319600+00:00,3180,8\n",
         "2023-11-16 18:17:05.5,120,33\n"),
        (0.0, 0.052, 1.52004), (4808, 3180, 120), (10, 8, 33)),
    "mooncake": Seed(
        "",
        ('{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]}\n',
         '{"timestamp": 250, "input_length": 100, "output_length": 3, "hash_ids": [1]}\n',
         '{"timestamp": 1000, "input_length": 1100, "output_length": 7, "hash_ids": [1, 3, 4]}\n'),
        (0.0, 0.25, 1.0), (600, 100, 1100), (5, 3, 7), ((1, 2), (1,), (1, 3, 4))),
    "burstgpt": Seed(
        "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n",
        ("5,ChatGPT,100,20,120,Conversation log\n", "7,GPT-4,50,0,50,Conversation log\n",
         "12,ChatGPT,30,3,33,API log\n"),
        (5.0, 7.0, 12.0), (100, 50, 30), (20, 0, 3)),
    "vidur": Seed(
        "arrived_at,num_prefill_tokens,num_decode_tokens,note\n",
        ('0.5,10,2,"a, b"\n', "1.25,20,3,plain\n", '2.0,30,4,"two\nlines"\n'),
        (0.5, 1.25, 2.0), (10, 20, 30), (2, 3, 4)),
}
HUGE_NUMBERS = ["9" * 25, str(2**63), str(2**64 + 1), "1e309", "-0", "1" + "0" * 400, "NaN",
                "Infinity", "-1", "0", str(MAX_TOKENS_PER_REQUEST + 1)]


def pack(data: bytes, compression: str) -> bytes:
    if compression == "gzip":
        return gzip.compress(data, mtime=0)
    if compression == "zstd":
        return zstandard.ZstdCompressor().compress(data)
    return data


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("fuzz")


@st.composite
def kept_rows(draw, num_rows: int) -> list[int]:
    """Record indices after one row edit: delete, duplicate, truncate, or none."""
    rows = list(range(num_rows))
    edit = draw(st.sampled_from(["none", "delete", "duplicate", "truncate"]))
    at = draw(st.integers(0, num_rows - 1))
    if edit == "delete":
        del rows[at]
    elif edit == "duplicate":
        rows.insert(at, at)
    elif edit == "truncate":
        rows = rows[: at + 1]
    return rows


@pytest.mark.parametrize("fmt", sorted(SEEDS))
@FUZZ
@given(data=st.data())
def test_data_preserving_rewrites_load_the_expected_requests(workdir, fmt, data):
    seed = SEEDS[fmt]
    rows = data.draw(kept_rows(len(seed.records)))
    blank_after = data.draw(st.sets(st.integers(0, len(rows))))
    lines = [seed.header] + [seed.records[i] + ("\n" if k in blank_after else "")
                             for k, i in enumerate(rows)]
    text = "".join(lines)
    if data.draw(st.booleans()):
        text = text.rstrip("\n")
    text = text.replace("\n", data.draw(st.sampled_from(["\n", "\r\n", "\r"])))
    raw = (b"\xef\xbb\xbf" if data.draw(st.booleans()) else b"") + text.encode()
    path = workdir / f"{fmt}.trace"
    path.write_bytes(pack(raw, data.draw(st.sampled_from(["", "gzip", "zstd"]))))
    kept = [i for i in rows if seed.output[i] > 0]
    if not kept:
        with pytest.raises(TraceError):
            load_trace(path)
        return
    trace = load_trace(path)
    arrival_s = np.array([seed.arrival_s[i] for i in kept])
    np.testing.assert_allclose(trace.arrival_s, arrival_s - arrival_s[0], rtol=0, atol=1e-9)
    assert trace.prompt_tokens.tolist() == [seed.prompt[i] for i in kept]
    assert trace.output_tokens.tolist() == [seed.output[i] for i in kept]
    if seed.hashes is not None:
        assert list(trace.block_hashes) == [seed.hashes[i] for i in kept]


@st.composite
def damaged(draw, raw: bytes) -> bytes:
    """``raw`` after one to three kinds of damage, possibly gzipped afterwards."""
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["flip", "insert", "quote", "cut", "number", "number",
                                     "encoding", "cr"]))
        at = draw(st.integers(0, len(raw)))
        if kind == "flip" and raw:
            at = min(at, len(raw) - 1)
            raw = raw[:at] + bytes([draw(st.integers(0, 255))]) + raw[at + 1 :]
        elif kind == "insert":
            raw = raw[:at] + draw(st.binary(min_size=1, max_size=8)) + raw[at:]
        elif kind == "quote":
            raw = raw[:at] + draw(st.sampled_from([b'"', b'""', b'\n"', b'",'])) + raw[at:]
        elif kind == "cut":
            raw = raw[:at] + raw[at + draw(st.integers(1, 40)) :]
        elif kind == "number":
            runs = [m.span() for m in re.finditer(rb"[0-9]+", raw)]
            if runs:
                start, end = draw(st.sampled_from(runs))
                raw = raw[:start] + draw(st.sampled_from(HUGE_NUMBERS)).encode() + raw[end:]
        elif kind == "encoding":
            text = raw.decode("utf-8", "replace")[:at] + "é" + raw.decode("utf-8", "replace")[at:]
            raw = text.encode(draw(st.sampled_from(["utf-16", "latin-1", "utf-8"])), "replace")
        elif kind == "cr":
            raw = raw.replace(b"\n", b"\r")
    return pack(raw, draw(st.sampled_from(["", "", "gzip"])))


def assert_valid(trace) -> None:
    """What every loaded trace promises its consumers."""
    count = len(trace)
    assert count >= 1 and trace.arrival_s.dtype == np.float64
    assert trace.arrival_s[0] == 0.0 and np.all(np.isfinite(trace.arrival_s))
    assert np.all(np.diff(trace.arrival_s) >= 0)
    for tokens in (trace.prompt_tokens, trace.output_tokens):
        assert tokens.dtype == np.int64 and tokens.shape == (count,)
        assert tokens.min() >= 1 and tokens.max() <= MAX_TOKENS_PER_REQUEST
    requests = trace.requests()
    assert len(requests) == count
    if trace.block_hashes is not None:
        for request in requests:
            hash(request.block_hashes)  # the prefix cache keys on these
            assert all(type(block_id) is int for block_id in request.block_hashes)


def raw_or_error(path, fmt, chunk_bytes):
    try:
        return read_columns(path, fmt, chunk_bytes=chunk_bytes)
    except TraceError:
        return None


@pytest.mark.parametrize("fmt", sorted(SEEDS))
@settings(FUZZ, max_examples=120)
@given(data=st.data())
def test_damaged_files_load_validly_or_raise_trace_error(workdir, fmt, data):
    seed = SEEDS[fmt]
    path = workdir / f"{fmt}.damaged"
    path.write_bytes(data.draw(damaged((seed.header + "".join(seed.records)).encode())))
    forced = data.draw(st.sampled_from([None, None, *FORMATS]))  # a wrong one, at times
    try:
        trace = load_trace(path, forced)
    except TraceError as error:
        assert str(path) in str(error) and len(str(error)) < 1_000
        event("TraceError")
    else:
        assert_valid(trace)
        event("loaded")
    whole = raw_or_error(path, forced, None)
    chunked = raw_or_error(path, forced, data.draw(st.integers(1, 40)))
    assert (whole is None) == (chunked is None)
    if whole is not None:
        for column in ("arrival_s", "prompt_tokens", "output_tokens", "line_numbers"):
            np.testing.assert_array_equal(getattr(chunked, column), getattr(whole, column))
