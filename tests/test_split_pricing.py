"""SPLIT attention priced in the simulator: the padded work of one sequence
(sim.core.split_shapes.SplitShapes.work), which steps the cost model routes through SPLIT on
each attention backend and what it charges them, the vectorised step prediction of
validation.steps, the fit of SPLIT's two efficiency terms, the `absent` value of a setting, the
shipped calibration chosen by backend and the host probe of merged profiles.

Expected values are worked out by hand in the comments, for Llama-3.1-8B on the H200:
32 layers, 32 query heads of 128 dims, 8 KV heads; 989.4 TFLOP/s bf16, 4.8 TB/s.

    FLOPs per (query, key) pair over every layer   4 x 32 heads x 128 dims x 32 layers = 524,288
    KV bytes per token                             2 x 32 layers x 8 heads x 128 x 2 B = 131,072
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import numpy as np
import pytest

from gpu_backend.engine.shapes import StepShape, scheduler_output
from sim.core import config_json
from sim.core.calibration.attention_fit import fit_attention_terms, held_attention_terms
from sim.core.calibration.merge import merge_profiles
from sim.core.calibration.select import shipped_path
from sim.core.catalog import get_gpu, get_model
from sim.core.cost_model import CostArgs, CostModel, Efficiency
from sim.core.engine_config import EngineConfig
from sim.core.settings import INT, choice, setting
from sim.core.split_shapes import SplitShapes
from sim.core.step import SchedulerOutput
from validation.step_table import StepTable, read_steps_csv, write_steps_csv
from validation.steps import predict_step_times

LLAMA_8B = get_model("llama-3.1-8b")
H200 = get_gpu("h200")
PEAK_FLOPS = 989.4e12
BANDWIDTH = 4.8e12
FLOPS_PER_PAIR = 4 * 32 * 128 * 32  # 524,288
KV_BYTES_PER_TOKEN = 2 * 32 * 8 * 128 * 2  # 131,072
LAYERS = 32

# Every term that could move a SPLIT step's price if it were (wrongly) priced as the Triton
# kernel's: its rate, the split launch and the longest program with its serial share.
EFF = Efficiency(attention_compute=0.5, memory=0.8, kv_memory=0.7,
                 split_attention_compute=0.6, split_call_s=5e-5,
                 eager_launch_s=3e-3, split_launch_s=1.2e-3,
                 attention_program=0.3, attention_program_serial=0.5,
                 launch_serial_fraction=0.3, step_overhead_s=1e-3, per_seq_overhead_s=4e-6,
                 attention_query_s=2.5e-9, mixed_decode_compute=0.25)


def test_the_catalog_shapes_the_hand_arithmetic_uses():
    assert (LLAMA_8B.num_layers, LLAMA_8B.num_attention_heads, LLAMA_8B.num_kv_heads,
            LLAMA_8B.head_dim) == (32, 32, 8, 128)
    assert LLAMA_8B.kv_bytes_per_token() == KV_BYTES_PER_TOKEN
    assert (H200.peak_bf16_flops, H200.memory_bandwidth_bytes_s) == (PEAK_FLOPS, BANDWIDTH)


def step(prefills: tuple[tuple[int, int], ...] = (), decodes: tuple[int, ...] = ()
         ) -> SchedulerOutput:
    """The SchedulerOutput of prefill chunks (new, prefix) beside decode rows of the given
    contexts (sequence length after the step)."""
    kind = "decode" if not prefills else "mixed" if decodes else "prefill"
    return scheduler_output(StepShape(kind, prefills, decodes))


# ------------------------------------------------------------------------ SplitShapes.work
@pytest.mark.parametrize("query, prefix, pairs, calls", [
    # no prefix: one causal square of square_rows(2,048) = 2,048 rows (1,024 x 2^1 x 8/8),
    # half its products: 2,048^2 / 2 = 2,097,152
    (2048, 0, 2048 * 2048 / 2, 1),
    # 6,144 = 6 x 1,024: nothing absorbed; 8,192 > 6,144, so segments of 4,096 then 2,048
    # keys; square_rows(2,048) = 2,048, segment_rows(2,048) = 2,048 (1,024 x 2 x 8/8):
    # 2,048^2 / 2 + 2,048 x (4,096 + 2,048) = 2,097,152 + 12,582,912; the square + 2 calls
    (2048, 6144, 2048 * 2048 / 2 + 2048 * 6144, 3),
    # 1,500 = 1,024 + 476: one 1,024-key segment, 476 keys absorbed into the square;
    # square_rows(476 + 1,500 = 1,976): 1,024, 1,152, 1,536 are short, 2,048 holds it;
    # segment_rows(1,500): 1,024 short, 1,536 (1,024 x 12/8) holds it:
    # 2,048^2 / 2 + 1,536 x 1,024 = 2,097,152 + 1,572,864
    (1500, 1500, 2048 * 2048 / 2 + 1536 * 1024, 2),
    # a full chunk plus the largest remainder: 9,215 = 8,192 + 1,023, one 8,192 segment and
    # 1,023 absorbed; square_rows(1,023 + 8,192 = 9,215) is the 9/8 step of 8,192 = 9,216
    # (not 12,288); segment_rows(8,192) = 8,192: 9,216^2 / 2 + 8,192 x 8,192
    (8192, 9215, 9216 * 9216 / 2 + 8192 * 8192, 2),
    # a 512-token chunk pads to the 1,024 smallest rows: 3,000 = 2,048 + 952;
    # square_rows(952 + 512 = 1,464) = 1,536, segment_rows(512) = 1,024:
    # 1,536^2 / 2 + 1,024 x 2,048 = 1,179,648 + 2,097,152
    (512, 3000, 1536 * 1536 / 2 + 1024 * 2048, 2),
])
def test_split_work_is_the_padded_square_half_and_every_segment_in_full(query, prefix, pairs,
                                                                          calls):
    work = SplitShapes().work(query, prefix)
    assert work.pairs == pairs
    assert work.calls == calls


# --------------------------------------------------------------------- cost model routing
def split_attention_hand(pairs: float, calls: int, keys: int, decode_context: int) -> float:
    """SPLIT's attention at EFF: padded products at 0.6 of the peak, 50 us per call and
    layer, the sequences' keys gathered (read and written once at memory 0.8), the decode
    rows' keys read at kv_memory 0.7."""
    return (pairs * FLOPS_PER_PAIR / (PEAK_FLOPS * 0.6) + calls * LAYERS * 5e-5
            + 2 * keys * KV_BYTES_PER_TOKEN / (BANDWIDTH * 0.8)
            + decode_context * KV_BYTES_PER_TOKEN / (BANDWIDTH * 0.7))


