"""Memory plan: activation reserve, KV pool and lendable blocks, against hand arithmetic."""

import json
from dataclasses import replace

import pytest

from sim.core.catalog import GIB, MIB, ModelSpec, apply_dtypes, get_gpu, get_model
from sim.core.memory_plan import (
    CUDA_GRAPH_POOL_BYTES,
    NON_TORCH_BASE_BYTES,
    ActivationProfile,
    MemoryConfig,
    activation_bytes,
    plan_memory,
)
from sim.memory_cli import main

LLAMA_8B = get_model("llama-3.1-8b")
QWEN_7B = get_model("qwen2.5-7b")
H100 = get_gpu("h100-80gb")


def test_llama_8b_activation_hand_figures():
    # Forward, per token (bf16): hidden + residual 2*4096; MLP block gate_up 2*14336 + SiLU
    # product 14336 + down output 4096 = 47104 (> attention 4096+2*1024+4096+4096 = 14336);
    # (8192 + 47104) * 2 B + 20 B of input buffers = 110,612 B/token
    assert activation_bytes(LLAMA_8B, 8192) == 8192 * 110_612  # 906,133,504
    # Sampler, 256 rows: final hidden 8192*4096*2 = 67,108,864; bf16 logits
    # 256*128256*2 = 65,667,072; fp32 temporaries 256*128256*34 = 1,116,340,224
    assert activation_bytes(LLAMA_8B, 8192, num_sample_rows=256) == 1_249_116_160


def test_activation_matches_published_vllm_peaks():
    # vLLM PR #10511 log (H100, Meta-Llama-3-8B, 256 seqs): "PyTorch activation peak 1.26GiB"
    assert activation_bytes(LLAMA_8B, 8192, num_sample_rows=256) / GIB == pytest.approx(
        1.26, rel=0.1
    )
    # llm-d-benchmark logs (H100, 8192 tokens, 1024 seqs): Llama-3.1-8B 4.76 GiB,
    # Qwen3-0.6B 5.56 GiB
    assert activation_bytes(LLAMA_8B, 8192, num_sample_rows=1024) / GIB == pytest.approx(
        4.76, rel=0.1
    )
    qwen3_06b = ModelSpec(
        "qwen3-0.6b", 28, 1024, 3072, 16, 8, 128, 151936, tie_word_embeddings=True
    )
    assert activation_bytes(qwen3_06b, 8192, num_sample_rows=1024) / GIB == pytest.approx(
        5.56, rel=0.1
    )


def test_activation_linear_in_tokens_and_growing_with_chunk():
    for tp in (1, 2, 4):
        a1, a2, a4 = (activation_bytes(QWEN_7B, n, tp=tp) for n in (1000, 2000, 4000))
        assert a2 == 2 * a1 and a4 == 2 * a2
    sizes = [activation_bytes(QWEN_7B, c, num_sample_rows=256) for c in (512, 2048, 8192, 32768)]
    assert sizes == sorted(sizes) and sizes[-1] > sizes[0]
    # the forward part splits with TP; the sampler does not (vLLM all-gathers logits)
    assert activation_bytes(QWEN_7B, 32768, tp=4) < activation_bytes(QWEN_7B, 32768) / 2


def test_activation_profile_overrides_formula():
    profile = ActivationProfile(bytes_per_token=1000.0, fixed_bytes=5 * MIB)
    assert activation_bytes(QWEN_7B, 4096, profile=profile) == 5 * MIB + 4_096_000


def test_a_profiles_graph_pool_follows_the_largest_piecewise_graph():
    """A profile measured with piecewise graphs up to 8,192 tokens holds their pool in its
    1 GB of non-torch bytes; an engine capturing up to 2,048 tokens keeps 6,144 tokens' worth
    of activations (100 kB each) less, one without piecewise graphs 8,192 tokens' less."""
    profile = ActivationProfile(bytes_per_token=100_000.0, fixed_bytes=5 * MIB,
                                non_torch_bytes=1_000_000_000, graph_tokens=8192)
    def non_torch(max_tokens: int, p: ActivationProfile = profile) -> int:
        cfg = MemoryConfig(LLAMA_8B, H100, piecewise_max_tokens=max_tokens)
        return plan_memory(cfg, p).non_torch_bytes

    assert non_torch(8192) == 1_000_000_000
    assert non_torch(2048) == 1_000_000_000 - 614_400_000
    assert non_torch(0) == 1_000_000_000 - 819_200_000
    assert non_torch(16384) == 1_000_000_000 + 819_200_000
    assert non_torch(0, replace(profile, graph_tokens=None)) == 1_000_000_000  # not known
    plans = [plan_memory(MemoryConfig(LLAMA_8B, H100, piecewise_max_tokens=n), profile)
             for n in (8192, 2048)]
    assert plans[1].kv_pool_bytes - plans[0].kv_pool_bytes == 614_400_000


