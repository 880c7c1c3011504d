"""Synthetic traces and the shared command-line options."""

from __future__ import annotations

import argparse
import re

import numpy as np
import pytest

from traces import (
    LengthDist,
    TraceError,
    add_trace_arguments,
    load_trace,
    synthetic,
    trace_from_args,
)
from traces.cli import main

FIXED = LengthDist.fixed(128)


def test_same_seed_same_trace_other_seed_other_trace():
    prompt = LengthDist.lognormal(median=1000, sigma=1.0, max_tokens=8000)
    output = LengthDist.uniform(1, 500)
    first = synthetic(1000, 5.0, prompt=prompt, output=output, seed=7)
    again = synthetic(1000, 5.0, prompt=prompt, output=output, seed=7)
    other = synthetic(1000, 5.0, prompt=prompt, output=output, seed=8)
    np.testing.assert_array_equal(first.arrival_s, again.arrival_s)
    np.testing.assert_array_equal(first.prompt_tokens, again.prompt_tokens)
    np.testing.assert_array_equal(first.output_tokens, again.output_tokens)
    assert not np.array_equal(first.arrival_s, other.arrival_s)
    assert first.source.startswith("synthetic:")


def test_poisson_mean_gap_is_one_over_rate():
    trace = synthetic(200_000, 4.0, prompt=FIXED, output=FIXED, seed=1)
    gaps_s = np.diff(trace.arrival_s)
    assert trace.arrival_s[0] == 0.0
    # standard error of the mean gap: 0.25 / sqrt(2e5) ~ 5.6e-4; allow ~5 sigma
    assert gaps_s.mean() == pytest.approx(0.25, abs=3e-3)
    assert gaps_s.std() / gaps_s.mean() == pytest.approx(1.0, abs=0.02)


@pytest.mark.parametrize("cv", [0.5, 3.0])
def test_gamma_arrivals_have_the_requested_cv(cv):
    trace = synthetic(200_000, 10.0, arrival="gamma", cv=cv, prompt=FIXED, output=FIXED, seed=2)
    gaps_s = np.diff(trace.arrival_s)
    assert gaps_s.mean() == pytest.approx(0.1, rel=0.03)
    assert gaps_s.std() / gaps_s.mean() == pytest.approx(cv, rel=0.05)


def test_length_distributions():
    rng = np.random.default_rng(0)
    assert set(LengthDist.fixed(64).sample(100, rng).tolist()) == {64}
    uniform = LengthDist.uniform(3, 5).sample(10_000, rng)
    assert set(uniform.tolist()) == {3, 4, 5}
    lognormal = LengthDist.lognormal(median=500, sigma=0.5, max_tokens=1000).sample(50_000, rng)
    assert np.median(lognormal) == pytest.approx(500, rel=0.03)
    assert lognormal.min() >= 1 and lognormal.max() == 1000
    by_mean = LengthDist.lognormal(mean=300, sigma=0.8).sample(200_000, rng)
    assert by_mean.mean() == pytest.approx(300, rel=0.03)
    real = load_trace("azure-code")
    empirical = LengthDist.empirical(real, "output_tokens").sample(10_000, rng)
    assert set(empirical.tolist()) <= set(real.output_tokens.tolist())


def test_length_distributions_reject_bad_parameters():
    with pytest.raises(ValueError, match="low <= high"):
        LengthDist.uniform(10, 2)
    with pytest.raises(ValueError, match="exactly one"):
        LengthDist.lognormal(median=5, mean=5, sigma=1)
    with pytest.raises(ValueError, match="unknown arrival"):
        synthetic(10, 1.0, arrival="bursty", prompt=FIXED, output=FIXED)


def test_trace_arguments_accept_bundled_names_and_loading_options():
    parser = argparse.ArgumentParser()
    add_trace_arguments(parser)
    args = parser.parse_args(["--trace", "azure-conv", "--window", "60:120", "--limit", "5",
                              "--rate-scale", "2"])
    trace = trace_from_args(args)
    expected = load_trace("azure-conv", window_s=(60.0, 120.0), limit=5, rate_scale=2.0)
    assert len(trace) == 5
    np.testing.assert_array_equal(trace.arrival_s, expected.arrival_s)
    with pytest.raises(SystemExit):
        parser.parse_args(["--trace", "x", "--window", "9:3"])
    optional = argparse.ArgumentParser()
    add_trace_arguments(optional, required=False)
    with pytest.raises(TraceError, match="--trace"):
        trace_from_args(optional.parse_args([]))


def test_describe_command_prints_a_table(capsys):
    assert main(["describe", "mooncake-conv", "--limit", "100"]) == 0
    out = capsys.readouterr().out
    assert "prompt_tokens_p99" in out and "100" in out
    assert main(["describe", "no-such-trace"]) == 2
    assert "not found" in capsys.readouterr().err
    assert main(["describe", "synthetic", "--synthetic-requests", "40", "--limit", "7"]) == 0
    assert re.search(r"count\W+7\W", capsys.readouterr().out)


def test_synthetic_trace_emptied_by_window_is_an_error():
    parser = argparse.ArgumentParser()
    add_trace_arguments(parser)
    args = parser.parse_args(["--trace", "synthetic", "--synthetic-requests", "10",
                              "--window", "1000:2000"])
    with pytest.raises(TraceError, match="--window 1000:2000"):
        trace_from_args(args)