def test_auto_prices_a_step_whose_chunks_are_all_short_as_the_triton_kernel():
    out = step(((1024, 3072),), (4000,) * 16)
    auto = CostModel(LLAMA_8B, H200, efficiency=EFF, attention_backend="auto").step(out)
    triton = CostModel(LLAMA_8B, H200, efficiency=EFF).step(out)
    assert auto == triton
    # one more token short of the threshold, and two short chunks: still the Triton kernel
    for other in (step(((2047, 0),), (4000,) * 16), step(((1024, 0), (1023, 5000)))):
        assert (CostModel(LLAMA_8B, H200, efficiency=EFF, attention_backend="auto").step(other)
                == CostModel(LLAMA_8B, H200, efficiency=EFF).step(other))


def test_auto_prices_a_2048_token_chunk_as_split_work_calls_gather_and_decode_reads():
    """A 2,048-token chunk over 6,144 cached keys beside 16 decode rows of 4,000 keys:
        products  14,680,064 pairs (SplitShapes.work above) x 524,288 / (989.4e12 x 0.6)
                  = 12.965 ms
        calls     3 calls x 32 layers x 50 us = 4.8 ms
        gather    2 x 8,192 keys x 131,072 B / (4.8e12 x 0.8) = 0.559 ms
        decodes   64,000 keys x 131,072 B / (4.8e12 x 0.7) = 2.497 ms
                  (read, not the 128-row tiles of a Triton mixed launch)
    = 20.821 ms, with no longest-program term although attention_program is set."""
    out = step(((2048, 6144),), (4000,) * 16)
    expected = split_attention_hand(2048 * 2048 / 2 + 2048 * 6144, 3, 8192, 64000)
    assert expected == pytest.approx(20.821e-3, rel=1e-4)
    auto = CostModel(LLAMA_8B, H200, efficiency=EFF, attention_backend="auto").step(out)
    assert auto.attention_s == pytest.approx(expected, rel=1e-12)
    split = CostModel(LLAMA_8B, H200, efficiency=EFF, attention_backend="split").step(out)
    assert split.attention_s == pytest.approx(expected, rel=1e-12)
    triton = CostModel(LLAMA_8B, H200, efficiency=EFF).step(out)
    assert triton.attention_s != pytest.approx(expected, rel=1e-3)
    # the other operators do not depend on the backend
    assert (auto.linear_s, auto.logits_s, auto.overhead_s) == (
        triton.linear_s, triton.logits_s, triton.overhead_s)


