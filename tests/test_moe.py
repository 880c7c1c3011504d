"""Mixture-of-experts and MLA models: parameters, weight and KV bytes, FLOPs, activation peak
and decode weight reads, against hand arithmetic and the published parameter counts."""

from dataclasses import replace
from pathlib import Path

import pytest

from sim.core.activation import activation_bytes, forward_peak_bytes
from sim.core.catalog import MODELS, MoeSpec, get_gpu, get_model, model_from_hf_config
from sim.core.cost_model import CostModel
from sim.core.memory_plan import MemoryConfig, plan_memory

FIXTURES = Path(__file__).parent / "data" / "hf_configs"
MIXTRAL = get_model("mixtral-8x7b")
QWEN_MOE = get_model("qwen1.5-moe-a2.7b")
QWEN3_MOE = get_model("qwen3-30b-a3b")
DEEPSEEK_LITE = get_model("deepseek-v2-lite")

# Mixtral-8x7B, per layer: q,o 2*4096*4096 = 33,554,432; k,v 2*4096*1024 = 8,388,608;
# one expert 3*4096*14336 = 176,160,768; router 8*4096 = 32,768; norms 8,192.
MIXTRAL_ATTENTION = 41_943_040
MIXTRAL_EXPERT = 176_160_768


@pytest.mark.parametrize("name, total, active", [
    # 32 * (41,943,040 + 8 experts 1,409,286,144 + 32,768 + 8,192) = 46,440,644,608;
    # embed + lm_head 2*32000*4096 = 262,144,000; final norm 4,096
    ("mixtral-8x7b", 46_702_792_704, 12_879_925_248),
    # per layer: attention 4*2048*2048 = 16,777,216 + q/k/v biases 6,144; 60 experts
    # 60*3*2048*1408 = 519,045,120; shared 3*2048*5632 = 34,603,008; shared gate 2,048;
    # router 60*2048 = 122,880; norms 4,096 -> 570,560,512 x 24 = 13,693,452,288;
    # embeddings 2*151936*2048 = 622,329,856; final 2,048. Active: 4 experts 34,603,008.
    ("qwen1.5-moe-a2.7b", 14_315_784_192, 2_689_173_504),
    # per layer: q,o 2*2048*4096 = 16,777,216; k,v 2*2048*512 = 2,097,152; 128 experts
    # 128*3*2048*768 = 603,979,776; router 262,144; norms 4,096 -> x48 = 29,909,778,432;
    # embeddings 622,329,856; final 2,048. Active: 8 experts 37,748,736 per layer.
    ("qwen3-30b-a3b", 30_532_110_336, 3_353_020_416),
])
def test_moe_parameter_counts(name, total, active):
    m = get_model(name)
    assert (m.num_params(), m.num_active_params()) == (total, active)


def test_deepseek_v2_lite_parameter_counts():
    # MLA per layer: q_proj 2048*16*192 = 6,291,456; kv_a 2048*576 = 1,179,648; kv_a norm 512;
    # kv_b 512*16*256 = 2,097,152; o_proj 16*128*2048 = 4,194,304; 2 norms 4,096 -> 13,767,168,
    # x27 = 371,713,536. Layer 0 dense MLP 3*2048*10944 = 67,239,936. 26 MoE layers: 64 experts
    # of 3*2048*1408 = 8,650,752 -> 553,648,128; 2 shared 17,301,504; router 131,072.
    # embed + lm_head 2*102400*2048 = 419,430,400; final norm 2,048.
    assert DEEPSEEK_LITE.num_params() == (371_713_536 + 67_239_936 + 26 * 571_080_704
                                          + 419_430_400 + 2_048)  # 15,706,484,224
    active = 371_713_536 + 67_239_936 + 26 * (6 * 8_650_752 + 17_301_504 + 131_072) + 419_430_400
    assert DEEPSEEK_LITE.num_active_params() == active + 2_048  # 2,661,150,208


