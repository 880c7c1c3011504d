"""EngineConfig: vLLM's defaults, vLLM's refusals, the JSON round trip, and the flags made
from its fields."""

from __future__ import annotations

import argparse
import json
import pickle

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.core.catalog import MIB, get_gpu, get_model
from sim.core.config_flags import (
    CommandParser,
    UsageError,
    add_engine_flags,
    engine_config,
    engine_configs,
)
from sim.core.elastic import DrainStrategy, Policy
from sim.core.engine_checks import SettingRangeError
from sim.core.engine_config import EngineConfig, build_core

H200, A100_80, L40S = get_gpu("h200"), get_gpu("a100-80gb"), get_gpu("l40s")


# ----------------------------------------------------------------------------- defaults
@pytest.mark.parametrize("gpu, chunk, seqs", [
    (H200, 8192, 1024),  # >= 70 GiB: the OpenAI server's larger defaults
    (get_gpu("h100"), 8192, 1024),
    (A100_80, 2048, 256),  # 80 GB but an A100: vLLM keeps it on the small ones
    (L40S, 2048, 256),  # under 70 GiB
])
def test_batch_defaults_are_vllms_for_the_gpu(gpu, chunk, seqs):
    config = EngineConfig(gpu=gpu)
    assert config.max_num_batched_tokens is None and config.max_num_seqs is None
    assert (config.chunk_tokens, config.num_seqs) == (chunk, seqs)


def test_max_num_seqs_default_never_exceeds_the_chunk():
    assert EngineConfig(max_num_batched_tokens=512).num_seqs == 512
    assert EngineConfig(max_num_batched_tokens=4096).num_seqs == 1024


def test_max_model_len_defaults_to_the_models_context():
    # max_position_embeddings in each model's config.json on the Hugging Face Hub
    assert EngineConfig(get_model("llama-3.1-8b")).effective_max_model_len == 131072
    assert EngineConfig(get_model("qwen2.5-0.5b")).effective_max_model_len == 32768
    assert EngineConfig(max_model_len=4096).effective_max_model_len == 4096


def test_prefix_caching_and_chunked_prefill_are_on_and_both_executors_share_the_rest():
    config = EngineConfig()
    assert config.enable_prefix_caching and config.enable_chunked_prefill
    assert config.model.name == "llama-3.1-8b" and config.gpu.name == "h200-141gb"
    assert config.drain is DrainStrategy.MIGRATE and config.reclaim == "release"
    assert config.policy is Policy.STATIC and config.vmm_handle_bytes == 512 * MIB


def test_without_chunked_prefill_a_step_holds_the_longest_request():
    assert EngineConfig(enable_chunked_prefill=False).chunk_tokens == 131072
    assert EngineConfig(enable_chunked_prefill=False, max_model_len=1000).chunk_tokens == 2048
    with pytest.raises(ValueError, match="smaller than max_model_len"):
        EngineConfig(enable_chunked_prefill=False, max_num_batched_tokens=8192)
    with pytest.raises(ValueError, match="cannot run it unsplit"):
        build_core(EngineConfig(enable_chunked_prefill=False, max_model_len=4096))


def test_dtypes_are_applied_to_the_model_once():
    fp8 = EngineConfig(kv_cache_dtype="fp8", quantization="fp8")
    # Llama-3.1-8B: 2 (K, V) x 32 layers x 8 KV heads x 128 x 1 byte
    assert fp8.model.kv_bytes_per_token() == 65536
    assert EngineConfig().model.kv_bytes_per_token() == 131072
    assert fp8.with_(policy=Policy.ELASTIC).model == fp8.model
    assert EngineConfig(dtype="float32").model.dtype_bytes == 4


# ---------------------------------------------------------------------------- refusals
RANGE, RULE = True, False  # a value out of any engine's range, or a rule of vLLM's