def test_plan_llama_8b_h100_hand_figures():
    plan = plan_memory(MemoryConfig(LLAMA_8B, H100))
    weights = 16_060_522_496  # 8,030,261,248 params * 2 B (14.96 GiB, as vLLM logs)
    reserve = 1_249_116_160  # the sampler peak above (> forward peak 906,133,504)
    non_torch = NON_TORCH_BASE_BYTES + CUDA_GRAPH_POOL_BYTES
    kv_pool = int(H100.memory_bytes * 0.9) - weights - reserve - non_torch
    assert (plan.weights_bytes, plan.activation_reserve_bytes) == (weights, reserve)
    assert plan.kv_pool_bytes == kv_pool
    assert plan.block_bytes == 16 * 131072  # 2 MiB
    assert plan.num_kv_blocks == kv_pool // (2 * MIB)
    assert plan.kv_capacity_tokens == plan.num_kv_blocks * 16
    # 1,249,116,160 // 512 MiB = 2 handles -> 1 GiB -> 512 blocks of 2 MiB
    assert (plan.reserve_handles, plan.reserve_blocks) == (2, 512)
    # a decode step of 256 seqs needs 1,184,104,448 B (sampler): only 62 MiB spare, 0 handles
    assert plan.decode_activation_bytes == 1_184_104_448
    assert plan.lendable_blocks == 0
    assert plan.reserve_share == pytest.approx(reserve / kv_pool)


@pytest.mark.parametrize("model", ["llama-3.1-8b", "qwen2.5-7b", "llama-3.2-1b"])
@pytest.mark.parametrize("chunk", [2048, 8192, 32768, 65536])
@pytest.mark.parametrize("tp", [1, 2, 4])
def test_reserve_blocks_are_whole_handles(model, chunk, tp):
    cfg = MemoryConfig(
        get_model(model), get_gpu("h200"), tensor_parallel_size=tp, max_num_batched_tokens=chunk
    )
    plan = plan_memory(cfg)
    handle = cfg.vmm_handle_bytes
    assert plan.reserve_blocks <= plan.activation_reserve_bytes // plan.block_bytes
    assert plan.reserve_blocks == plan.reserve_handles * handle // plan.block_bytes
    assert plan.reserve_handles * handle <= plan.activation_reserve_bytes
    assert plan.lendable_blocks <= plan.reserve_blocks
    assert plan.kv_capacity_tokens == plan.num_kv_blocks * cfg.block_size
    assert plan.num_kv_blocks * plan.block_bytes <= plan.kv_pool_bytes


def test_tp_shrinks_weights_and_grows_kv():
    plans = [
        plan_memory(MemoryConfig(QWEN_7B, get_gpu("a100-80gb"), tensor_parallel_size=tp))
        for tp in (1, 2, 4)
    ]
    assert [p.kv_bytes_per_token for p in plans] == [57344, 28672, 14336]
    assert plans[0].weights_bytes > plans[1].weights_bytes > plans[2].weights_bytes
    assert plans[1].non_torch_bytes > plans[0].non_torch_bytes  # NCCL buffers
    assert plans[0].reserve_share > plans[2].reserve_share


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"gpu_memory_utilization": 0.0}, "gpu_memory_utilization must be in"),
        ({"gpu_memory_utilization": 1.5}, "gpu_memory_utilization must be in"),
        ({"tensor_parallel_size": 3}, "power of two"),
        ({"tensor_parallel_size": 8}, "must divide the 28 attention heads"),
        ({"max_num_batched_tokens": 0}, "chunk size"),
        ({"max_num_seqs": 0}, "max_num_seqs"),
        ({"block_size": 24}, "block_size must be one of"),
        ({"vmm_handle_bytes": 3 * MIB}, "multiple of the h100-80gb VMM granularity"),
    ],
)
def test_config_validation_says_what_to_change(kwargs, message):
    with pytest.raises(ValueError, match=message):
        MemoryConfig(QWEN_7B, H100, **kwargs)


