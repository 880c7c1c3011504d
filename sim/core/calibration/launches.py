"""Attention launches timed alone outside a profile, added to a calibration's attention fit.

A profile times the attention of each grid step with prefill tokens as one launch alone
(`attention_measurements`), and the refit fits the attention's terms to those launches before
the whole steps. The grid holds few chunks over a long prefix, the steps Mooncake's traffic
runs most. `benchmarks/prefix_attention.py` times such launches the same way (one layer's
Triton launch alone, a GPU-side sleep before each, the median of 20, times the layers): its
34 shapes of chunks over prefixes of 1k-24k keys, and a 16k prompt's chunks. Added here, the
next refit fits the attention's terms to the profile's launches and these together.

Only a result of the calibration's model and GPU, timed with its torch and Triton, is taken,
and only launches of shapes the calibration does not hold already. The calibration records
each file added (`added_attention_launches`: its path, GPU, date measured, command and the
launches taken), which later refits keep.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

from sim.core.calibration.schema import read_json_object
from sim.core.split_shapes import TRITON_ATTENTION

LAUNCH_KEYS = ("kind", "prefills", "num_decodes", "decode_context", "decode_groups",
               "measured_s")
SAME_VERSIONS = ("torch", "triton")  # the kernel's code and its compiler
RECORD_KEY = "added_attention_launches"


def read_result(path: str | Path) -> dict:
    """The JSON object of a benchmarks/prefix_attention.py result file."""
    return read_json_object(path, "a prefix_attention result",
                            "holds a JSON {kind}; a prefix_attention result is an object "
                            "with 'model', 'env' and 'shapes'")


def _shape(launch: Mapping) -> tuple:
    return (launch["kind"], json.dumps(launch["prefills"]), launch["num_decodes"],
            launch["decode_context"], json.dumps(launch["decode_groups"]))


def _check_source(data: Mapping, result: Mapping, source: str) -> Mapping:
    """ValueError naming `source`'s field unless its launches time the kernel `data` prices
    (the Triton one), on its model, GPU, torch and Triton; the result's `env`."""
    backend = data.get("attention_backend", TRITON_ATTENTION)
    if backend != TRITON_ATTENTION:
        raise ValueError(f"{source}: its launches time the Triton kernel, and this calibration "
                         f"prices the {backend} backend's attention: add them to the Triton "
                         "calibration its terms come from, then refit this one with "
                         "--attention-from")
    if result.get("model") != data.get("model"):
        raise ValueError(f"{source}: field 'model' is {result.get('model')!r}, the "
                         f"calibration's is {data.get('model')!r}: time the launches with "
                         f"--model {data.get('model')}")
    env = result.get("env")
    if not isinstance(env, Mapping):
        raise ValueError(f"{source}: no field 'env' (the GPU and versions the launches ran "
                         "on); a benchmarks/prefix_attention.py result holds one")
    if env.get("gpu") != data.get("gpu"):
        raise ValueError(f"{source}: field 'env.gpu' is {env.get('gpu')!r}, the calibration "
                         f"was profiled on {data.get('gpu')!r}: time the launches on that GPU")
    provenance = data.get("provenance") or {}
    for key in SAME_VERSIONS:
        if env.get(key) != provenance.get(key):
            raise ValueError(f"{source}: field 'env.{key}' is {env.get(key)!r}, the "
                             f"calibration's is {provenance.get(key)!r}: time the launches "
                             "with the versions that profiled it")
    return env


def add_attention_launches(data: dict, result: Mapping, source: str) -> tuple[dict, int]:
    """`data` (a calibration) with the launches of `result` (a prefix_attention result read
    from `source`) that it lacks appended to its attention measurements, and how many."""
    env = _check_source(data, result, source)
    chunks = result.get("prompt_chunks") or {}
    launches = list(result.get("shapes") or [])
    launches += [launch for size in sorted(chunks, key=int) for launch in chunks[size]]
    have = {_shape(m) for m in data.get("attention_measurements") or ()}
    added = []
    for index, launch in enumerate(launches):
        missing = [key for key in LAUNCH_KEYS if key not in launch]
        if missing:
            raise ValueError(f"{source}: launch {index} has no field {missing[0]!r} (each "
                             f"launch needs {', '.join(LAUNCH_KEYS)})")
        try:
            seconds = float(launch["measured_s"])
        except (TypeError, ValueError):
            seconds = float("nan")
        if not seconds > 0:
            raise ValueError(f"{source}: launch {index}: measured_s "
                             f"{launch['measured_s']!r} is not a positive number of seconds")
        shape = _shape(launch)
        if shape in have:
            continue
        have.add(shape)
        added.append({key: launch[key] for key in LAUNCH_KEYS})
    if not added:
        return data, 0
    record = {"source": source, "gpu": env.get("gpu"), "measured_on": result.get("measured_on"),
              "command": result.get("command"), "launches": len(added)}
    return {**data,
            "attention_measurements": [*(data.get("attention_measurements") or ()), *added],
            RECORD_KEY: [*(data.get(RECORD_KEY) or ()), record]}, len(added)