def test_the_split_backend_sends_a_short_chunk_through_split_too():
    """512 new tokens over 3,000 cached: 1,536^2 / 2 + 1,024 x 2,048 = 3,276,800 padded pairs
    in 2 calls, 3,512 keys gathered:
        3,276,800 x 524,288 / (989.4e12 x 0.6) = 2.894 ms
        2 x 32 x 50 us = 3.2 ms;  2 x 3,512 x 131,072 / (4.8e12 x 0.8) = 0.240 ms
    = 6.334 ms. On auto the same step runs the Triton kernel."""
    out = step(((512, 3000),))
    expected = split_attention_hand(1536 * 1536 / 2 + 1024 * 2048, 2, 3512, 0)
    assert expected == pytest.approx(6.334e-3, rel=1e-4)
    split = CostModel(LLAMA_8B, H200, efficiency=EFF, attention_backend="split")
    assert split.step(out).attention_s == pytest.approx(expected, rel=1e-12)
    auto = CostModel(LLAMA_8B, H200, efficiency=EFF, attention_backend="auto")
    assert auto.step(out) == CostModel(LLAMA_8B, H200, efficiency=EFF).step(out)


def test_a_short_chunk_beside_a_split_one_is_priced_as_triton_prefill_pairs():
    """auto: chunks of 2,048 (no prefix) and 300 (over 700) beside 8 decode rows of 2,000:
        SPLIT 2,048   2,048^2 / 2 = 2,097,152 pairs x 524,288 / (989.4e12 x 0.6) = 1.852 ms
                      + 1 call x 32 x 50 us = 1.6 ms
                      + 2 x 2,048 x 131,072 / (4.8e12 x 0.8) = 0.140 ms
        Triton 300    300 x (700 + 300 / 2) = 255,000 pairs x 524,288 / (989.4e12 x 0.5)
                      = 0.270 ms (causal pairs, unpadded, at attention_compute)
                      + 300 query tokens x 8 KV heads x 32 layers x 2.5 ns = 0.192 ms
        decodes       16,000 keys x 131,072 / (4.8e12 x 0.7) = 0.624 ms
    = 4.678 ms."""
    out = step(((2048, 0), (300, 700)), (2000,) * 8)
    expected = (split_attention_hand(2048 * 2048 / 2, 1, 2048, 16000)
                + 300 * (700 + 150) * FLOPS_PER_PAIR / (PEAK_FLOPS * 0.5) + 300 * 8 * 32 * 2.5e-9)
    assert expected == pytest.approx(4.678e-3, rel=1e-4)
    auto = CostModel(LLAMA_8B, H200, efficiency=EFF, attention_backend="auto")
    assert auto.step(out).attention_s == pytest.approx(expected, rel=1e-12)
    # on split the 300 runs SPLIT too: 1,024 square rows over 700 absorbed keys (no segment)
    split = CostModel(LLAMA_8B, H200, efficiency=EFF, attention_backend="split")
    both = split_attention_hand(2048 * 2048 / 2 + 1024 * 1024 / 2, 2, 2048 + 1000, 16000)
    assert split.step(out).attention_s == pytest.approx(both, rel=1e-12)


