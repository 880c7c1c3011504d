"""GPU presets and user GPU spec files."""

import json

import pytest

from sim.core.catalog import GIB, GPUS, get_gpu

# Nominal memory: HBM and GDDR capacities are binary (an 80 GB H100 carries 80 GiB, of which
# the driver keeps a few hundred MiB), so what the runtime reports sits just below them.
NOMINAL_GIB = {"l4": 24, "a10g": 24, "l40s": 48, "a100-40gb": 40, "a100-80gb": 80,
               "h100-80gb": 80, "h200-141gb": 141, "h20": 96, "b200": 180, "mi300x": 192}


def test_every_preset_is_listed_with_runtime_memory_below_nominal():
    assert set(GPUS) == set(NOMINAL_GIB)
    for name, nominal in NOMINAL_GIB.items():
        assert 0.9 * nominal * GIB < GPUS[name].memory_bytes < nominal * GIB, name


def test_names_and_aliases():
    for alias, name in (("A100", "a100-80gb"), ("a100-40g", "a100-40gb"), ("h100-sxm", "h100-80gb"),
                        ("H200-141G", "h200-141gb"), ("L4", "l4"), ("A10G", "a10g"),
                        ("H20", "h20"), ("B200", "b200"), ("MI300X", "mi300x"), ("l40s", "l40s")):
        assert get_gpu(alias) is GPUS[name]


def test_datasheet_ratios():
    # H200 = H100 compute with faster HBM; H20 trades compute (148 of 989 TFLOPS) for bandwidth
    assert get_gpu("h200").peak_bf16_flops == get_gpu("h100").peak_bf16_flops
    assert get_gpu("h20").memory_bandwidth_bytes_s > get_gpu("h100").memory_bandwidth_bytes_s
    assert get_gpu("h20").peak_bf16_flops < get_gpu("h100").peak_bf16_flops / 6
    # PCIe cards: one direction of a Gen4 x16 link
    assert {get_gpu(n).interconnect_bytes_s for n in ("l4", "a10g", "l40s")} == {32e9}


GOOD_YAML = """\
name: my-gpu
memory_bytes: 85899345920
peak_bf16_flops: 989.4e12
memory_bandwidth_bytes_s: 3.35e+12
interconnect_bytes_s: 450e9
num_sms: 132
"""


def test_yaml_spec_file(tmp_path):
    path = tmp_path / "gpu.yaml"
    path.write_text(GOOD_YAML)
    gpu = get_gpu(str(path))
    assert (gpu.name, gpu.memory_bytes, gpu.num_sms) == ("my-gpu", 80 * GIB, 132)
    # YAML reads 989.4e12 (no exponent sign) as a string: accepted as the number it spells
    assert (gpu.peak_bf16_flops, gpu.memory_bandwidth_bytes_s) == (989.4e12, 3.35e12)
    assert gpu.vmm_granularity_bytes == 2 * 1024**2
    path.write_text(GOOD_YAML.replace("num_sms: 132\n", ""))
    assert get_gpu(str(path)).num_sms == 0  # optional: 0, unknown


def test_json_spec_file(tmp_path):
    path = tmp_path / "gpu.json"
    path.write_text(json.dumps({"name": "j", "memory_bytes": 24e9, "peak_bf16_flops": 1e14,
                                "memory_bandwidth_bytes_s": 1e12, "interconnect_bytes_s": 3e10}))
    assert get_gpu(str(path)).memory_bytes == 24_000_000_000


@pytest.mark.parametrize("edit, match", [
    (("name: my-gpu\n", ""), r"missing key\(s\) \['name'\]"),
    (("memory_bytes: 85899345920", "memory_bytes: lots"), "key 'memory_bytes' must be a number"),
    (("memory_bytes: 85899345920", "memory_bytes: 1.5"), "'memory_bytes' must be a whole number"),
    (("num_sms: 132", "num_sms: true"), "key 'num_sms' must be a number"),
    (("num_sms: 132", "num_smz: 132"), r"unknown key\(s\) \['num_smz'\]"),
    (("interconnect_bytes_s: 450e9", "interconnect_bytes_s: 0"), "interconnect_bytes_s must be"),
    (("name: my-gpu", "name: [a, b"), "not valid YAML"),
])
def test_spec_file_errors_name_file_and_key(tmp_path, edit, match):
    path = tmp_path / "gpu.yml"
    path.write_text(GOOD_YAML.replace(*edit))
    with pytest.raises(ValueError, match=match) as info:
        get_gpu(str(path))
    assert str(path) in str(info.value)


def test_missing_spec_file_and_unknown_name(tmp_path):
    with pytest.raises(ValueError, match="cannot read GPU spec"):
        get_gpu(str(tmp_path / "nowhere.yaml"))
    with pytest.raises(ValueError, match="unknown GPU 'v100'.*mi300x.*or give a .yaml/.json"):
        get_gpu("v100")
