"""Catalog presets, TP sharding and HF config loading, checked against hand arithmetic."""

from dataclasses import replace
from pathlib import Path

import pytest

from sim.core.catalog import GPUS, MODELS, get_gpu, get_model, model_from_hf_config, with_dtype

FIXTURES = Path(__file__).parent / "data" / "hf_configs"


def test_llama_3_1_8b_hand_figures():
    m = get_model("llama-3.1-8b")
    # KV bytes/token = 2 (K,V) * 32 layers * 8 kv heads * 128 head_dim * 2 B = 131072
    assert m.kv_bytes_per_token() == 131072
    # per layer: q,o 2*4096*4096 = 33,554,432; k,v 2*4096*1024 = 8,388,608;
    # MLP 3*4096*14336 = 176,160,768; 2 norms 8,192 -> 218,112,000; x32 = 6,979,584,000
    # embed + lm_head (untied) 2*128256*4096 = 1,050,673,152; final norm 4,096
    assert m.num_params() == 6_979_584_000 + 1_050_673_152 + 4_096  # 8.03e9
    assert m.weight_bytes() == 2 * m.num_params()
    # linear FLOPs/token = 2 * (32 * (33,554,432 + 8,388,608 + 176,160,768) + 525,336,576)
    assert m.linear_flops_per_token() == 2.0 * (32 * 218_103_808 + 525_336_576)
    assert m.linear_flops_per_token(tp=4) == m.linear_flops_per_token() / 4


def test_qwen2_5_7b_hand_figures():
    m = get_model("qwen2.5-7b")
    # KV = 2 * 28 layers * 4 kv heads * 128 * 2 B = 57344
    assert m.kv_bytes_per_token() == 57344
    # per layer: q,o 2*3584*3584 = 25,690,112; k,v 2*3584*512 = 3,670,016;
    # MLP 3*3584*18944 = 203,685,888; norms 7,168; q/k/v biases 3584 + 2*512 = 4,608
    # -> 233,057,792; x28 = 6,525,618,176; embed + lm_head 2*152064*3584 = 1,089,994,752
    assert m.num_params() == 6_525_618_176 + 1_089_994_752 + 3_584  # 7.62e9


@pytest.mark.parametrize(
    "name, billions",
    [
        ("llama-3.2-1b", 1.24),
        ("llama-3.2-3b", 3.21),
        ("llama-3.1-70b", 70.55),
        ("qwen2.5-0.5b", 0.49),
        ("qwen2.5-1.5b", 1.54),
        ("qwen2.5-14b", 14.77),
        ("qwen2.5-32b", 32.76),
        ("qwen2.5-72b", 72.71),
        ("mistral-7b", 7.25),
    ],
)
def test_published_parameter_counts(name, billions):
    assert get_model(name).num_params() / 1e9 == pytest.approx(billions, abs=0.01)


def test_tied_embeddings_count_once():
    m = get_model("qwen2.5-0.5b")
    untied = replace(m, tie_word_embeddings=False)
    assert untied.num_params() - m.num_params() == 151936 * 896


def test_tp_splits_weights_but_replicates_norms():
    m = get_model("llama-3.1-8b")
    norms = 32 * 2 * 4096 + 4096  # replicated on every rank
    for tp in (2, 4, 8):
        # vocab 128256 is a multiple of 64 * 8, so every matrix splits exactly
        assert m.weight_bytes(tp) == 2 * ((m.num_params() - norms) // tp + norms)


def test_kv_heads_replicate_beyond_num_kv_heads():
    m = get_model("llama-3.1-8b")  # 8 kv heads
    assert m.kv_bytes_per_token(tp=2) == 131072 // 2
    assert m.kv_bytes_per_token(tp=8) == 2 * 32 * 1 * 128 * 2
    assert m.kv_bytes_per_token(tp=16) == m.kv_bytes_per_token(tp=8)  # one replicated head
    q = get_model("qwen2.5-7b")  # 4 kv heads
    assert q.kv_bytes_per_token(tp=2) == 2 * 28 * 2 * 128 * 2  # 28672


def test_names_are_case_insensitive_and_aliased():
    assert get_model("Llama-3.1-8B") is MODELS["llama-3.1-8b"]
    assert get_model(" QWEN2.5-7B ") is MODELS["qwen2.5-7b"]
    assert get_gpu("H200") is GPUS["h200-141gb"]
    assert get_gpu("H100-80GB") is GPUS["h100-80gb"]


def test_unknown_names_list_known_ones():
    with pytest.raises(ValueError, match="unknown model 'gpt-9'.*llama-3.1-8b"):
        get_model("gpt-9")
    with pytest.raises(ValueError, match="unknown GPU 'v100'.*h200-141gb"):
        get_gpu("v100")


def test_h200_memory_is_what_cuda_reports():
    # torch.cuda.mem_get_info() on an H200: 150,109,880,320 B = 139.80 GiB
    assert get_gpu("h200").memory_bytes == 150_109_880_320
    assert all(g.vmm_granularity_bytes == 2 * 1024**2 for g in GPUS.values())


def test_hf_config_llama_folder():
    m = get_model(str(FIXTURES / "tiny-llama"))
    assert (m.name, m.num_layers, m.num_kv_heads, m.head_dim) == ("tiny-llama", 4, 2, 32)
    # per layer: q,o 2*256*256 = 131,072; k,v 2*256*64 = 32,768; MLP 3*256*688 = 528,384;
    # norms 512 -> 692,736; x4 = 2,770,944; embed + lm_head 2*1000*256 = 512,000; final 256
    assert m.num_params() == 3_283_200
    assert m.kv_bytes_per_token() == 2 * 4 * 2 * 32 * 2  # 1024


def test_hf_config_qwen2_defaults_bias_tied_fp32():
    m = model_from_hf_config(FIXTURES / "tiny-qwen2" / "config.json")
    # num_key_value_heads absent -> 4 (= heads); head_dim absent -> 128 / 4 = 32
    assert (m.num_kv_heads, m.head_dim, m.dtype_bytes) == (4, 32, 4)
    assert m.attention_bias and m.tie_word_embeddings
    # per layer: q,o 32,768; k,v 32,768; MLP 3*128*320 = 122,880; norms 256; biases 384
    # -> 189,056; x2 = 378,112; tied embed 512*128 = 65,536; final 128
    assert m.num_params() == 443_776
    assert m.weight_bytes() == 4 * 443_776


def test_hf_config_errors_name_file_and_field():
    with pytest.raises(ValueError, match=r"missing_layers\.json.*num_hidden_layers"):
        model_from_hf_config(FIXTURES / "missing_layers.json")
    with pytest.raises(ValueError, match="cannot read"):
        model_from_hf_config(FIXTURES / "nowhere")


def test_with_dtype():
    m = with_dtype(get_model("llama-3.1-8b"), "fp32")
    assert m.kv_bytes_per_token() == 2 * 131072
    with pytest.raises(ValueError, match="unknown dtype"):
        with_dtype(m, "int3")


def test_model_validation():
    with pytest.raises(ValueError, match="multiple of num_kv_heads"):
        replace(get_model("llama-3.1-8b"), num_kv_heads=7)