def test_a_step_running_split_pays_no_split_launch_and_no_longest_program():
    """256 new tokens over 8,192 cached: on the Triton kernel 256 // 32 + 1 = 9 tiles x 8 KV
    heads = 72 programs < 132 SMs, so its keys split (1.2 ms more launch) and its longest
    program binds; on split the step launches eagerly (3 ms) and its attention is SPLIT's:
    square_rows(0 + 256) = 1,024 rows, segment_rows(256) = 1,024 over one 8,192 segment:
    1,024^2 / 2 + 1,024 x 8,192 = 8,912,896 pairs in 2 calls, 8,448 keys gathered."""
    out = step(((256, 8192),))
    triton = CostModel(LLAMA_8B, H200, efficiency=EFF).step(out)
    assert triton.launch_s == pytest.approx(3e-3 + 1.2e-3)  # the Triton path splits here
    split = CostModel(LLAMA_8B, H200, efficiency=EFF, attention_backend="split").step(out)
    assert split.launch_s == pytest.approx(3e-3)
    expected = split_attention_hand(1024 * 1024 / 2 + 1024 * 8192, 2, 8448, 0)
    assert split.attention_s == pytest.approx(expected, rel=1e-12)
    # device time d > the 3 ms launch: d + 0.3 x 3 ms (launch_serial_fraction) + overhead
    assert split.device_s > 3e-3
    assert split.total_s == pytest.approx(
        split.device_s + 0.3 * 3e-3 + EFF.step_overhead_s + EFF.per_seq_overhead_s)


def test_decode_only_steps_read_their_keys_on_every_backend():
    out = step((), (4000,) * 16)
    triton = CostModel(LLAMA_8B, H200, efficiency=EFF).step(out)
    for backend in ("split", "auto"):
        other = CostModel(LLAMA_8B, H200, efficiency=EFF, attention_backend=backend).step(out)
        assert other == triton
    assert triton.attention_s == pytest.approx(64000 * KV_BYTES_PER_TOKEN / (BANDWIDTH * 0.7))


def test_flashinfer_runs_a_mixed_steps_decode_rows_apart_whatever_their_keys():
    # a 2,048-token chunk over 6,144 cached beside 16 decode rows of 4,000 keys (64,000 keys):
    #   pairs 2,048 x (6,144 + 1,024) = 14,680,064, at 0.5 x 989.4 TFLOP/s:
    #     14,680,064 x 524,288 / 494.7e12 = 15.558 ms; query tokens 2,048 x 2.5e-9 x 8 x 32
    #     = 1.311 ms; the decode rows as reads: 64,000 x 131,072 / (0.7 x 4.8e12) = 2.497 ms;
    #   the prefill launch's longest program, 8,192 keys of a 128-row tile at 0.3 of one of
    #     132 SMs: 8,192 x 4 x 128 x 128 x 32 / (0.3 x 989.4e12 / 132) = 7.640 ms, shorter
    #     than the launch's work, which it adds to at 0.5 (attention_program_serial);
    #   launch: eager 3 ms + two more launches per layer, 2 x 1.2 ms
    out = step(((2048, 6144),), (4000,) * 16)
    pairs = 2048 * (6144 + 1024)
    program = 8192 * 4 * 128 * 128 * LAYERS / (0.3 * PEAK_FLOPS / 132)
    expected = (pairs * FLOPS_PER_PAIR / (0.5 * PEAK_FLOPS) + 2048 * 2.5e-9 * 8 * LAYERS
                + 0.5 * program + 64000 * KV_BYTES_PER_TOKEN / (0.7 * BANDWIDTH))
    for min_keys in (0, 10**9):  # the Triton kernel's threshold does not apply
        cost = CostModel(LLAMA_8B, H200, efficiency=EFF, attention_backend="flashinfer",
                         mixed_split_min_keys=min_keys)
        priced = cost.step(out)
        assert priced.attention_s == pytest.approx(expected, rel=1e-12)
        assert priced.launch_s == pytest.approx(3e-3 + 2 * 1.2e-3, rel=1e-12)
    one_launch = CostModel(LLAMA_8B, H200, efficiency=EFF).step(out)
    assert one_launch.attention_s > expected  # beside the chunk: a tile's FLOPs per key
    decode_only = step((), (4000,) * 16)
    assert (CostModel(LLAMA_8B, H200, efficiency=EFF, attention_backend="flashinfer")
            .step(decode_only) == CostModel(LLAMA_8B, H200, efficiency=EFF).step(decode_only))