@pytest.mark.parametrize("name, total_b, active_b", [
    ("mixtral-8x7b", 46.7, 12.9), ("qwen1.5-moe-a2.7b", 14.3, 2.7), ("qwen3-30b-a3b", 30.5, 3.3),
    ("deepseek-v2-lite", 15.7, None),
])
def test_published_moe_counts(name, total_b, active_b):
    m = get_model(name)
    assert m.num_params() / 1e9 == pytest.approx(total_b, rel=0.02)
    if active_b is not None:
        assert m.num_active_params() / 1e9 == pytest.approx(active_b, rel=0.02)


def test_deepseek_published_active_count_leaves_out_the_input_embedding():
    # DeepSeek's 2.4B counts what a token multiplies by: all but the 209,715,200-entry
    # input embedding table (2,451,435,008)
    assert DEEPSEEK_LITE.linear_flops_per_token() / 2 / 1e9 == pytest.approx(2.4, rel=0.025)


def test_moe_configs_parse_to_the_presets():
    for name in ("mixtral-8x7b", "qwen1.5-moe-a2.7b", "qwen3-30b-a3b", "deepseek-v2-lite"):
        assert model_from_hf_config(FIXTURES / name) == MODELS[name]


def test_mixtral_is_93_gb_not_a_dense_14_gb_model():
    assert MIXTRAL.weight_bytes() == 2 * 46_702_792_704  # 93.4 GB in bf16
    # TP 2: every expert's 14,336 split in two: 8*3*4096*7168 = 704,643,072; q,o halved
    # 16,777,216; k,v 4 heads 4,194,304; router and norms whole 40,960 -> 725,655,552 x 32;
    # embeddings 2*16000*4096 = 131,072,000; final norm 4,096
    per_rank = 32 * 725_655_552 + 131_072_000 + 4_096
    assert MIXTRAL.weight_bytes(tp=2) == 2 * per_rank


def test_flops_count_only_active_experts():
    # 2 x (32 x (attention + 2 experts + router) + lm_head 32000*4096)
    per_layer = MIXTRAL_ATTENTION + 2 * MIXTRAL_EXPERT + 32_768
    assert MIXTRAL.linear_flops_per_token() == 2.0 * (32 * per_layer + 131_072_000)
    assert MIXTRAL.linear_flops_per_token(tp=4) == MIXTRAL.linear_flops_per_token() / 4


def test_kv_bytes():
    assert MIXTRAL.kv_bytes_per_token() == 2 * 32 * 8 * 128 * 2  # 131,072
    assert QWEN_MOE.kv_bytes_per_token() == 2 * 24 * 16 * 128 * 2  # 196,608
    # MLA: one latent of 512 + 64 per layer, replicated on every rank
    assert DEEPSEEK_LITE.kv_bytes_per_token() == 27 * 576 * 2  # 31,104
    assert DEEPSEEK_LITE.kv_bytes_per_token(tp=4) == 31_104


def test_experts_touched_expectation():
    moe = MIXTRAL.moe
    assert moe.expected_experts_touched(1) == pytest.approx(2.0)
    assert moe.expected_experts_touched(2) == pytest.approx(8 * (1 - 0.75**2))  # 3.5
    assert moe.expected_experts_touched(10_000) == pytest.approx(8.0)
    for tokens in range(1, 40):
        assert moe.expected_experts_touched(tokens) <= min(8, 2 * tokens) + 1e-9


def test_decode_weight_reads_grow_with_the_batch():
    # one token reads attention, 2 experts and the router of each layer, in bf16
    assert MIXTRAL.layer_weight_bytes_read(1) == 2 * 32 * (MIXTRAL_ATTENTION + 2 * MIXTRAL_EXPERT
                                                           + 32_768)
    two = 2 * 32 * (MIXTRAL_ATTENTION + 3.5 * MIXTRAL_EXPERT + 32_768)
    assert MIXTRAL.layer_weight_bytes_read(2) == pytest.approx(two, rel=1e-12)
    every_expert = 2 * 32 * (MIXTRAL_ATTENTION + 8 * MIXTRAL_EXPERT + 32_768)
    assert MIXTRAL.layer_weight_bytes_read(4096) == pytest.approx(every_expert, rel=1e-12)
    # the cost model's weight-bound decode time follows the experts a batch touches
    cost = CostModel(MIXTRAL, get_gpu("h200"), 1)
    assert cost.linear_s(64) / cost.linear_s(1) == pytest.approx(
        MIXTRAL.layer_weight_bytes_read(64) / MIXTRAL.layer_weight_bytes_read(1), rel=1e-9)


