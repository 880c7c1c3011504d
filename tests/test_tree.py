"""The tree speaks of the product alone: no file name and no text in it tells how the project
was built (which work session or device call produced a result); git keeps that story."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HISTORY_WORDS = re.compile(
    r"session|device call|lent (h200|machine|gpu)|the device tool|status file", re.IGNORECASE)
DATED_NAME = re.compile(r"20[0-9]{2}-[01][0-9]-[0-3][0-9][a-z]\b|_call[0-9]|-call[0-9]")
DATA_SUFFIXES = (".csv", ".jsonl", ".gz", ".png", ".zst")
API_NAMES = re.compile(r"start_new_session")  # an OS process session, not a work session


def _tracked() -> list[str]:
    try:
        out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout.split("\n")
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    return [p for p in out if p]


def test_no_file_is_named_after_the_work_that_made_it():
    assert [p for p in _tracked() if DATED_NAME.search(p)] == []


def test_no_text_speaks_of_the_work_that_made_it():
    found = []
    for name in _tracked():
        path = ROOT / name
        if name.endswith(DATA_SUFFIXES) or name == "tests/test_tree.py" or not path.is_file():
            continue
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        found += [f"{name}:{i}: {line.strip()[:80]}" for i, line in
                  enumerate(text.splitlines(), 1) if HISTORY_WORDS.search(API_NAMES.sub("", line))]
    assert found == []


def test_the_patterns_catch_what_they_are_for():
    assert HISTORY_WORDS.search("measured in the ninth session's device call 3")
    assert DATED_NAME.search("calibration/profiles_2026-11-30i/x.json")
    assert not HISTORY_WORDS.search("the KV pool lends its reserve")
