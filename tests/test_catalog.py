"""Catalog presets, TP sharding and HF config loading, checked against hand arithmetic."""

import json
import os
from dataclasses import replace
from pathlib import Path

import pytest

from sim.core.catalog import (
    GPUS,
    MODELS,
    apply_dtypes,
    get_gpu,
    get_model,
    model_from_hf_config,
    with_dtype,
)
from sim.core.engine_config import EngineConfig

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
    with pytest.raises(ValueError, match=r"cannot read model config .*nowhere/config\.json"):
        get_model("nowhere/config.json")


def test_with_dtype():
    m = with_dtype(get_model("llama-3.1-8b"), "fp32")
    assert m.kv_bytes_per_token() == 2 * 131072
    with pytest.raises(ValueError, match="unknown dtype"):
        with_dtype(m, "int3")


def test_model_validation():
    with pytest.raises(ValueError, match="multiple of num_kv_heads"):
        replace(get_model("llama-3.1-8b"), num_kv_heads=7)


@pytest.mark.parametrize("name, positions", [
    ("llama-3.2-1b", 131072), ("llama-3.2-3b", 131072), ("llama-3.1-8b", 131072),
    ("llama-3.1-70b", 131072), ("qwen2.5-0.5b", 32768), ("qwen2.5-7b", 32768),
    ("qwen2.5-72b", 32768), ("mistral-7b", 32768), ("mixtral-8x7b", 32768),
    ("qwen1.5-moe-a2.7b", 32768), ("qwen3-30b-a3b", 40960), ("deepseek-v2-lite", 163840),
])
def test_presets_carry_their_context(name, positions):
    assert get_model(name).max_position_embeddings == positions


def test_context_read_from_config_or_the_model_types_default():
    assert get_model(str(FIXTURES / "mixtral-8x7b")).max_position_embeddings == 32768
    # neither fixture sets it: transformers' defaults for llama (2,048) and qwen2 (32,768)
    assert get_model(str(FIXTURES / "tiny-llama")).max_position_embeddings == 2048
    assert model_from_hf_config(FIXTURES / "tiny-qwen2").max_position_embeddings == 32768


@pytest.fixture
def hf_cache(tmp_path, monkeypatch):
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    return tmp_path / "hub"


def test_repo_id_without_cache_falls_back_to_the_preset(hf_cache):
    assert get_model("meta-llama/Llama-3.1-8B-Instruct") is MODELS["llama-3.1-8b"]
    assert get_model("meta-llama/Meta-Llama-3.1-70B-Instruct") is MODELS["llama-3.1-70b"]
    assert get_model("Qwen/Qwen2.5-7B-Instruct") is MODELS["qwen2.5-7b"]
    assert get_model("mistralai/Mixtral-8x7B-Instruct-v0.1") is MODELS["mixtral-8x7b"]
    assert get_model("deepseek-ai/DeepSeek-V2-Lite-Chat") is MODELS["deepseek-v2-lite"]
    with pytest.raises(ValueError, match=r"not in the local Hugging Face cache.*llama-3\.1-8b"):
        get_model("acme/Unknown-7B")


def test_repo_id_reads_the_cached_snapshot(hf_cache):
    repo = hf_cache / "models--acme--Tiny-Llama"
    pinned, newer = repo / "snapshots" / "abc123", repo / "snapshots" / "def456"
    for folder, layers in ((pinned, 4), (newer, 6)):
        folder.mkdir(parents=True)
        text = (FIXTURES / "tiny-llama" / "config.json").read_text()
        (folder / "config.json").write_text(text.replace('"num_hidden_layers": 4',
                                                         f'"num_hidden_layers": {layers}'))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("abc123\n")
    m = get_model("acme/Tiny-Llama")
    assert (m.name, m.num_layers) == ("acme/Tiny-Llama", 4)  # refs/main's snapshot
    (repo / "refs" / "main").unlink()
    os.utime(pinned / "config.json", (1_000_000, 1_000_000))
    assert get_model("acme/Tiny-Llama").num_layers == 6  # the newest snapshot


def test_apply_dtypes():
    m = get_model("llama-3.1-8b")
    assert apply_dtypes(m) == m
    assert apply_dtypes(m, dtype="float32").weight_bytes() == 4 * m.num_params()
    fp8_kv = apply_dtypes(m, kv_cache_dtype="fp8")
    assert (fp8_kv.kv_bytes_per_token(), fp8_kv.weight_bytes()) == (65536, m.weight_bytes())
    # fp8 weights: 32 * 218,103,808 linear params at 1 B; norms 266,240 and embed + lm_head
    # 1,050,673,152 stay bf16
    fp8 = apply_dtypes(m, quantization="fp8")
    assert fp8.weight_bytes() == 6_979_321_856 + 2 * (266_240 + 1_050_673_152)
    assert fp8.kv_bytes_per_token() == 131072
    for bad, match in ((dict(dtype="int4"), "dtype 'int4'; known: auto, bfloat16"),
                       (dict(kv_cache_dtype="int8"), "kv_cache_dtype 'int8'; known: auto, fp8"),
                       (dict(quantization="awq"), "quantization 'awq'; known: None")):
        with pytest.raises(ValueError, match=match):
            apply_dtypes(m, **bad)