def test_an_engine_config_prices_with_its_attention_backend():
    out = step(((2048, 6144),), (4000,) * 16)
    expected = split_attention_hand(2048 * 2048 / 2 + 2048 * 6144, 3, 8192, 64000)
    auto = CostModel.for_engine(EngineConfig(attention_backend="auto"), EFF)
    assert auto.attention_backend == "auto"
    assert auto.step(out).attention_s == pytest.approx(expected, rel=1e-12)
    triton = CostModel.for_engine(EngineConfig(), EFF)
    assert triton.step(out).attention_s != pytest.approx(expected, rel=1e-3)
    with pytest.raises(ValueError, match="attention backend 'flash'"):
        CostModel(LLAMA_8B, H200, attention_backend="flash")


# ------------------------------------------------------------------ vectorised prediction
STEPS = [
    step((), (3000,) * 8),  # decode only
    step(((300, 0),)),  # short prefill alone: Triton
    step(((256, 8192),)),  # short chunk whose Triton keys split (auto: Triton; split: SPLIT)
    step(((1024, 2048),), (4000,) * 16),  # auto: Triton beside decodes
    step(((2048, 0),)),  # auto: SPLIT
    step(((2048, 6144),), (4000,) * 16),  # auto: SPLIT beside decodes
    step(((2048, 0), (300, 700)), (2000,) * 8),  # auto: SPLIT + a Triton chunk
    step(((4096, 12288),), (27000,) * 4),  # auto: SPLIT, long decode rows
]


def table_of(tmp_path: Path, outputs: list[SchedulerOutput], with_chunks: bool = True
             ) -> StepTable:
    """The steps written to a steps.csv (prefill_chunks column where `with_chunks`) and read
    back, as a replay's are."""
    n = len(outputs)
    table = StepTable(
        num_prefill_tokens=np.array([o.num_prefill_tokens for o in outputs]),
        num_decode_tokens=np.array([o.num_decode_tokens for o in outputs]),
        decode_context_tokens=np.array([o.decode_context_tokens for o in outputs]),
        num_seqs=np.array([len(o.scheduled) for o in outputs]),
        num_sampled_rows=np.array([o.num_sampled_rows for o in outputs]),
        prefill_pairs=np.zeros(n), duration_s=np.full(n, 0.01),
        extra={"max_decode_context": np.array([max((r.num_computed_tokens + 1
                                                     for r in o.scheduled if r.is_decode),
                                                    default=0) for o in outputs], dtype=float)})
    chunks = [";".join(f"{c}:{p}" for c, p in o.prefill_chunks) for o in outputs]
    path = tmp_path / "steps.csv"
    write_steps_csv(path, table, chunks if with_chunks else None)
    return read_steps_csv(path)


@pytest.mark.parametrize("backend", ["triton", "split", "auto", "flashinfer"])
@pytest.mark.parametrize("graphs", [False, True])
def test_step_prediction_equals_the_cost_models_steps_on_every_backend(tmp_path, backend,
                                                                       graphs):
    table = table_of(tmp_path, STEPS)
    sizes = ((1, 2, 4, 8, 16, 32), (16, 256, 512, 1024, 2048, 4096)) if graphs else ((), ())
    cost = CostModel(LLAMA_8B, H200, 1, EFF, *sizes, attention_backend=backend)
    want = [cost.step(o).total_s for o in STEPS]
    np.testing.assert_allclose(predict_step_times(cost, table), want, rtol=1e-9)


def test_the_prediction_moves_only_the_steps_that_run_split(tmp_path):
    table = table_of(tmp_path, STEPS)
    triton = predict_step_times(CostModel(LLAMA_8B, H200, 1, EFF), table)
    auto = predict_step_times(CostModel(LLAMA_8B, H200, 1, EFF, attention_backend="auto"), table)
    runs_split = np.array([max((c for c, _ in o.prefill_chunks), default=0) >= 2048
                           for o in STEPS])
    assert runs_split.sum() == 4
    np.testing.assert_array_equal(auto[~runs_split], triton[~runs_split])
    assert np.all(np.abs(auto[runs_split] / triton[runs_split] - 1) > 1e-3)


