"""A profile's calibration JSON as `python -m gpu_backend refit` reads it: a bad file or field
is an error naming the file and the field, before any fit."""

from __future__ import annotations

import json
from pathlib import Path


def read_profile(path: Path) -> dict:
    """The profile at `path` (`python -m gpu_backend profile`'s calibration JSON) with what
    `refit` reads from it besides the measurement records (sim.core.calibration.records
    checks those); ValueError naming the file and the field otherwise."""
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: cannot read calibration JSON: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("measurements"), list):
        raise ValueError(f"{path}: not a calibration (no \"measurements\" list); give a JSON "
                         "written by `python -m gpu_backend profile`")
    for key in ("model", "gpu_preset"):  # what the grid is priced with
        if not isinstance(data.get(key), str):
            raise ValueError(f"{path}: {key} is {data.get(key)!r}; expected the profiled "
                             f"{key.split('_')[0]}'s name, as `python -m gpu_backend profile` "
                             "writes it")
    bandwidth = data.get("copy_bandwidth_bytes_s")
    if bandwidth is not None and (isinstance(bandwidth, bool) or not isinstance(
            bandwidth, int | float) or not 0 < bandwidth < float("inf")):
        raise ValueError(f"{path}: copy_bandwidth_bytes_s is {bandwidth!r}; expected the "
                         "measured copy bandwidth in bytes/s, a number above 0, or null")
    return data
