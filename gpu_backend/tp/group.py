"""The tensor-parallel process group and the scalar collectives the engine agrees on.

Every rank runs the same deterministic scheduler on the same trace, so the ranks only have
to agree on what they measure: step and pause durations (MAX: a TP step ends when its
slowest rank does), the KV block count (MIN: the scheduler's pool is one), and whether any
rank ran out of memory.
"""

from __future__ import annotations

import os
import socket
import sys
from dataclasses import dataclass

import torch
import torch.distributed as dist

# NVLink SHARP (multicast) stays off: a program that uses it can take a shared host's GPUs out
# of service; set before init.
NCCL_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
            "NVSHMEM_DISABLE_NVLS": "1"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class TpGroup:
    rank: int
    world_size: int
    device: torch.device
    group: dist.ProcessGroup | None = None  # None: the default (world) group

    @property
    def is_first(self) -> bool:
        return self.rank == 0

    def _reduce(self, values: list[float], op: dist.ReduceOp) -> list[float]:
        t = torch.tensor(values, dtype=torch.float64, device=self.device)
        dist.all_reduce(t, op=op, group=self.group)
        return t.tolist()

    def max_float(self, value: float) -> float:
        return self._reduce([value], dist.ReduceOp.MAX)[0]

    def max_floats(self, values: list[float]) -> list[float]:
        return self._reduce(values, dist.ReduceOp.MAX)

    def min_int(self, value: int) -> int:
        return int(self._reduce([value], dist.ReduceOp.MIN)[0])

    def any(self, *flags: bool) -> list[bool]:
        """Element-wise OR of the flags over the ranks."""
        return [v > 0 for v in self._reduce([float(f) for f in flags], dist.ReduceOp.MAX)]

    def gather_objects(self, obj: object) -> list[object]:
        objects: list[object] = [None] * self.world_size
        dist.all_gather_object(objects, obj, group=self.group)
        return objects

    def all_reduce_(self, tensor: torch.Tensor) -> torch.Tensor:
        """In-place sum over the ranks (the row-parallel layers' partial outputs)."""
        dist.all_reduce(tensor, group=self.group)
        return tensor

    def all_gather_last(self, tensor: torch.Tensor) -> torch.Tensor:
        """[..., n] per rank -> [..., world_size * n], rank-major (vocab-parallel logits)."""
        parts = [torch.empty_like(tensor) for _ in range(self.world_size)]
        dist.all_gather(parts, tensor.contiguous(), group=self.group)
        return torch.cat(parts, dim=-1)


def init_tp(rank: int, world_size: int, port: int, backend: str | None = None) -> TpGroup:
    """Join the group on 127.0.0.1:port; NCCL with one GPU per rank, gloo on CPU."""
    os.environ.update(NCCL_ENV)
    backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
    if backend == "nccl":
        device = torch.device("cuda", rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world_size)
    return TpGroup(rank, world_size, device)


def close_tp() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def spawn_ranks(fn, world_size: int, *args, backend: str | None = None) -> None:
    """Run fn(group, *args) in world_size fresh processes (one per GPU); raises if any fails.
    backend: None picks NCCL when CUDA is present, else gloo (tests pass "gloo")."""
    import torch.multiprocessing as mp

    mp.spawn(_rank_main, args=(world_size, free_port(), backend, fn, args), nprocs=world_size,
             join=True)


def _rank_main(rank: int, world_size: int, port: int, backend: str | None, fn,
               args: tuple) -> None:
    group = init_tp(rank, world_size, port, backend)
    try:
        fn(group, *args)
        dist.barrier()  # no rank tears gloo/NCCL down while another still talks to it
    finally:
        close_tp()
    # A clean finish skips the interpreter's teardown: gloo's worker threads, destroyed there,
    # abort the process now and then (SIGABRT, "terminate called without an active
    # exception") after all the work is done. Errors above still propagate to spawn.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