def test_steps_without_their_chunks_cannot_be_priced_on_a_split_backend(tmp_path):
    table = table_of(tmp_path, STEPS, with_chunks=False)
    assert table.prefill_chunks is None
    predict_step_times(CostModel(LLAMA_8B, H200, 1, EFF), table)  # Triton needs only pairs
    for backend in ("auto", "split"):
        cost = CostModel(LLAMA_8B, H200, 1, EFF, attention_backend=backend)
        with pytest.raises(ValueError, match=f"{backend} attention backend need.*prefill_chunks"):
            predict_step_times(cost, table)
    flashinfer = CostModel(LLAMA_8B, H200, 1, EFF, attention_backend="flashinfer")
    with pytest.raises(ValueError, match="flashinfer attention backend need.*prefill_chunks"):
        predict_step_times(flashinfer, table)  # its mixed steps launch their chunks alone
    decode_only = table_of(tmp_path, STEPS[:1], with_chunks=False)  # nothing to route
    cost = CostModel(LLAMA_8B, H200, 1, EFF, attention_backend="auto")
    assert predict_step_times(cost, decode_only)[0] == pytest.approx(cost.step(STEPS[0]).total_s)


# ------------------------------------------------------------------------------------ fits
TRUE = Efficiency(attention_compute=0.4, split_attention_compute=0.6, split_call_s=5e-5)
# auto: SPLIT steps of 1, 3, 1, 5 and 2 calls and very different products per call
SPLIT_GRID = [step(((2048, 0),)), step(((2048, 6144),)), step(((4096, 0),)),
              step(((2048, 15360),)), step(((3000, 1024),), (3000,) * 16)]
TRITON_GRID = [step(((256, 0),)), step(((512, 1024),)), step(((1024, 0),)),
               step(((1536, 4096),)), step(((1024, 0),), (3000,) * 16)]


def attention_times(backend: str, outputs: list[SchedulerOutput]) -> np.ndarray:
    cost = CostModel(LLAMA_8B, H200, 1, TRUE, attention_backend=backend)
    return np.array([cost.step(o).attention_s for o in outputs])


def test_an_auto_profile_fits_splits_rate_and_cost_per_call():
    outputs = SPLIT_GRID + TRITON_GRID
    args = CostArgs(LLAMA_8B, H200, 1, "auto")
    assert held_attention_terms(args, outputs) == ()
    fitted, error = fit_attention_terms(args, outputs, attention_times("auto", outputs))
    assert fitted.split_attention_compute == pytest.approx(0.6, rel=0.03)
    assert fitted.split_call_s == pytest.approx(5e-5, rel=0.03)
    assert fitted.attention_compute == pytest.approx(0.4, rel=0.03)
    assert error["max_abs_rel"] < 0.01


def test_split_terms_are_held_where_fewer_than_three_steps_run_split():
    args = CostArgs(LLAMA_8B, H200, 1, "auto")
    assert held_attention_terms(args, TRITON_GRID) == ("split_attention_compute", "split_call_s")
    assert held_attention_terms(args, SPLIT_GRID[:2] + TRITON_GRID) == (
        "split_attention_compute", "split_call_s")
    assert held_attention_terms(args, SPLIT_GRID[:3] + TRITON_GRID) == ()
    # on the triton backend no step runs SPLIT, whatever its chunks
    assert held_attention_terms(CostArgs(LLAMA_8B, H200), SPLIT_GRID) == (
        "split_attention_compute", "split_call_s")
    start = Efficiency(split_attention_compute=0.5)  # split_call_s 0: the bottom of its range
    fitted, _ = fit_attention_terms(args, TRITON_GRID, attention_times("auto", TRITON_GRID),
                                    start=start)
    assert (fitted.split_attention_compute, fitted.split_call_s) == (0.5, 0.0)
    assert fitted.attention_compute == pytest.approx(0.4, rel=0.03)


def test_a_flashinfer_profile_holds_the_decode_rows_rate_beside_a_chunk():
    """On flashinfer every mixed step runs its decode rows apart (reads), so no step tells
    their rate beside a chunk; the Triton-form terms fit FlashInfer's launches."""
    args = CostArgs(LLAMA_8B, H200, 1, "flashinfer")
    assert held_attention_terms(args, TRITON_GRID) == (
        "split_attention_compute", "split_call_s", "mixed_decode_compute")
    # the Triton kernel's profile of the same grid runs its mixed step in one launch
    assert "mixed_decode_compute" not in held_attention_terms(CostArgs(LLAMA_8B, H200),
                                                              TRITON_GRID)
    fitted, error = fit_attention_terms(args, TRITON_GRID,
                                        attention_times("flashinfer", TRITON_GRID),
                                        start=Efficiency(mixed_decode_compute=0.2))
    assert fitted.attention_compute == pytest.approx(0.4, rel=0.03)
    assert error["max_abs_rel"] < 0.01