@pytest.mark.parametrize("changes, says, out_of_range", [
    ({"max_num_seqs": 0}, "--max-num-seqs 0: give 1 or more", RANGE),
    ({"max_num_batched_tokens": 0}, "--max-num-batched-tokens 0: give 1 or more", RANGE),
    ({"max_num_batched_tokens": 1, "max_num_seqs": 1024},
     "max_num_batched_tokens (1) must be at least max_num_seqs (1024)", RULE),
    ({"max_num_batched_tokens": 512, "max_num_seqs": 1024}, "lower --max-num-seqs", RULE),
    ({"tensor_parallel_size": 0}, "--tensor-parallel-size 0", RANGE),
    ({"max_model_len": -5}, "--max-model-len -5", RANGE),
    ({"max_model_len": 200_000}, "--max-model-len 200000 is longer than llama-3.1-8b's", RULE),
    ({"gpu_memory_utilization": 1.5}, "--gpu-memory-utilization 1.5", RANGE),
    ({"block_size": 7}, "--block-size 7: give one of 8, 16, 32, 64, 128", RANGE),
    ({"vmm_handle_bytes": 3 * MIB}, "--vmm-handle-mib 3: give a positive multiple", RANGE),
    ({"mixed_split_bytes": -MIB}, "--mixed-split-mib -1: give 0 (never) or more MiB", RANGE),
    ({"reclaim": "keep"}, "--reclaim 'keep'", RANGE),
    ({"hash_block_tokens": 100}, "--hash-block-tokens 100", RANGE),
    ({"cuda_graph_sizes": (0, 4)}, "--cuda-graph-sizes 0,4: give sizes of 1 or more", RANGE),
    ({"piecewise_graph_sizes": (-16,)}, "piecewise_graph_sizes -16: give sizes of 1", RANGE),
    ({"dtype": "int4"}, "unknown dtype 'int4'; known: auto, bfloat16", RULE),
    ({"kv_cache_dtype": "int8"}, "known: auto, fp8", RULE),
    ({"max_num_seqs": "64"}, "--max-num-seqs '64': give an integer", RANGE),
])
def test_refusals_say_what_to_change(changes, says, out_of_range):
    """Each refusal names the flag and what to give; a value no model could run is a
    SettingRangeError (a sweep stops on it), a model's or vLLM's rule a plain ValueError."""
    with pytest.raises(ValueError) as info:
        EngineConfig(**changes)
    assert says in str(info.value)
    assert isinstance(info.value, SettingRangeError) == out_of_range


def test_a_range_refusal_carries_its_setting_and_can_be_said_of_another_name():
    with pytest.raises(SettingRangeError) as info:
        EngineConfig(vmm_handle_bytes=3 * MIB)
    refusal = info.value
    assert (refusal.setting, refusal.flag, refusal.value) == ("vmm_handle_bytes",
                                                              "--vmm-handle-mib", "3")
    assert refusal.at("engine.vmm_handle_mib") == (
        "engine.vmm_handle_mib: give a positive multiple of the h200-141gb VMM granularity "
        "(2 MiB), got 3")
    again = pickle.loads(pickle.dumps(refusal))
    assert type(again) is SettingRangeError and str(again) == str(refusal)


QWEN_05B = get_model("qwen2.5-0.5b")  # max_position_embeddings 32,768 (its config.json)


def test_max_model_len_past_the_models_context_is_refused_naming_both_and_the_fix():
    """vLLM's ModelConfig: a max_model_len past the derived maximum is an error unless
    VLLM_ALLOW_LONG_MAX_MODEL_LEN=1; up to it (and unset) is accepted."""
    assert EngineConfig(QWEN_05B, max_model_len=32768).effective_max_model_len == 32768
    with pytest.raises(ValueError) as info:
        EngineConfig(QWEN_05B, max_model_len=32769)
    message = str(info.value)
    for says in ("--max-model-len 32769", "qwen2.5-0.5b", "max_position_embeddings 32768",
                 "give --max-model-len 32768 or less", "--allow-long-max-model-len",
                 "VLLM_ALLOW_LONG_MAX_MODEL_LEN=1"):
        assert says in message
    with pytest.raises(ValueError, match="--max-model-len 131073"):
        EngineConfig(get_model("llama-3.1-8b"), max_model_len=131073)
    with pytest.raises(ValueError, match="max_position_embeddings 32768"):
        EngineConfig.from_json('{"model": "qwen2.5-0.5b", "max_model_len": 65536}')


