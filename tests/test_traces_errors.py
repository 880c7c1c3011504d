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
        ("2023-11-16 18:17:05.0,12.5,3\n", "ContextTokens", "not a whole number"),
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


@pytest.mark.parametrize(
    ("text", "fmt"),
    [("", None), (AZURE_HEADER, None), ("\n\n", None), ("", "azure"), (AZURE_HEADER, "azure"),
     (" \n\n", "azure"), ("", "mooncake"), ("\n\n", "mooncake")],
)
def test_empty_files_are_rejected(tmp_path, text, fmt):
    error = error_for(tmp_path, text, name="empty.csv", fmt=fmt)
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


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ("9223372036854775808", "out of range"),  # 2**63: past int64
        ("123456789012345678901234567890", "out of range"),
        ("1e30", "out of range"),
        ("-1e30", "out of range"),
        ("1000000000", "out of range"),  # a billion tokens: no real request
        ("nan", "non-numeric"),
        ("inf", "not finite"),
    ],
)
def test_token_counts_are_range_checked(tmp_path, value, words):
    error = error_for(tmp_path, AZURE_HEADER + GOOD_ROW + f"2023-11-16 18:17:05.0,{value},3\n")
    assert (error.line, error.field) == (3, "ContextTokens") and words in str(error)


@pytest.mark.parametrize(
    ("value", "field", "words"),
    [
        ("9223372036854775808", "input_length", "out of range"),
        ("1" + "0" * 400, "input_length", "out of range"),
        ("1" + "0" * 400, "timestamp", "out of range"),
        ("1e400", "timestamp", "not a finite number"),
        ("NaN", "output_length", "not a finite whole number"),
        ("-5", "output_length", "negative"),
        ("1e15", "timestamp", "not a real arrival"),
    ],
)
def test_mooncake_numbers_are_range_checked(tmp_path, value, field, words):
    values = {"timestamp": "4", "input_length": "10", "output_length": "2", field: value}
    line = "{" + ", ".join(f'"{name}": {text}' for name, text in values.items()) + "}\n"
    good = '{"timestamp": 3, "input_length": 10, "output_length": 2}\n'
    error = error_for(tmp_path, good + line, name="n.jsonl")
    assert (error.line, error.field) == (2, field) and words in str(error)


@pytest.mark.parametrize("value", ["inf", "nan", "1e300", "-1e12"])
def test_non_finite_or_absurd_arrival_times_are_refused(tmp_path, value):
    text = "arrived_at,num_prefill_tokens,num_decode_tokens\n0,1,1\n" + f"{value},1,1\n"
    error = error_for(tmp_path, text, name="v.csv")
    assert (error.line, error.field) == (3, "arrived_at")


def test_deeply_nested_json_names_its_line(tmp_path):
    good = '{"timestamp": 3, "input_length": 10, "output_length": 2}\n'
    error = error_for(tmp_path, good + "[" * 100_000 + "]" * 100_000 + "\n", name="d.jsonl")
    assert error.line == 2 and "nested too deeply" in str(error)


MOON = '{{"timestamp": {t}, "input_length": 600, "output_length": 2{extra}}}\n'


@pytest.mark.parametrize(
    ("second_extra", "words"),
    [
        (', "hash_ids": [[1], 2]', "must hold integers, found [1]"),
        (', "hash_ids": [1, "2"]', "must hold integers, found '2'"),
        (', "hash_ids": [1, 2.0]', "must hold integers, found 2.0"),
        (', "hash_ids": [1, true]', "must hold integers, found True"),
        (', "hash_ids": [9223372036854775808]', "does not fit in 64 bits"),
        ("", "no 'hash_ids' here, but line 1 has one"),
    ],
)
def test_hash_ids_are_lists_of_integers_on_every_line(tmp_path, second_extra, words):
    text = MOON.format(t=1, extra=', "hash_ids": [1, 2]') + MOON.format(t=2, extra=second_extra)
    error = error_for(tmp_path, text, name="h.jsonl")
    assert (error.line, error.field) == (2, "hash_ids") and words in str(error)


def test_hash_ids_after_a_first_line_without_them_are_an_error(tmp_path):
    text = MOON.format(t=1, extra="") + "\n" + MOON.format(t=2, extra=', "hash_ids": [1, 2]')
    error = error_for(tmp_path, text, name="h.jsonl")
    assert (error.line, error.field) == (3, "hash_ids") and "line 1 has none" in str(error)


def test_window_or_limit_that_empties_the_trace_is_an_error_naming_the_flag():
    with pytest.raises(TraceError, match=r"--window 5000:6000.*span 0 to 3501\.7"):
        load_trace("azure-conv", window_s=(5000.0, 6000.0))
    with pytest.raises(TraceError, match="--limit 0"):
        load_trace("azure-conv", limit=0)


def test_describe_command_fails_on_an_emptying_window(capsys):
    from traces.cli import main

    assert main(["describe", "azure-code", "--window", "9000:9100"]) == 2
    assert "--window 9000:9100" in capsys.readouterr().err
    assert main(["describe", "azure-code", "--limit", "0"]) == 2


def test_a_column_named_twice_is_an_error_naming_it(tmp_path):
    text = "TIMESTAMP,ContextTokens,GeneratedTokens,contexttokens\n" + GOOD_ROW.strip() + ",5\n"
    error = error_for(tmp_path, text)
    assert error.line == 1 and error.field == "ContextTokens"
    assert "column 'ContextTokens' appears 2 times" in str(error)


def test_describe_refuses_a_repeated_column_with_exit_2(tmp_path, capsys):
    from traces.cli import main

    path = tmp_path / "dup.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens,ContextTokens\n"
                    + GOOD_ROW.strip() + ",5\n")
    assert main(["describe", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {path}: line 1: field 'ContextTokens'") and "Fix:" in err