def test_a_split_profile_holds_the_triton_terms_and_fits_splits():
    """On split every prefill runs SPLIT (its decode rows are reads): no step tells the Triton
    prefill kernel's terms."""
    args = CostArgs(LLAMA_8B, H200, 1, "split")
    outputs = SPLIT_GRID + TRITON_GRID
    assert held_attention_terms(args, outputs) == (
        "attention_compute", "attention_program", "attention_program_serial",
        "attention_query_s", "mixed_decode_compute")
    start = Efficiency(attention_compute=0.3, attention_program=0.2)
    fitted, _ = fit_attention_terms(args, outputs, attention_times("split", outputs),
                                    start=start)
    assert (fitted.attention_compute, fitted.attention_program,
            fitted.attention_program_serial) == (0.3, 0.2, 0.0)
    assert fitted.split_attention_compute == pytest.approx(0.6, rel=0.03)
    assert fitted.split_call_s == pytest.approx(5e-5, rel=0.03)


# --------------------------------------------------------------------------- Setting.absent
MODES = ("fast", "careful")


@dataclass(frozen=True)
class Knobs:
    # files written before `mode` existed ran "careful"; a new configuration is "fast"
    mode: str = field(default="fast", metadata=setting(
        "how to run", "--mode", codec=choice(MODES), choices=MODES, absent="careful"))
    size: int = field(default=4, metadata=setting("how many", "--size", codec=INT))


def test_a_recorded_configuration_missing_a_key_ran_its_absent_value_a_written_one_the_default():
    assert Knobs().mode == "fast"
    recorded = partial(config_json.from_dict, Knobs, source="run/config.json", recorded=True)
    assert recorded({}) == Knobs(mode="careful", size=4)
    assert recorded({"size": 8}) == Knobs("careful", 8)
    assert recorded({"mode": "fast"}) == Knobs("fast", 4)
    assert recorded(config_json.to_dict(Knobs())) == Knobs()
    assert config_json.from_dict(Knobs, {"size": 8}, "knobs.json") == Knobs("fast", 8)


def test_an_engine_config_file_names_its_attention_backend_or_ran_triton():
    assert EngineConfig.from_dict({}, recorded=True).attention_backend == "triton"
    assert EngineConfig.from_dict({"attention_backend": "auto"}).attention_backend == "auto"
    config = EngineConfig(attention_backend="split")
    assert EngineConfig.from_json(config.to_json()) == config
    with pytest.raises(ValueError, match="attention_backend.*flash"):
        EngineConfig.from_dict({"attention_backend": "flash"}, "run/config.json")
    with pytest.raises(ValueError, match="--attention-backend 'flash': give one of triton"):
        EngineConfig(attention_backend="flash")


# ------------------------------------------------------------------------------ selection
def test_a_run_takes_the_calibration_of_its_attention_backend_else_the_triton_one(tmp_path):
    root = tmp_path / "calibration"
    folder = root / "h200"
    folder.mkdir(parents=True)
    for name in ("llama-3.1-8b.json", "llama-3.1-8b-auto.json", "llama-3.1-8b-piecewise.json"):
        (folder / name).write_text("{}")
    assert shipped_path("llama-3.1-8b", "h200", "eager", root, attention_backend="auto") == (
        folder / "llama-3.1-8b-auto.json")
    assert shipped_path("llama-3.1-8b", "h200", "eager", root) == folder / "llama-3.1-8b.json"
    # no split file: the Triton kernel's
    assert shipped_path("llama-3.1-8b", "h200", "eager", root, attention_backend="split") == (
        folder / "llama-3.1-8b.json")
    # an auto file of another engine kind is not taken: the piecewise engine's Triton one is
    assert shipped_path("llama-3.1-8b", "h200", "piecewise", root,
                        attention_backend="auto") == folder / "llama-3.1-8b-piecewise.json"
    (folder / "llama-3.1-8b-piecewise-auto.json").write_text("{}")
    assert shipped_path("llama-3.1-8b", "h200", "piecewise", root,
                        attention_backend="auto") == folder / "llama-3.1-8b-piecewise-auto.json"
    # a capped engine on auto: the uncapped piecewise auto file before the capped Triton one
    # (the run's backend first, then the engine kind's fallbacks)
    (folder / "llama-3.1-8b-piecewise512.json").write_text("{}")
    assert shipped_path("llama-3.1-8b", "h200", "piecewise512", root,
                        attention_backend="auto") == folder / "llama-3.1-8b-piecewise-auto.json"
    assert shipped_path("llama-3.1-8b", "h200", "piecewise512", root) == (
        folder / "llama-3.1-8b-piecewise512.json")
    (folder / "llama-3.1-8b-auto.json").unlink()
    assert shipped_path("llama-3.1-8b", "h200", "eager", root, attention_backend="auto") == (
        folder / "llama-3.1-8b.json")
    assert shipped_path("llama-3.2-3b", "h200", "eager", root, attention_backend="auto") is None