def test_the_opt_in_runs_a_max_model_len_past_the_context():
    config = EngineConfig(QWEN_05B, max_model_len=65536, allow_long_max_model_len=True)
    assert config.effective_max_model_len == 65536
    assert build_core(config).scheduler.config.max_model_len == 65536
    assert EngineConfig.from_json(config.to_json()) == config
    args = parser().parse_args(["--model", "qwen2.5-0.5b", "--max-model-len", "65536",
                                "--allow-long-max-model-len"])
    assert engine_config(args) == config
    with pytest.raises(ValueError, match="--allow-long-max-model-len"):
        engine_config(parser().parse_args(["--model", "qwen2.5-0.5b",
                                           "--max-model-len", "65536"]))


# --------------------------------------------------------------------------- JSON
configs = st.builds(
    EngineConfig,
    model=st.sampled_from([get_model(n) for n in ("llama-3.1-8b", "qwen2.5-0.5b",
                                                  "deepseek-v2-lite", "mixtral-8x7b")]),
    gpu=st.sampled_from([H200, A100_80, L40S]),
    max_num_batched_tokens=st.one_of(st.none(), st.integers(1024, 65536)),
    max_num_seqs=st.one_of(st.none(), st.integers(1, 256)),
    max_model_len=st.one_of(st.none(), st.integers(1, 200_000)),
    allow_long_max_model_len=st.just(True),  # any max_model_len above, past a model's context too
    policy=st.sampled_from(list(Policy)), drain=st.sampled_from(list(DrainStrategy)),
    reclaim=st.sampled_from(["remap", "release"]),
    enable_prefix_caching=st.booleans(),
    cuda_graph_sizes=st.lists(st.integers(1, 512), max_size=4).map(lambda s: tuple(sorted(set(s)))),
    kv_cache_dtype=st.sampled_from(["auto", "fp8"]),
    quantization=st.sampled_from([None, "fp8"]),
    gpu_memory_utilization=st.floats(0.05, 1.0),
)


@settings(max_examples=40, deadline=None)
@given(configs)
def test_json_round_trip_is_exact(config):
    again = EngineConfig.from_json(config.to_json())
    assert again == config
    assert again.to_json() == config.to_json()


def test_a_partial_json_takes_the_defaults_and_a_model_by_name():
    config = EngineConfig.from_json('{"model": "qwen2.5-0.5b", "max_num_batched_tokens": 2048}')
    assert config == EngineConfig(get_model("qwen2.5-0.5b"), max_num_batched_tokens=2048)


@pytest.mark.parametrize("text, says", [
    ('{"max_num_seqs": "many"}', "run.json: max_num_seqs: expected an integer, got 'many'"),
    ('{"chunk": 2048}', "run.json: unknown setting(s) ['chunk']; known: ['model'"),
    ('{"policy": "greedy"}', "run.json: policy: unknown policy 'greedy'"),
    ('{"enable_prefix_caching": "yes"}', "enable_prefix_caching: expected true or false"),
    ('{"model": {"name": "x"}}', "run.json: model: ModelSpec"),
    ('{"max_num_seqs": 0}', "run.json: --max-num-seqs 0"),
    ("[1]", "run.json: expected an object"),
    ("{", "run.json is not valid JSON"),
])
def test_bad_json_names_the_file_and_key(text, says):
    with pytest.raises(ValueError) as info:
        EngineConfig.from_json(text, source="run.json")
    assert says in str(info.value)


# ---------------------------------------------------------------------------- flags
def parser(**kwargs) -> CommandParser:
    p = CommandParser(prog="test")
    add_engine_flags(p, **kwargs)
    return p


def test_no_flags_give_the_default_config_and_every_flag_has_help():
    p = parser()
    assert engine_config(p.parse_args([])) == EngineConfig()
    options = [a for a in p._actions if a.option_strings and a.dest != "help"]
    assert len(options) >= 20
    for action in options:
        assert action.help and "(default: " in action.help or action.dest == "engine_config", \
            action.option_strings


