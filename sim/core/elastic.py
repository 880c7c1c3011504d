"""Elastic reclamation of the activation reserve: policies, VMM costs and the controller.

Policies
    static      the reserve stays reserved for activations; the KV pool is the base region.
    overcommit  the reserve is added to the KV pool for good. Its blocks are treated as mapped
                on first use (as a lazily backed VMM pool such as kvcached would), so a step
                fails with out-of-memory when its activations exceed the reserve minus the
                elastic blocks in use. The run reports it; it never silently succeeds.
    elastic     the reserve, less the activation peak of the largest decode-only step, is
                attached to the KV pool while the coming steps are decode-only, and drained and
                detached before a step that needs activation memory (any prefill).

Drain strategies (elastic only), applied when a prefill is pending while elastic blocks are used:
    preempt     preempt the requests holding elastic blocks (recompute later).
    wait        lend no more elastic blocks and hold prefills back until the holders finish.
    migrate     copy the holders' elastic blocks into free base blocks; preempt those that
                do not fit.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass

GIB = 1024**3
MIB = 1024**2
GRANULE_BYTES = 2 * MIB  # CUDA VMM allocation granularity on Hopper (and Ampere)


class Policy(enum.Enum):
    STATIC = "static"
    ELASTIC = "elastic"
    OVERCOMMIT = "overcommit"

    @classmethod
    def parse(cls, name: str) -> Policy:
        try:
            return cls(name.strip().lower())
        except ValueError:
            known = ", ".join(p.value for p in cls)
            raise ValueError(f"unknown policy {name!r}; known: {known}") from None


class DrainStrategy(enum.Enum):
    PREEMPT = "preempt"
    WAIT = "wait"
    MIGRATE = "migrate"

    @classmethod
    def parse(cls, name: str) -> DrainStrategy:
        try:
            return cls(name.strip().lower())
        except ValueError:
            known = ", ".join(d.value for d in cls)
            raise ValueError(f"unknown drain strategy {name!r}; known: {known}") from None


@dataclass(frozen=True)
class VmmCostModel:
    """Time of CUDA VMM operations; cost is per handle, nearly independent of handle size.

    Defaults measured on one H200 (DESIGN.md) per 2 MiB handle: create ~10 us, map ~2 us,
    set-access ~26 us, unmap ~18 us, release ~12 us. The per-GiB terms cover the size-dependent
    rest (8 GiB as 512 MiB handles attaches in ~1 ms, not 16 x 28 us). `reclaim` says how the
    detached reserve reaches the activations: "remap" keeps the physical handles and maps them
    elsewhere (attach = map + set access), "release" frees them and creates them again.
    """

    handle_bytes: int = 512 * MIB
    create_s: float = 10e-6
    map_s: float = 2e-6
    set_access_s: float = 26e-6
    unmap_s: float = 18e-6
    release_s: float = 12e-6
    attach_s_per_gib: float = 0.07e-3
    detach_s_per_gib: float = 0.02e-3
    reclaim: str = "remap"

    def __post_init__(self) -> None:
        if self.handle_bytes <= 0 or self.handle_bytes % (2 * MIB):
            raise ValueError(
                f"VMM handle size {self.handle_bytes} B is not a positive multiple of the "
                "2 MiB granularity; pick e.g. 2 MiB, 512 MiB or 2 GiB"
            )
        if self.reclaim not in ("remap", "release"):
            raise ValueError(f"reclaim must be 'remap' or 'release', got {self.reclaim!r}")

    def num_handles(self, num_bytes: int) -> int:
        return -(-num_bytes // self.handle_bytes)

    def attach_s(self, num_bytes: int) -> float:
        per_handle = self.map_s + self.set_access_s
        if self.reclaim == "release":
            per_handle += self.create_s
        return self.num_handles(num_bytes) * per_handle + num_bytes / GIB * self.attach_s_per_gib

    def detach_s(self, num_bytes: int) -> float:
        per_handle = self.unmap_s + (self.release_s if self.reclaim == "release" else 0.0)
        return self.num_handles(num_bytes) * per_handle + num_bytes / GIB * self.detach_s_per_gib


ActivationFn = Callable[[int, int], int]
"""activation_bytes(num_tokens, num_sample_rows): peak activation bytes of one step."""


@dataclass(frozen=True)
class ReserveLayout:
    """How much of the activation reserve each policy lends, in bytes and KV blocks."""

    reserve_bytes: int
    lent_bytes: int
    num_elastic_blocks: int
    block_bytes: int
    num_handles: int
    granule_bytes: int = GRANULE_BYTES  # lent sizes are whole granules of the VMM allocator


def plan_reserve(
    policy: Policy,
    reserve_bytes: int,
    block_bytes: int,
    handle_bytes: int,
    decode_headroom_bytes: int,
    granule_bytes: int = GRANULE_BYTES,
) -> ReserveLayout:
    """Size the elastic region: a whole number of 2 MiB granules, then whole KV blocks.

    The region is mapped as handles of `handle_bytes` with a smaller last handle, so the
    handle size changes the attach cost, not the capacity. For the elastic policy this is the
    largest region ever lent: `decode_headroom_bytes` is the activation peak of the smallest
    decode step (one sequence); each attach lends what the current decode batch leaves free.
    """
    if policy is Policy.STATIC:
        lendable = 0
    elif policy is Policy.ELASTIC:
        lendable = max(0, reserve_bytes - decode_headroom_bytes)
    else:
        lendable = reserve_bytes
    lent_bytes = lendable // granule_bytes * granule_bytes
    num_blocks = lent_bytes // block_bytes
    num_handles = -(-lent_bytes // handle_bytes)
    return ReserveLayout(reserve_bytes, lent_bytes, num_blocks, block_bytes, num_handles,
                         granule_bytes)
