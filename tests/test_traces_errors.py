"""Every malformed trace raises TraceError naming the file, the line and the field."""

from __future__ import annotations

import pytest

from traces import TraceError, load_trace

AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
GOOD_ROW = "2023-11-16 18:17:03.9799600,4808,10\n"


def error_for(tmp_path, text: str, name: str = "bad.csv", **kwargs) -> TraceError:
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(TraceError) as caught:
        load_trace(path, **kwargs)
    return caught.value


@pytest.mark.parametrize(
    ("bad_row", "field", "words"),
    [
        ("2023-11-16 18:17:05.0,abc,10\n", "ContextTokens", "non-numeric"),
        ("2023-11-16 18:17:05.0,12,-3\n", "GeneratedTokens", "negative"),
        ("2023-11-16 18:17:05.0,0,3\n", "ContextTokens", "zero-length prompt"),
        ("2023-11-16 18:17:05.0,12,0\n", "GeneratedTokens", "zero output"),
        ("2023-11-16 18:17:05.0,12.5,3\n", "ContextTokens", "non-numeric"),
        ("2023-11-16 25:17:05.0,12,3\n", "TIMESTAMP", "unparseable timestamp"),
        ("2023-02-30 10:17:05.0,12,3\n", "TIMESTAMP", "unparseable timestamp"),
        ("16/11/2023 18:17:05,12,3\n", "TIMESTAMP", "unparseable timestamp"),
        ("2023-11-16 18:17:05.0+0100,12,3\n", "TIMESTAMP", "unparseable timestamp"),
        ("2023-11-16 18:17:02.0,12,3\n", "TIMESTAMP", "out of order"),
    ],
)
def test_bad_azure_rows_name_file_line_and_field(tmp_path, bad_row, field, words):
    error = error_for(tmp_path, AZURE_HEADER + GOOD_ROW + GOOD_ROW.replace("03.", "04.") + bad_row)
    message = str(error)
    assert "bad.csv" in message and "line 4" in message and f"'{field}'" in message
    assert words in message and "Fix:" in message
    assert (error.line, error.field) == (4, field)


def test_missing_column_names_it_and_lists_the_columns_found(tmp_path):
    error = error_for(tmp_path, "TIMESTAMP,ContextTokens,Output\n" + GOOD_ROW, fmt="azure")
    message = str(error)
    assert "bad.csv" in message and "line 1" in message and "'GeneratedTokens'" in message
    assert "['TIMESTAMP', 'ContextTokens', 'Output']" in message


def test_ragged_row_names_its_line(tmp_path):
    error = error_for(tmp_path, AZURE_HEADER + GOOD_ROW + "2023-11-16 18:17:04.0,5\n")
    assert "line 3" in str(error) and "expected 3" in str(error)


@pytest.mark.parametrize("text", ["", AZURE_HEADER, "\n\n"])
def test_empty_files_are_rejected(tmp_path, text):
    error = error_for(tmp_path, text, name="empty.csv")
    assert "empty.csv" in str(error) and "empty" in str(error)


def test_unknown_format_lists_the_known_ones(tmp_path):
    error = error_for(tmp_path, "when,prompt,output\n1,2,3\n", name="odd.csv")
    assert "odd.csv" in str(error) and "azure" in str(error) and "mooncake" in str(error)
    forced = error_for(tmp_path, AZURE_HEADER + GOOD_ROW, fmt="splitwise")
    assert "splitwise" in str(forced) and "vidur" in str(forced)


def test_missing_file_names_it_and_the_bundled_traces(tmp_path):
    with pytest.raises(TraceError) as caught:
        load_trace(tmp_path / "nope.csv")
    assert "nope.csv" in str(caught.value) and "not found" in str(caught.value)
    assert "azure-conv" in str(caught.value)


def test_burstgpt_zero_response_is_failed_but_zero_request_is_an_error(tmp_path):
    header = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
    error = error_for(tmp_path, header + "1,ChatGPT,5,3,8,API log\n2,ChatGPT,0,3,3,API log\n")
    assert "line 3" in str(error) and "'Request tokens'" in str(error)


@pytest.mark.parametrize(
    ("bad_line", "field", "words"),
    [
        ('{"timestamp": 5, "input_length": 10, "hash_ids": [1]}', "output_length", "missing field"),
        ('{"timestamp": 5, "input_length": "ten", "output_length": 2, "hash_ids": [1]}',
         "input_length", "non-numeric"),
        ('{"timestamp": 5, "input_length": -1, "output_length": 2, "hash_ids": [1]}',
         "input_length", "negative"),
        ('{"timestamp": 1, "input_length": 10, "output_length": 2, "hash_ids": [1]}',
         "timestamp", "out of order"),
        ('{"timestamp": 5, "input_length": 10, "output_length": 2, "hash_ids": 3}', "hash_ids", "list"),
    ],
)
def test_bad_mooncake_lines_name_file_line_and_field(tmp_path, bad_line, field, words):
    good = '{"timestamp": 3, "input_length": 10, "output_length": 2, "hash_ids": [1]}\n'
    message = str(error_for(tmp_path, good + "\n" + bad_line + "\n", name="bad.jsonl"))
    assert "bad.jsonl" in message and "line 3" in message and f"'{field}'" in message
    assert words in message


def test_invalid_json_line_is_named(tmp_path):
    good = '{"timestamp": 3, "input_length": 10, "output_length": 2}\n'
    message = str(error_for(tmp_path, good + good + '{"timestamp": 4, "input_len\n', name="b.jsonl"))
    assert "b.jsonl" in message and "line 3" in message and "invalid JSON" in message
