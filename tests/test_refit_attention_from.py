"""`python -m gpu_backend refit CAL --attention-from OTHER` on the shipped calibrations: a
profile on the auto backend takes the Triton kernel's attention terms from the same GPU and
model's profile on the triton backend, and fits the rest around them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpu_backend.__main__ import main
from sim.core.calibration.attention_fit import TRITON_ATTENTION_PARAMETERS

CAL = Path(__file__).resolve().parents[1] / "calibration"
AUTO = str(CAL / "h100" / "llama-3.1-8b-auto.json")
EAGER = str(CAL / "h100" / "llama-3.1-8b.json")


def _refit(tmp_path: Path, *args: str) -> tuple[int, dict | None]:
    out = tmp_path / "refit.json"
    code = main(["refit", *args, "--out", str(out)])
    return code, json.loads(out.read_text()) if code == 0 else None


def test_auto_profile_holds_the_triton_terms_of_the_triton_profile(tmp_path):
    code, refit = _refit(tmp_path, AUTO, "--attention-from", EAGER)
    assert code == 0
    eager = json.loads(Path(EAGER).read_text())["efficiency"]
    for name in TRITON_ATTENTION_PARAMETERS:
        assert refit["efficiency"][name] == eager[name], name
    held = refit["attention_terms_from"]
    assert held["calibration"] == EAGER and held["model"] == "llama-3.1-8b"
    assert held["terms"] == {name: eager[name] for name in TRITON_ATTENTION_PARAMETERS}
    # SPLIT's own terms are still fitted on the auto profile's launches (cuDNN's rate there,
    # not the 0.67 default an unfitted calibration keeps)
    assert 0.5 < refit["efficiency"]["split_attention_compute"] < 0.66
    assert refit["efficiency"]["split_call_s"] > 0


def test_a_plain_refit_fits_the_terms_again_and_drops_the_record(tmp_path):
    _, held = _refit(tmp_path, AUTO, "--attention-from", EAGER)
    again = tmp_path / "held.json"
    again.write_text(json.dumps(held))
    code, refit = _refit(tmp_path, str(again))
    assert code == 0 and "attention_terms_from" not in refit
    assert refit["efficiency"]["attention_compute"] != held["efficiency"]["attention_compute"]


@pytest.mark.parametrize("target, source, says", [
    (EAGER, EAGER, "runs the triton attention backend"),
    (str(CAL / "h200" / "llama-3.1-8b-auto.json"), EAGER, "GPU 'h100-80gb', not 'h200-141gb'"),
    (str(CAL / "h200" / "llama-3.2-3b-piecewise-auto.json"),
     str(CAL / "h200" / "llama-3.1-8b.json"), "model 'llama-3.1-8b', not 'llama-3.2-3b'"),
    (AUTO, AUTO, "profiled on the auto attention backend"),
    (str(CAL / "h200" / "llama-3.1-8b-auto.json"), str(CAL / "h200" / "llama-3.1-8b-unfused.json"),
     "no attention launches timed alone"),
])
def test_refuses_terms_the_source_cannot_vouch_for(tmp_path, capsys, target, source, says):
    code, _ = _refit(tmp_path, target, "--attention-from", source)
    assert code == 2
    assert says in capsys.readouterr().err


def test_program_from_and_attention_from_exclude_each_other(tmp_path, capsys):
    code, _ = _refit(tmp_path, AUTO, "--attention-from", EAGER, "--program-from", EAGER)
    assert code == 2
    assert "not allowed with argument --attention-from" in capsys.readouterr().err
