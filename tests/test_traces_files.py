"""How trace bytes reach the parsers: line endings, BOM, encodings, compression, sizes, chunks."""

from __future__ import annotations

import gzip

import numpy as np
import pytest
import zstandard

from traces import BUNDLED, TraceError, load_trace
from traces.loader import read_columns
from traces.source import MAX_LINE_BYTES

AZURE = ("TIMESTAMP,ContextTokens,GeneratedTokens\n"
         "2023-11-16 18:17:03.9799600,4808,10\n"
         "2023-11-16 18:17:04.0319600,3180,8\n")
MOONCAKE = ('{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]}\n'
            '{"timestamp": 250, "input_length": 100, "output_length": 3, "hash_ids": [1]}\n')
VIDUR_HEADER = "arrived_at,num_prefill_tokens,num_decode_tokens,note\n"


def write(tmp_path, name: str, data: bytes | str):
    path = tmp_path / name
    path.write_bytes(data.encode() if isinstance(data, str) else data)
    return path


def error_for(path, **kwargs) -> TraceError:
    with pytest.raises(TraceError) as caught:
        load_trace(path, **kwargs)
    return caught.value


def assert_azure_rows(trace):
    assert trace.prompt_tokens.tolist() == [4808, 3180]
    assert trace.output_tokens.tolist() == [10, 8]
    assert trace.arrival_s.tolist() == pytest.approx([0.0, 0.052], abs=1e-9)


@pytest.mark.parametrize("ending", ["\r\n", "\r"])
def test_crlf_and_bare_cr_line_endings_read_like_newlines(tmp_path, ending):
    assert_azure_rows(load_trace(write(tmp_path, "a.csv", AZURE.replace("\n", ending))))
    trace = load_trace(write(tmp_path, "m.jsonl", MOONCAKE.replace("\n", ending)))
    assert list(trace.block_hashes) == [(1, 2), (1,)]
    bad = AZURE.replace("\n", ending) + f"2023-11-16 18:17:05.0,x,1{ending}"
    error = error_for(write(tmp_path, "bad.csv", bad))
    assert (error.line, error.field) == (4, "ContextTokens")


def test_byte_order_mark_is_skipped(tmp_path):
    assert_azure_rows(load_trace(write(tmp_path, "a.csv", "\ufeff" + AZURE)))
    assert load_trace(write(tmp_path, "m.jsonl", "\ufeff" + MOONCAKE)).output_tokens.tolist() == [5, 3]


def test_gzip_and_zstd_are_found_by_magic_bytes_not_name(tmp_path):
    assert_azure_rows(load_trace(write(tmp_path, "plain_name.csv", gzip.compress(AZURE.encode()))))
    frames = b"".join(zstandard.ZstdCompressor().compress(line.encode())
                      for line in MOONCAKE.splitlines(keepends=True))  # two zstd frames
    assert load_trace(write(tmp_path, "m.jsonl", frames)).prompt_tokens.tolist() == [600, 100]


@pytest.mark.parametrize("kind", ["gzip", "zstd"])
def test_truncated_compressed_files_are_refused(tmp_path, kind):
    packed = (gzip.compress(MOONCAKE.encode()) if kind == "gzip"
              else zstandard.ZstdCompressor().compress(MOONCAKE.encode()))
    error = error_for(write(tmp_path, "cut.jsonl", packed[:-5]))
    assert "cut.jsonl" in str(error) and f"truncated {kind}" in str(error)


@pytest.mark.parametrize(
    ("data", "words"),
    [
        (bytes(range(256)) * 4, "NUL byte"),
        (b"PK\x03\x04" + bytes(40), "zip data"),
        (AZURE.encode("utf-16"), "UTF-16"),
        (gzip.compress(gzip.compress(AZURE.encode())), "compressed twice"),
    ],
)
def test_binary_and_foreign_encodings_are_refused(tmp_path, data, words):
    error = error_for(write(tmp_path, "odd.csv", data))
    assert "odd.csv" in str(error) and words in str(error) and "Fix:" in str(error)


@pytest.mark.parametrize(("name", "text"), [
    ("bad.csv", AZURE + "2023-11-16 18:17:05.0,31\xe90,8\n"),
    ("bad.jsonl", MOONCAKE + '{"timestamp": 300, "input_length": 1, "output_length": 1, "n": "\xe9"}\n'),
])
def test_invalid_utf8_names_file_and_line(tmp_path, name, text):
    error = error_for(write(tmp_path, name, text.encode("latin-1")))
    assert name in str(error) and error.line == 4 - name.endswith("jsonl") and "UTF-8" in str(error)


