"""Compile the paged-attention and merge kernels for an H100/H200 (sm_90) without a GPU and
print what the hardware would run: registers, stack spills, shared memory and the mix of
load instructions (cp.async = LDGSTS, vector loads = .128), for each launch variant.

Usage: python benchmarks/kernel_sass.py
Needs only triton (its wheel ships ptxas, cuobjdump and nvdisasm); match the GPU machine's
triton version for faithful output (`pip install triton==3.6.0` in a scratch venv).
Pointer and stride arguments are marked divisible by 16, as a real launch specialises them.
"""

from __future__ import annotations

import collections
import importlib.util
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

KERNELS = Path(__file__).resolve().parents[1] / "gpu_backend" / "kernels" / "attention_kernel.py"
TARGET = GPUTarget("cuda", 90, 32)
STRIDES = ("stride_qt", "stride_qh", "stride_ot", "stride_oh", "stride_bt", "stride_kb",
           "stride_ks", "stride_kh", "stride_vb", "stride_vs", "stride_vh", "num_heads")
POINTER_TYPES = {"q_ptr": "*bf16", "k_cache_ptr": "*bf16", "v_cache_ptr": "*bf16",
                 "out_ptr": "*bf16", "part_acc_ptr": "*fp32", "part_ml_ptr": "*fp32"}
OPS = re.compile(r"\b(LDGSTS[.A-Z0-9]*|LDG[.A-Z0-9]*|STL[.A-Z0-9]*|LDL[.A-Z0-9]*|HMMA[.A-Z0-9]*)")


def load_kernels():
    """The kernel module alone (the package imports torch, which this needs not)."""
    spec = importlib.util.spec_from_file_location("attention_kernel", KERNELS)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def compile_variant(fn, constants: dict, num_warps: int, num_stages: int = 3):
    signature = {n: POINTER_TYPES.get(n, "*i32" if n.endswith("_ptr") else "i32")
                 for n in fn.arg_names if n not in constants}
    signature["scale_log2"] = "fp32" if "scale_log2" in signature else None
    signature = {k: v for k, v in signature.items() if v is not None}
    signature.update({n: "constexpr" for n in constants})
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(fn.arg_names)
             if n.endswith("_ptr") or n in STRIDES}
    source = ASTSource(fn, signature, constants, attrs=attrs)
    return triton.compile(source, target=TARGET,
                          options={"num_warps": num_warps, "num_stages": num_stages})


def describe(name: str, kernel) -> None:
    tools = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(kernel.asm["cubin"])
    try:
        usage = subprocess.run([tools / "cuobjdump", "--dump-resource-usage", f.name],
                               capture_output=True, text=True, check=True).stdout
        sass = subprocess.run([tools / "nvdisasm", f.name], capture_output=True, text=True,
                              check=True).stdout
    finally:
        os.unlink(f.name)
    resources = next((line.strip() for line in usage.splitlines() if "REG:" in line), "?")
    regs = re.search(r"REG:(\d+)", resources)
    stack = re.search(r"STACK:(\d+)", resources)
    ops = collections.Counter(OPS.findall(sass))
    print(f"{name:<36} regs {regs.group(1) if regs else '?':>4}  stack {stack.group(1) if stack else '?':>4} B  "
          f"dynamic smem {kernel.metadata.shared:>6} B  "
          + ", ".join(f"{op} {n}" for op, n in ops.most_common(8)))


def main() -> None:
    k = load_kernels()
    print(f"triton {triton.__version__}, target sm_{TARGET.arch}; Llama-3.1-8B heads (32 q, 8 kv, "
          "d 128), block 16")
    decode = dict(BLOCK_SIZE=16, GROUP=4, HEAD_DIM=128, HEAD_DIM_PAD=128, BLOCK_M=16, BLOCK_Q=4,
                  BLOCK_N=64, ONE_TILE_PER_SEQ=True)
    prefill = dict(BLOCK_SIZE=16, GROUP=4, HEAD_DIM=128, HEAD_DIM_PAD=128, BLOCK_M=128,
                   BLOCK_Q=32, BLOCK_N=128, ONE_TILE_PER_SEQ=False, SPLIT_PLAN=False)
    for plan in (True, False):
        describe(f"attention decode, split plan={plan}",
                 compile_variant(k.paged_attention_kernel, {**decode, "SPLIT_PLAN": plan}, 2, 4))
    describe("attention prefill", compile_variant(k.paged_attention_kernel, prefill, 8, 3))
    for plan in (True, False):
        merge = dict(HEAD_DIM=128, HEAD_DIM_PAD=128, SPLITS_PAD=32, SPLIT_PLAN=plan)
        describe(f"merge, split plan={plan}", compile_variant(k.combine_splits_kernel, merge, 4))
    plan_consts = dict(SEQS_PAD=64, MIN_KEYS=256, MAX_SPLITS=32, BLOCK_N=64, NUM_CANDIDATES=13)
    describe("decode split plan (64 sequences)",
             compile_variant(k.decode_split_plan_kernel, plan_consts, 4))


if __name__ == "__main__":
    sys.exit(main())