def test_does_not_fit_says_by_how_much():
    with pytest.raises(
        ValueError,
        match=r"does not fit on h100-80gb.*by \d+\.\d\d GiB.*"
        r"--tensor-parallel-size",
    ):
        plan_memory(MemoryConfig(get_model("llama-3.1-70b"), H100))
    # TP 2 fits the weights (65.7 GiB/GPU) but the KV pool holds < 32768 tokens
    with pytest.raises(ValueError, match="fewer than max_model_len 32768"):
        plan_memory(MemoryConfig(get_model("llama-3.1-70b"), H100, tensor_parallel_size=2))
    with pytest.raises(ValueError, match="CUDA context"):
        plan_memory(MemoryConfig(QWEN_7B, H100, gpu_memory_utilization=1.0))


def test_unset_max_model_len_is_capped_at_the_models_context():
    short = replace(LLAMA_8B, max_position_embeddings=4096)
    assert MemoryConfig(short, H100).effective_max_model_len == 4096
    assert MemoryConfig(LLAMA_8B, H100).effective_max_model_len == 32768
    assert MemoryConfig(short, H100, max_model_len=8192).effective_max_model_len == 8192


def test_fp8_kv_cache_and_weights_grow_the_pool():
    base = plan_memory(MemoryConfig(LLAMA_8B, H100))
    fp8 = plan_memory(MemoryConfig(apply_dtypes(LLAMA_8B, kv_cache_dtype="fp8",
                                                quantization="fp8"), H100))
    assert fp8.kv_bytes_per_token == 65536 and fp8.block_bytes == 16 * 65536
    # 6,979,321,856 linear weights at one byte instead of two; activations stay bf16
    assert base.weights_bytes - fp8.weights_bytes == 6_979_321_856
    assert fp8.activation_reserve_bytes == base.activation_reserve_bytes
    assert fp8.kv_pool_bytes == base.kv_pool_bytes + 6_979_321_856


def test_cli_json(capsys):
    assert main(["--model", "Llama-3.1-8B", "--gpu", "H100", "--max-num-seqs", "256",
                 "--max-model-len", "32768", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["kv_bytes_per_token"] == 131072
    assert out["activation_reserve_bytes"] == 1_249_116_160
    assert out["weights_bytes"] == 16_060_522_496
    assert out["kv_capacity_tokens"] == plan_memory(MemoryConfig(LLAMA_8B, H100)).kv_capacity_tokens


def test_cli_several_chunks_and_table(capsys):
    assert (
        main(
            [
                "--model",
                "qwen2.5-7b",
                "--gpu",
                "a100-80gb",
                "--tp",
                "2",
                "--chunk",
                "2048,8192,32768",
                "--json",
            ]
        )
        == 0
    )
    plans = json.loads(capsys.readouterr().out)
    assert [p["max_num_batched_tokens"] for p in plans] == [2048, 8192, 32768]
    assert main(["--model", "qwen2.5-7b", "--gpu", "a100-80gb", "--chunk", "2048,8192"]) == 0
    table = capsys.readouterr().out
    assert "KV capacity" in table and "8192" in table and "GiB" in table


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--model", "gpt-9", "--gpu", "h100"], "unknown model"),
        (["--model", "qwen2.5-7b", "--gpu", "h100", "--tp", "x"], "expected an integer"),
        (["--model", "qwen2.5-7b", "--gpu", "h100", "--chunk", "2k"], "expected an integer"),
        (["--model", "llama-3.1-70b", "--gpu", "h100"], "does not fit"),
        (["--model", "qwen2.5-7b", "--max-num-seqs", "0"], "give 1 or more"),
    ],
)
def test_cli_errors_one_line_exit_2(capsys, argv, message):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err