def test_a_line_over_the_limit_is_refused_without_echoing_it(tmp_path):
    huge = "9" * (2 * MAX_LINE_BYTES)
    error = error_for(write(tmp_path, "big.csv", AZURE + f"2023-11-16 18:17:05.0,{huge},1\n"))
    assert error.line == 4 and "longer than" in str(error) and len(str(error)) < 400


def test_a_long_field_is_quoted_short_in_the_error(tmp_path):
    error = error_for(write(tmp_path, "big.csv", AZURE + f"2023-11-16 18:17:05.0,{'x' * 100_000},1\n"))
    assert (error.line, error.field) == (4, "ContextTokens") and "non-numeric" in str(error)
    assert "xxxx... (cut)" in str(error) and len(str(error)) < 400


def test_a_field_over_the_field_limit_is_refused_in_any_column(tmp_path):
    header = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
    text = header + "5,ChatGPT,100,20,120,x\n" + f"6,{'M' * 200_000},100,20,120,x\n"
    error = error_for(write(tmp_path, "b.csv", text))
    assert (error.line, error.field) == (3, "Model") and "field longer than" in str(error)


def test_a_quoted_field_over_the_csv_field_limit_is_refused(tmp_path):
    text = VIDUR_HEADER + '0.5,10,2,"short"\n' + f'1.0,10,2,"{"x" * 200_000}"\n'
    error = error_for(write(tmp_path, "q.csv", text))
    assert error.line == 3 and "field longer than" in str(error) and len(str(error)) < 400


def test_malformed_quoting_names_the_record(tmp_path):
    error = error_for(write(tmp_path, "q.csv", VIDUR_HEADER + '0.5,10,2,ok\n1.0,10,2,"open\n'))
    assert error.line == 3 and "quoted" in str(error)
    error = error_for(write(tmp_path, "e.csv", VIDUR_HEADER + '0.5,10,2,"x"\n""\n1.0,1,1,y\n'))
    assert error.line == 3 and "found 1" in str(error)  # not skipped as a blank line
    error = error_for(write(tmp_path, "h.csv", f'"{"x" * 200_000}",' + VIDUR_HEADER + "1,1,1,1,1\n"))
    assert error.line == 1 and "field longer than" in str(error)


def test_unusable_file_names_are_a_trace_error():
    with pytest.raises(TraceError, match="not a usable file name"):
        load_trace("x" * 5000)


def test_quoted_fields_spanning_lines_and_chunks_keep_line_numbers(tmp_path):
    rows = [f'{i}.5,{i + 1},2,"note {i}\nsecond, line"\n' for i in range(40)]
    path = write(tmp_path, "q.csv", VIDUR_HEADER + "".join(rows) + "99,x,1,end\n")
    for chunk_bytes in (16, 100, None):
        with pytest.raises(TraceError) as caught:
            read_columns(path, chunk_bytes=chunk_bytes)
        assert caught.value.line == 82  # header + 40 two-line records, then the bad row
    good = write(tmp_path, "good.csv", VIDUR_HEADER + "".join(rows))
    columns = read_columns(good, chunk_bytes=16)
    assert columns.prompt_tokens.tolist() == list(range(1, 41))
    assert columns.line_numbers.tolist() == list(range(2, 82, 2))


@pytest.mark.parametrize("name", sorted(BUNDLED))
def test_bundled_traces_read_the_same_in_any_chunk_size(name):
    whole = read_columns(BUNDLED[name], chunk_bytes=1 << 20)
    small = read_columns(BUNDLED[name], chunk_bytes=3_001)  # splits CRLF pairs and lines
    for column in ("arrival_s", "prompt_tokens", "output_tokens", "line_numbers"):
        np.testing.assert_array_equal(getattr(small, column), getattr(whole, column))
    if whole.block_hashes is not None:
        np.testing.assert_array_equal(small.block_hashes.ids, whole.block_hashes.ids)
        np.testing.assert_array_equal(small.block_hashes.offsets, whole.block_hashes.offsets)


def test_leading_blank_lines_before_the_header_are_skipped(tmp_path):
    trace = load_trace(write(tmp_path, "a.csv", "\n\n" + AZURE + "\n"))
    assert_azure_rows(trace)
    error = error_for(write(tmp_path, "b.csv", "\n\n" + AZURE + "2023-11-16 18:17:05.0,x,1\n"))
    assert error.line == 6
