"""Planning under vLLM's context check: a max_model_len past the model's context is refused
(unless allowed), so a plan stops there and counts the requests it rejects, and the map marks
the cells past a model's context as such, apart from memory misfits."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from rich.console import Console

from sim.planning import EngineOptions, Executor, PlanQuery, run_plan
from sim.planning.cases import Case, SyntheticSpec, TraceSpec, trace_length
from sim.planning.gain_map import MapQuery, iter_cells
from sim.planning.map_figure import plot_map
from sim.planning.plan import MaxRateRows
from sim.planning.report import print_map
from sim.planning.sweep import fit_error, fit_status
from traces import LengthDist

QUIET = Executor(workers=1, show_progress=False)
QWEN_CONTEXT = 32_768  # Qwen2.5-0.5B-Instruct's max_position_embeddings


def vidur_trace(tmp_path: Path, prompts: list[int], output_tokens: int = 100) -> TraceSpec:
    """A trace file of these prompts, one a second, each with `output_tokens` outputs."""
    lines = ["arrived_at,num_prefill_tokens,num_decode_tokens"]
    lines += [f"{i}.0,{p},{output_tokens}" for i, p in enumerate(prompts)]
    path = tmp_path / "trace.csv"
    path.write_text("\n".join(lines) + "\n")
    return TraceSpec(source=str(path), format="vidur")


def synthetic_case(model: str, max_model_len: int, allow_long: bool = False) -> Case:
    spec = SyntheticSpec(4, 1.0, LengthDist.fixed(1024), LengthDist.fixed(16))
    options = EngineOptions(max_model_len=max_model_len, allow_long_max_model_len=allow_long)
    return Case(model, "h200", 1, 2048, "static", TraceSpec(synthetic=spec), options=options)


def test_a_max_model_len_past_the_context_reads_beyond_context_not_a_memory_misfit():
    refused = fit_error(synthetic_case("qwen2.5-0.5b", QWEN_CONTEXT + 1))
    assert fit_status(refused) == "beyond context"
    assert fit_error(synthetic_case("qwen2.5-0.5b", QWEN_CONTEXT)) is None
    assert fit_error(synthetic_case("qwen2.5-0.5b", QWEN_CONTEXT + 1, allow_long=True)) is None
    # a 70B model's weights overflow one H200 whatever the length: memory, not context
    assert fit_status(fit_error(synthetic_case("llama-3.1-70b", 4096))) == "does not fit"


def test_max_model_len_rises_to_the_longest_request_but_stops_at_the_context(tmp_path):
    # prompt + 100 outputs: 1,100, 20,100, 32,100, 33,100 and 40,100 tokens
    trace = vidur_trace(tmp_path, [1000, 20000, 32000, 33000, 40000])
    capped = trace_length(trace, EngineOptions(), "qwen2.5-0.5b")
    assert (capped.max_model_len, capped.num_too_long) == (QWEN_CONTEXT, 2)
    assert capped.note() == (
        "2 of the trace's 5 requests are longer than the model's context (32,768 tokens, its "
        "max_position_embeddings), where max_model_len stops as vLLM's does "
        "(--allow-long-max-model-len runs them): they are rejected, as vLLM rejects them")
    allowed = trace_length(trace, EngineOptions(allow_long_max_model_len=True), "qwen2.5-0.5b")
    assert (allowed.max_model_len, allowed.num_too_long, allowed.note()) == (40_100, 0, None)
    # Llama 3.2's context (131,072) holds the longest: raised to it, as before
    llama = trace_length(trace, EngineOptions(), "llama-3.2-1b")
    assert (llama.max_model_len, llama.num_too_long) == (40_100, 0)
    given = trace_length(trace, EngineOptions(max_model_len=8192), "llama-3.2-1b")
    assert (given.max_model_len, given.num_too_long) == (8192, 4)
    assert given.note().startswith("4 of the trace's 5 requests are longer than "
                                   "max_model_len (8,192 tokens): they are rejected")


def test_the_plan_runs_at_the_context_and_says_how_many_requests_it_rejects(tmp_path):
    query = PlanQuery(model="qwen2.5-0.5b", gpu="h200", tp=1,
                      trace=vidur_trace(tmp_path, [1000, 20000, 32000, 33000, 40000]),
                      chunks=(8192,), max_rate=MaxRateRows.NONE)
    result = run_plan(query, QUIET)
    assert result.length_note is not None and result.length_note.startswith("2 of the trace's")
    assert result.as_dict()["rejected_too_long"] == result.length_note
    for row in result.rows:  # the simulator rejects the same two, and runs the rest
        assert row["fits"] and row["max_model_len"] == QWEN_CONTEXT
        assert (row["num_rejected"], row["num_requests"]) == (2, 5)


def test_map_cells_past_the_context_are_beyond_context(tmp_path):
    """Qwen2.5-0.5B (context 32,768) at a 32,256-token prompt runs (32,256 + 512 outputs is
    exactly its context), one token more is beyond it; at TP 4, whose 4 does not divide its
    14 heads, the cell is invalid first."""
    query = MapQuery(gpu="h200", models=("qwen2.5-0.5b",), prompts=(32_256, 32_257),
                     tps=(1, 4), chunks=(8192,), num_requests=4)
    cells = sorted((done.cell for done in iter_cells(query, QUIET)),
                   key=lambda c: (c.tp, c.prompt_tokens))
    assert [(c.tp, c.prompt_tokens, c.status) for c in cells] == [
        (1, 32_256, "ok"), (1, 32_257, "beyond context"),
        (4, 32_256, "invalid"), (4, 32_257, "invalid")]
    beyond = cells[1]
    assert beyond.context_tokens == QWEN_CONTEXT
    assert "32,769 tokens, past qwen2.5-0.5b's context of 32,768" in beyond.reason
    console = Console(record=True, width=160)
    print_map(cells, query, console)
    text = console.export_text()
    assert "beyond context (32,768)" in text
    assert "exceed the model's N-token context; vLLM refuses such a max_model_len" in text
    assert plot_map(cells, query, tmp_path / "map.png").stat().st_size > 0


def test_map_cells_where_elastic_reclaims_often_are_marked(tmp_path):
    """Qwen2.5-0.5B's 1,024-token prompts at the map's stress rate finish in about a second,
    and elastic lends and reclaims its reserve between nearly every one of them: far more
    than twice a second, a rate at which the model's price of elastic's own cost is measured
    on one slice only. Llama-3.1-8B's 4,096-token prompts reclaim rarely: no mark."""
    query = MapQuery(gpu="h200", models=("qwen2.5-0.5b", "llama-3.1-8b"),
                     prompts=(1024, 4096), tps=(1,), chunks=(2048, 8192), num_requests=120)
    cells = {(c.model, c.prompt_tokens): c for c in (d.cell for d in iter_cells(query, QUIET))}
    often, rare = cells[("qwen2.5-0.5b", 1024)], cells[("llama-3.1-8b", 4096)]
    assert often.elastic_reclaims_per_s is not None and often.elastic_reclaims_per_s >= 2
    assert often.reclaims_often and not rare.reclaims_often
    assert rare.elastic_reclaims_per_s is not None and rare.elastic_reclaims_per_s < 2
    console = Console(record=True, width=200)
    print_map(list(cells.values()), query, console)
    text = console.export_text()
    assert " !" in text and "!: elastic's pick reclaims its reserve 2 times a second" in text
    assert "measured on five slices, Azure conversations at 5.3-6.8 reclaims a second" \
        in " ".join(text.split())
    synchronous = replace(query, async_scheduling=False)
    assert not any(d.cell.reclaims_often for d in iter_cells(synchronous, QUIET))
    assert plot_map(list(cells.values()), query, tmp_path / "map.png").stat().st_size > 0