def test_flags_set_the_fields_they_name():
    args = parser().parse_args([
        "--model", "qwen2.5-0.5b", "--gpu", "a100-80gb", "--tp", "2", "--chunk", "4096",
        "--max-num-seqs", "64", "--no-enable-prefix-caching", "--vmm-handle-mib", "256",
        "--policy", "elastic", "--drain", "wait", "--kv-cache-dtype", "fp8",
        "--cuda-graph-sizes", "8,1,2", "--max-model-len", "8192"])
    assert engine_config(args) == EngineConfig(
        get_model("qwen2.5-0.5b"), A100_80, tensor_parallel_size=2, max_num_batched_tokens=4096,
        max_num_seqs=64, enable_prefix_caching=False, vmm_handle_bytes=256 * MIB,
        policy=Policy.ELASTIC, drain=DrainStrategy.WAIT, kv_cache_dtype="fp8",
        cuda_graph_sizes=(1, 2, 8), max_model_len=8192)


def test_multi_valued_flags_run_every_combination_in_field_order():
    p = parser(multi=("max_num_batched_tokens", "policy"),
               multi_defaults={"policy": "static,elastic"})
    got = [(c.chunk_tokens, c.policy.value)
           for c in engine_configs(p.parse_args(["--chunk", "2048,8192"]))]
    assert got == [(2048, "static"), (2048, "elastic"), (8192, "static"), (8192, "elastic")]
    assert len(engine_configs(p.parse_args(["--policy", "all"]))) == len(Policy)


@pytest.mark.parametrize("argv, says", [
    (["--policy", ","], "give one or more values"),
    (["--chunk", "0,2048"], "give 1 or more, got '0'"),
    (["--chunk", "2k"], "expected an integer, got '2k'"),
    (["--model", "gpt-9"], "unknown model 'gpt-9'"),
    (["--dtype", "int4"], "unknown value 'int4'; known: auto, bfloat16, float16, float32"),
    (["--tp", "two"], "argument --tensor-parallel-size/--tp: expected an integer"),
])
def test_bad_flags_are_usage_errors_naming_the_flag(argv, says):
    p = parser(multi=("max_num_batched_tokens", "policy"))
    with pytest.raises(UsageError) as info:
        p.parse_args(argv)
    assert says in str(info.value)


def test_an_engine_config_file_is_the_base_the_flags_change(tmp_path):
    path = tmp_path / "run.json"
    path.write_text(EngineConfig(get_model("qwen2.5-0.5b"), max_num_seqs=64).to_json())
    args = parser().parse_args(["--engine-config", str(path), "--chunk", "2048"])
    assert engine_config(args) == EngineConfig(get_model("qwen2.5-0.5b"), max_num_seqs=64,
                                               max_num_batched_tokens=2048)
    with pytest.raises(ValueError, match="cannot read engine config"):
        engine_config(argparse.Namespace(engine_config=tmp_path / "missing.json"))


def test_piecewise_flags_set_each_configs_sizes_at_its_chunk():
    p = parser(multi=("max_num_batched_tokens",))
    configs = engine_configs(p.parse_args(["--chunk", "300,8192", "--piecewise-graphs",
                                           "--piecewise-max-tokens", "512"]))
    assert [c.piecewise_graph_sizes[-1] for c in configs] == [300, 512]
    with pytest.raises(ValueError, match="add --piecewise-graphs"):
        engine_configs(p.parse_args(["--piecewise-max-tokens", "512"]))


