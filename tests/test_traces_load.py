"""Loading real and hand-written trace files: counts, values, formats, window/limit/scale."""

from __future__ import annotations

import numpy as np
import pytest

from traces import BUNDLED, Request, Trace, TraceError, bundled, load_trace
from traces.hashes import BlockHashes

AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
BURST_HEADER = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"


def write(tmp_path, name: str, text: str):
    path = tmp_path / name
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("name", "count", "fmt"),
    [("azure-conv", 19_366, "azure"), ("azure-code", 8_819, "azure"),
     ("mooncake-conv", 12_031, "mooncake")],
)
def test_bundled_traces_load_every_row_in_order(name, count, fmt):
    trace = load_trace(name)
    assert len(trace) == count and trace.format == fmt
    assert trace.arrival_s[0] == 0.0
    assert np.all(np.diff(trace.arrival_s) >= 0)
    assert trace.prompt_tokens.min() >= 1 and trace.output_tokens.min() >= 1
    assert trace.arrival_s.dtype == np.float64 and trace.prompt_tokens.dtype == np.int64


def test_azure_conv_first_rows_match_the_raw_file():
    # 2023-11-16 18:15:46.6805900,374,44 then 18:15:50.9951690,396,109
    first, second = load_trace("azure-conv").head(2).requests()
    assert first == Request(0, 0.0, 374, 44)
    assert (second.request_id, second.prompt_tokens, second.output_tokens) == (1, 396, 109)
    assert second.arrival_s == pytest.approx(4.314579, abs=1e-6)


def test_azure_code_first_rows_match_the_raw_file():
    # 2023-11-16 18:17:03.9799600,4808,10 then 18:17:04.0319600,3180,8
    trace = load_trace(bundled("AZURE-CODE"))
    assert trace.prompt_tokens[:2].tolist() == [4808, 3180]
    assert trace.output_tokens[:2].tolist() == [10, 8]
    assert trace.arrival_s[1] == pytest.approx(0.052, abs=1e-6)


def test_mooncake_keeps_hash_ids_per_512_token_block():
    trace = load_trace("mooncake-conv")
    assert trace.hash_block_tokens == 512
    assert trace.block_hashes is not None and len(trace.block_hashes) == 12_031
    first = trace.requests()[0]
    assert (first.prompt_tokens, first.output_tokens) == (6758, 500)
    assert first.block_hashes == tuple(range(14))
    assert trace.block_hashes[1][0] == 0  # shares the first block with request 0
    assert trace.block_hashes[-1][-1] == 182_789


def test_bundled_names_are_case_insensitive_and_unknown_names_list_known_ones():
    assert bundled("Mooncake-Conv") == BUNDLED["mooncake-conv"]
    with pytest.raises(TraceError, match="azure-code"):
        bundled("azure-chat")


def test_azure_2024_variant_with_zone_and_missing_fraction(tmp_path):
    path = write(tmp_path, "week.csv", AZURE_HEADER
                 + "2024-05-10 00:00:00.009930+00:00,100,5\n"
                 + "2024-05-10 00:00:01+00:00,200,6\n"
                 + "2024-05-10 00:00:01.5+00:00,300,7\n")
    trace = load_trace(path)
    assert trace.format == "azure"
    np.testing.assert_allclose(trace.arrival_s, [0.0, 0.99007, 1.49007], atol=1e-9)
    assert trace.prompt_tokens.tolist() == [100, 200, 300]


def test_azure_seven_fraction_digits_truncate_to_microseconds(tmp_path):
    path = write(tmp_path, "a.csv", AZURE_HEADER
                 + "2023-11-16 23:59:59.9999999,1,1\n2023-11-17 00:00:00.0000001,1,1\n")
    assert load_trace(path).arrival_s[1] == pytest.approx(1e-6, abs=1e-12)


def test_burstgpt_failed_rows_are_dropped_and_counted(tmp_path):
    path = write(tmp_path, "burst.csv", BURST_HEADER
                 + "5,ChatGPT,100,20,120,Conversation log\n"
                 + "7,GPT-4,50,0,50,Conversation log\n"
                 + "9,ChatGPT,80,0,80,API log\n"
                 + "12,ChatGPT,30,3,33,API log\n")
    trace = load_trace(path)
    assert trace.format == "burstgpt" and len(trace) == 2
    assert trace.arrival_s.tolist() == [0.0, 7.0]
    assert any("dropped 2 failed rows" in note and "lines 3, 4" in note for note in trace.notes)
    kept = load_trace(path, drop_failed=False)
    assert len(kept) == 4 and kept.failed.tolist() == [False, True, True, False]
    assert kept.output_tokens.tolist() == [20, 1, 1, 3]
    assert any("kept 2 failed rows" in note for note in kept.notes)