def test_mixtral_activation_hand_figures():
    # 8192 tokens: hidden + residual 2*4096*2 B + 20 B buffers = 16,404 B/token -> 134,381,568.
    # MoE block: workspaces 8192 * 2 * (max(2*14336, 4096) + 14336) * 2 B = 1,409,286,144;
    # routed output 8192*4096*2 = 67,108,864; router logits 8*2 + routing 2*8 = 32 B/token
    # -> 262,144. (Attention: 8192 * 14336 * 2 = 234,881,024, smaller.)
    assert forward_peak_bytes(MIXTRAL, 8192, 1) == 134_381_568 + 1_476_657_152
    # past one fused-MoE chunk (16,384 tokens) the workspaces stop growing
    grow = forward_peak_bytes(MIXTRAL, 32768, 1) - forward_peak_bytes(MIXTRAL, 16384, 1)
    assert grow == 16384 * (16_404 + 4096 * 2 + 32)


def test_shared_expert_and_dense_layer_activation():
    # Qwen1.5-MoE, 4096 tokens: workspaces 4096*4*(2816 + 1408)*2 = 138,412,032 + routed out
    # 16,777,216 + shared out 16,777,216 (> shared MLP alone 4096*(3*5632 + 2048)*2) + router
    # 4096*(60*2 + 4*8) = 622,592; persistent 4096 * 8,212 = 33,636,352
    assert forward_peak_bytes(QWEN_MOE, 4096, 1) == 33_636_352 + 172_589_056
    # DeepSeek-V2-Lite, 8192 tokens: layer 0's dense MLP (3*10944 + 2048)*2*8192 = 571,473,920
    # outweighs its MoE layers (483,786,752) and MLA attention (14,912*2*8192)
    assert forward_peak_bytes(DEEPSEEK_LITE, 8192, 1) == 8192 * 8_212 + 571_473_920


def test_moe_memory_plan_under_tp():
    h100 = get_gpu("h100")
    with pytest.raises(ValueError, match="does not fit"):
        plan_memory(MemoryConfig(MIXTRAL, h100))
    plan = plan_memory(MemoryConfig(MIXTRAL, h100, tensor_parallel_size=2))
    assert plan.weights_bytes == MIXTRAL.weight_bytes(2)
    assert plan.activation_reserve_bytes == activation_bytes(
        MIXTRAL, 8192, tp=2, num_sample_rows=256)
    odd = replace(MIXTRAL, moe=MoeSpec(8, 2, 1000))
    with pytest.raises(ValueError, match="must divide the expert width 1000"):
        MemoryConfig(odd, h100, tensor_parallel_size=16)


def test_moe_config_errors(tmp_path):
    base = (FIXTURES / "mixtral-8x7b" / "config.json").read_text()
    too_many = tmp_path / "too_many.json"
    too_many.write_text(base.replace('"num_experts_per_tok": 2', '"num_experts_per_tok": 9'))
    with pytest.raises(ValueError, match=r"too_many\.json, line \d+.*exceeds num_experts"):
        model_from_hf_config(too_many)
    strided = tmp_path / "strided.json"
    strided.write_text((FIXTURES / "qwen1.5-moe-a2.7b" / "config.json").read_text()
                       .replace('"decoder_sparse_step": 1', '"decoder_sparse_step": 2'))
    with pytest.raises(ValueError, match="decoder_sparse_step.*not modelled"):
        model_from_hf_config(strided)