def test_help_shows_the_rules_of_rule_derived_defaults(capsys):
    with pytest.raises(SystemExit):
        parser().parse_args(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "the model's max_position_embeddings" in text
    assert "8192 on GPUs of >= 70 GiB other than A100, else 2048" in text
    assert json.dumps(EngineConfig().to_dict())  # JSON-safe


# ------------------------------------------------------- a replay's configuration, read back
def test_validation_reads_a_replays_config_json_as_written(tmp_path):
    from validation.runs import engine_config as run_config
    from validation.runs import load_summary

    ran = EngineConfig(get_model("qwen2.5-0.5b"), max_num_batched_tokens=2048,
                       policy=Policy.ELASTIC, cuda_graph_sizes=(1, 2, 4, 8))
    (tmp_path / "summary.json").write_text(json.dumps({"chunk": 2048, "model": "other"}))
    (tmp_path / "config.json").write_text(ran.to_json())
    summary = load_summary(tmp_path).summary
    assert run_config(summary) == ran
    assert run_config(summary, "a100-80gb") == ran.with_(gpu=A100_80)
    (tmp_path / "config.json").write_text('{"max_num_seqs": -1}')
    with pytest.raises(ValueError, match="config.json: --max-num-seqs -1"):
        load_summary(tmp_path)


def test_a_config_json_from_before_async_scheduling_ran_synchronously_a_users_file_async(
        tmp_path):
    from validation.runs import engine_config as run_config
    from validation.runs import load_summary

    before = {k: v for k, v in EngineConfig(max_num_batched_tokens=2048).to_dict().items()
              if k not in ("async_scheduling", "attention_backend")}
    (tmp_path / "summary.json").write_text(json.dumps({"chunk": 2048}))
    (tmp_path / "config.json").write_text(json.dumps(before))
    ran = run_config(load_summary(tmp_path).summary)
    assert (ran.async_scheduling, ran.attention_backend) == (False, "triton")
    assert EngineConfig.from_dict(before).async_scheduling is True


def test_a_config_json_from_before_mixed_split_ran_one_launch_a_users_file_splits(tmp_path):
    """Replays recorded before mixed_split_bytes existed ran every mixed step as one launch;
    a user's file without the key takes the default, 128 MiB of KV per layer: 32,768 keys of
    Llama-3.1-8B (8 KV heads x 128 x K and V x 2 bytes = 4 KiB a token per layer), twice as
    many under TP 2 (half the heads per GPU) or with an fp8 cache."""
    from validation.runs import engine_config as run_config
    from validation.runs import load_summary

    before = {k: v for k, v in EngineConfig(max_num_batched_tokens=2048).to_dict().items()
              if k != "mixed_split_bytes"}
    (tmp_path / "summary.json").write_text(json.dumps({"chunk": 2048}))
    (tmp_path / "config.json").write_text(json.dumps(before))
    ran = run_config(load_summary(tmp_path).summary)
    assert (ran.mixed_split_bytes, ran.mixed_split_min_keys) == (0, 0)
    written = EngineConfig.from_dict(before)
    assert written.mixed_split_bytes == 128 * 2**20 and written.mixed_split_min_keys == 32768
    assert written.with_(tensor_parallel_size=2).mixed_split_min_keys == 65536
    assert written.with_(kv_cache_dtype="fp8").mixed_split_min_keys == 65536
    assert written.with_(mixed_split_bytes=1).mixed_split_min_keys == 1
    with pytest.raises(ValueError, match="--mixed-split-mib -1: give 0"):
        written.with_(mixed_split_bytes=-2**20)


def test_a_replay_without_config_json_is_read_with_the_defaults_it_ran_under():
    from validation.runs import engine_config as run_config

    summary = {"model": "llama-3.1-8b", "gpu": "h200-141gb", "chunk": 8192, "policy": "elastic",
               "max_num_seqs": 256, "max_model_len": None, "executor": "gpu",
               "measured": {"graph_sizes": [4, 1, 2], "piecewise_sizes": None}}
    config = run_config(summary)
    assert config == EngineConfig(max_num_batched_tokens=8192, policy=Policy.ELASTIC,
                                  max_num_seqs=256, max_model_len=32768,
                                  drain=DrainStrategy.PREEMPT, enable_prefix_caching=False,
                                  cuda_graph_sizes=(1, 2, 4), async_scheduling=False,
                                  mixed_split_bytes=0)


def test_a_replay_records_the_graph_sizes_its_engine_captured():
    from gpu_backend.engine.replay import ran_config

    given = EngineConfig(cuda_graph_sizes=(512,))
    ran = ran_config(given, {"graph_sizes": [8, 1, 2], "piecewise_sizes": None})
    assert ran == given.with_(cuda_graph_sizes=(1, 2, 8))
    assert EngineConfig.from_json(ran.to_json()) == ran