def test_vidur_format_and_quoted_csv(tmp_path):
    path = write(tmp_path, "vidur.csv", "arrived_at,num_prefill_tokens,num_decode_tokens,note\n"
                 '0.5,10,2,"a, b"\n1.25,20,3,plain\n')
    trace = load_trace(path)
    assert trace.format == "vidur"
    assert trace.arrival_s.tolist() == [0.0, 0.75]
    assert trace.prompt_tokens.tolist() == [10, 20]


def test_out_of_order_rows_fail_unless_sorted(tmp_path):
    path = write(tmp_path, "jumbled.csv", "arrived_at,num_prefill_tokens,num_decode_tokens\n"
                 "1.0,10,1\n3.0,30,3\n2.0,20,2\n")
    with pytest.raises(TraceError) as caught:
        load_trace(path)
    message = str(caught.value)
    assert "jumbled.csv" in message and "line 4" in message and "arrived_at" in message
    assert "sort=True" in message and "--sort" in message
    trace = load_trace(path, sort=True)
    assert trace.prompt_tokens.tolist() == [10, 20, 30]
    assert trace.arrival_s.tolist() == [0.0, 1.0, 2.0]


def test_sort_reorders_mooncake_hashes_with_their_rows(tmp_path):
    path = write(tmp_path, "m.jsonl",
                 '{"timestamp": 2000, "input_length": 600, "output_length": 1, "hash_ids": [7, 8]}\n'
                 '{"timestamp": 1000, "input_length": 100, "output_length": 2, "hash_ids": [9]}\n')
    trace = load_trace(path, sort=True)
    assert list(trace.block_hashes) == [(9,), (7, 8)] and trace.output_tokens.tolist() == [2, 1]


def test_window_limit_and_rate_scale():
    full = load_trace("azure-conv")
    window = load_trace("azure-conv", window_s=(600.0, 1200.0))
    inside = (full.arrival_s >= 600.0) & (full.arrival_s < 1200.0)
    assert len(window) == int(inside.sum())
    np.testing.assert_allclose(window.arrival_s, full.arrival_s[inside] - 600.0)
    assert window.arrival_s.min() >= 0.0 and window.arrival_s.max() < 600.0
    limited = load_trace("azure-conv", window_s=(600.0, 1200.0), limit=10)
    assert len(limited) == 10
    assert limited.prompt_tokens.tolist() == window.prompt_tokens[:10].tolist()
    doubled = load_trace("azure-conv", rate_scale=2.0)
    np.testing.assert_allclose(doubled.arrival_s, full.arrival_s / 2.0)
    assert doubled.describe()["rate_per_s"] == pytest.approx(2 * full.describe()["rate_per_s"])


def test_describe_reports_counts_and_lengths():
    summary = load_trace("azure-code").describe()
    assert summary["count"] == 8_819
    assert summary["span_s"] == pytest.approx(3435.948, abs=1e-3)
    assert summary["prompt_tokens_max"] == 7_437
    assert summary["output_tokens_p50"] <= summary["output_tokens_p99"]


def test_block_hashes_rows_select_and_reorder():
    hashes = BlockHashes.from_rows([(5, 6), (), (7,), (8, 9, 10)])
    assert len(hashes) == 4 and hashes[0] == (5, 6) and hashes[1] == () and hashes[-1] == (8, 9, 10)
    assert list(hashes) == [(5, 6), (), (7,), (8, 9, 10)]
    assert list(hashes.take(np.array([3, 0, 2]))) == [(8, 9, 10), (5, 6), (7,)]
    assert list(hashes[1:3]) == [(), (7,)]
    with pytest.raises(IndexError):
        hashes[4]
    trace = Trace(arrival_s=np.arange(4.0), prompt_tokens=np.ones(4, np.int64),
                  output_tokens=np.ones(4, np.int64), block_hashes=[(5, 6), (), (7,), (8, 9, 10)])
    assert [request.block_hashes for request in trace.head(2).requests()] == [(5, 6), ()]
    assert list(trace.window(2.0, 4.0).block_hashes) == [(7,), (8, 9, 10)]