@pytest.mark.parametrize("edit, match", [
    (('"num_attention_heads": 8', '"num_attention_heads": 0'),
     r"line 7, key 'num_attention_heads'.*>= 1, got 0"),
    (('"hidden_size": 256', '"hidden_size": "256"'), r"key 'hidden_size'.*integer, got '256'"),
    (('"num_hidden_layers": 4', '"num_hidden_layers": 4.5'), "num_hidden_layers.*integer"),
    (('"tie_word_embeddings": false', '"tie_word_embeddings": "no"'), "true or false"),
    (('"torch_dtype": "bfloat16"', '"torch_dtype": "int3"'), "unsupported dtype 'int3'"),
    (('"num_key_value_heads": 2', '"num_key_value_heads": 3'), "multiple of num_kv_heads"),
    (('"model_type": "llama",', '"model_type": "mystery",'), "missing key 'max_position_emb"),
    (('"vocab_size": 1000,', '"vocab_size": 1000'), r"line \d+: not valid JSON"),
])
def test_config_errors_name_file_line_and_key(tmp_path, edit, match):
    text = (FIXTURES / "tiny-llama" / "config.json").read_text()
    assert edit[0] in text
    bad = tmp_path / "config.json"
    bad.write_text(text.replace(*edit))
    with pytest.raises(ValueError, match=match) as info:
        model_from_hf_config(bad)
    assert str(bad) in str(info.value)


def rope_config(tmp_path, rope: dict | None, positions: int, **more) -> Path:
    """The tiny Llama fixture with these positions, rope parameters and other keys."""
    data = json.loads((FIXTURES / "tiny-llama" / "config.json").read_text())
    data.update(max_position_embeddings=positions, rope_scaling=rope, **more)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(data, indent=2))
    return path


@pytest.mark.parametrize("rope, positions, context", [
    # Qwen2.5's model card: YaRN, factor 4 on its 32,768 positions -> vLLM serves 131,072
    ({"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}, 32768, 131072),
    # YaRN scales original_max_position_embeddings, not max_position_embeddings (Qwen3)
    ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}, 40960,
     131072),
    # Llama 3.1: llama3 scaling, whose max_position_embeddings is the extended context
    ({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
      "original_max_position_embeddings": 8192}, 131072, 131072),
    ({"type": "longrope", "long_factor": [1.0], "short_factor": [1.0], "factor": 32.0}, 131072,
     131072),
    ({"type": "linear", "factor": 2.0}, 4096, 8192),
    ({"type": "dynamic", "factor": 2.5}, 4096, 10240),
    ({"rope_type": "default"}, 4096, 4096),
    (None, 4096, 4096),
])
def test_context_follows_vllms_rope_scaling_rule(tmp_path, rope, positions, context):
    model = model_from_hf_config(rope_config(tmp_path, rope, positions))
    assert model.max_position_embeddings == context


def test_yarn_without_its_own_base_reads_the_top_level_one(tmp_path):
    path = rope_config(tmp_path, {"type": "yarn", "factor": 2.0}, 16384,
                       original_max_position_embeddings=4096)
    assert model_from_hf_config(path).max_position_embeddings == 8192


def test_rope_parameters_per_layer_type_take_one_factor(tmp_path):
    path = rope_config(tmp_path, None, 8192, rope_parameters={
        "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6},
        "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}})
    assert model_from_hf_config(path).max_position_embeddings == 16384


def test_deepseek_v2_lite_context_is_its_yarn_base_times_its_factor():
    # rope_scaling: yarn, factor 40 on original_max_position_embeddings 4,096
    model = model_from_hf_config(FIXTURES / "deepseek-v2-lite")
    assert model.max_position_embeddings == 40 * 4096
    assert MODELS["deepseek-v2-lite"].max_position_embeddings == 40 * 4096


def test_a_yarn_model_accepts_a_max_model_len_up_to_its_scaled_context(tmp_path):
    yarn = {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}
    model = model_from_hf_config(rope_config(tmp_path, yarn, 32768))
    assert EngineConfig(model, get_gpu("h200"), max_model_len=131072).max_model_len == 131072
    with pytest.raises(ValueError, match="max_position_embeddings 131072"):
        EngineConfig(model, get_gpu("h200"), max_model_len=131073)


@pytest.mark.parametrize("rope, match", [
    ({"type": "linear", "factor": "2"}, "factor must be a positive number, got '2'"),
    ({"type": "yarn", "factor": 0}, "factor must be a positive number, got 0"),
    ("yarn", "expected a mapping or null, got 'yarn'"),
])
def test_bad_rope_scaling_names_file_line_and_key(tmp_path, rope, match):
    path = rope_config(tmp_path, rope, 4096)
    with pytest.raises(ValueError, match=match) as info:
        model_from_hf_config(path)
    assert f"{path}, line " in str(info.value) and "key 'rope_scaling'" in str(info.value)