# ---------------------------------------------------------------------------------- merge
def profile(measured_s: list[float], probe_s: list[float]) -> dict:
    points = [{"kind": "prefill", "prefills": [[n, 0]], "measured_s": m, "host_probe_s": h}
              for n, m, h in zip((16, 256, 1024, 2048, 4096), measured_s, probe_s)]
    return {"model": "llama-3.1-8b", "gpu_preset": "h200-141gb", "piecewise_sizes": None,
            "measurements": points,
            "host_probe": {"iterations": 20000, "count": len(points), "median_s": 1.0,
                           "p10_s": 1.0, "p90_s": 1.0}}


def test_merged_profiles_summarize_the_host_probe_over_the_merged_points():
    """Per point, the median of the three profiles' host_probe_s:
        point   base   a      b      median
        1       0.010  0.020  0.012  0.012
        2       0.008  0.030  0.009  0.009
        3       0.011  0.010  0.025  0.011
        4       0.015  0.014  0.013  0.014
        5       0.009  0.040  0.020  0.020
    sorted 0.009, 0.011, 0.012, 0.014, 0.020: median 0.012; the 10th percentile at rank
    0.1 x 4 = 0.4: 0.009 + 0.4 x 0.002 = 0.0098; the 90th at rank 3.6: 0.014 + 0.6 x 0.006
    = 0.0176."""
    base = profile([1.0] * 5, [0.010, 0.008, 0.011, 0.015, 0.009])
    a = profile([2.0] * 5, [0.020, 0.030, 0.010, 0.014, 0.040])
    b = profile([3.0] * 5, [0.012, 0.009, 0.025, 0.013, 0.020])
    merged = merge_profiles(base, [a, b], ["a.json", "b.json"])
    assert [p["host_probe_s"] for p in merged["measurements"]] == pytest.approx(
        [0.012, 0.009, 0.011, 0.014, 0.020])
    probe = merged["host_probe"]
    assert probe["iterations"] == 20000 and probe["count"] == 5
    assert probe["median_s"] == pytest.approx(0.012)
    assert probe["p10_s"] == pytest.approx(0.0098)
    assert probe["p90_s"] == pytest.approx(0.0176)
    assert base["host_probe"]["median_s"] == 1.0  # the base profile is left as it was
    # a profile without a host probe gets none
    plain = {k: v for k, v in base.items() if k != "host_probe"}
    assert "host_probe" not in merge_profiles(plain, [a], ["a.json"])


def test_profiles_merge_into_one_with_the_median_timing():
    base = profile([1.0, 2.0, 3.0, 4.0, 5.0], [0.01] * 5)
    others = [profile([1.2, 1.0, 3.3, 4.4, 0.5], [0.01] * 5),
              profile([0.9, 2.5, 2.9, 4.1, 5.5], [0.01] * 5)]
    merged = merge_profiles(base, others, ["a.json", "b.json"])
    assert [p["measured_s"] for p in merged["measurements"]] == [1.0, 2.0, 3.0, 4.1, 5.0]
    assert merged["merged_from"] == ["a.json", "b.json"]
    with pytest.raises(ValueError, match="c.json: model"):
        merge_profiles(base, [{**base, "model": "llama-3.2-3b"}], ["c.json"])
