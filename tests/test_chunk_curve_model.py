"""benchmarks/chunk_curve_model.py on the CPU: a curve is priced with the mixed split it ran."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import chunk_curve_model  # noqa: E402


def model_ttfts(tmp_path, capsys, **recorded) -> dict[tuple[int, int], float]:
    """Model TTFT per (decodes, chunk) of a 16k prompt's curve, alone and beside 64 decodes."""
    rows = [{"prompt": 16384, "chunk": c, "num_decodes": d, "ttft_s": 0.5}
            for d in (0, 64) for c in (2048, 16384)]
    result = tmp_path / "engine.json"
    result.write_text(json.dumps({"model": "llama-3.1-8b", "attention_backends": ["triton"],
                                  "chunk_curve": rows, **recorded}))
    assert chunk_curve_model.main([
        "--result", str(result), "--attention-backend", "triton",
        "--calibration", str(ROOT / "calibration/h200/llama-3.1-8b.json")]) == 0
    priced = {}
    for line in capsys.readouterr().out.splitlines():
        fields = line.split()
        if len(fields) >= 5 and re.fullmatch(r"\d+", fields[0]):
            priced[(int(fields[1]), int(fields[2]))] = float(fields[4])
    return priced


def test_a_curve_run_with_the_decode_rows_apart_is_priced_so(tmp_path, capsys):
    # a result from before the mixed split records no threshold: every step one launch
    one_launch = model_ttfts(tmp_path, capsys)
    apart = model_ttfts(tmp_path, capsys, mixed_split_min_keys=32768)
    # alone, nothing runs apart; beside 64 decodes of 1k (65,536 keys), the decode rows are
    # read as a decode step reads them rather than computed as 128-row tiles beside the chunk
    assert apart[(0, 2048)] == one_launch[(0, 2048)]
    assert apart[(64, 2048)] < one_launch[(64, 2048)]
    # under the threshold the same steps stay one launch
    assert model_ttfts(tmp_path, capsys, mixed_split_min_keys=65537) == one_launch
