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
class VmmCosts:
    """Attach and detach time of a reserve: a cost per handle plus a cost per GiB, plus a
    fixed cost per transition (an engine's own: device syncs, handing torch's cached blocks
    back; measured by `python -m gpu_backend profile`, zero for the driver microbenchmark).

    `attach_cache_gib_s`: per GiB of activation memory the engine's allocator still caches
    when it attaches (a release-mode attach hands it back first, torch's empty_cache, so that
    the reserve's physical memory is free). Over 1,316 replayed attaches on an H200:
    empty_cache took 0.31 ms (median) with nothing cached, 1.0 ms with 0.05-0.2 GiB, 1.9 ms with
    0.5-2 GiB, and was 53% of all attach time; the two attaches over 20 ms spent 94% there."""

    attach_handle_s: float
    attach_gib_s: float
    detach_handle_s: float
    detach_gib_s: float
    attach_fixed_s: float = 0.0
    detach_fixed_s: float = 0.0
    attach_cache_gib_s: float = 0.0

    def __post_init__(self) -> None:
        for name, value in vars(self).items():
            if not value >= 0.0:
                raise ValueError(f"VMM cost {name} = {value!r}: must be a number >= 0")


# Least-squares fits (relative error) to benchmarks/results/vmm_latency_nvidia-h200.json: one
# H200, driver 580.159, cuda-bindings 13.3.1, reserves of 1-32 GiB in handles of 2 MiB-2 GiB,
# median of 3. Remap (map + set access / unmap, handles kept): median error 11-14%, max 25%.
# Release (create + map + set access / unmap + release): median 17-24%; releasing large
# handles is what the per-GiB detach term carries. DESIGN.md's figures for 2 MiB handles
# (map 2 + set access 26 us) were about half of what this machine measured (59 us).
H200_REMAP = VmmCosts(attach_handle_s=59.0e-6, attach_gib_s=0.055e-3,
                      detach_handle_s=58.7e-6, detach_gib_s=0.057e-3)
H200_RELEASE = VmmCosts(attach_handle_s=51.1e-6, attach_gib_s=0.128e-3,
                        detach_handle_s=41.6e-6, detach_gib_s=0.493e-3)


@dataclass(frozen=True)
class VmmCostModel:
    """Time of CUDA VMM transitions; cost is mostly per handle, nearly independent of its size.

    `reclaim` says how the detached reserve reaches the activations: "remap" keeps the physical
    handles and maps them elsewhere, "release" frees them and creates them again. `costs`
    defaults to the H200 measurement for that mode.
    """

    handle_bytes: int = 512 * MIB
    reclaim: str = "remap"
    costs: VmmCosts | None = None

    def __post_init__(self) -> None:
        if self.handle_bytes <= 0 or self.handle_bytes % (2 * MIB):
            raise ValueError(
                f"VMM handle size {self.handle_bytes} B is not a positive multiple of the "
                "2 MiB granularity; pick e.g. 2 MiB, 512 MiB or 2 GiB"
            )
        if self.reclaim not in ("remap", "release"):
            raise ValueError(f"reclaim must be 'remap' or 'release', got {self.reclaim!r}")

    @property
    def measured(self) -> VmmCosts:
        if self.costs is not None:
            return self.costs
        return H200_REMAP if self.reclaim == "remap" else H200_RELEASE

    def num_handles(self, num_bytes: int) -> int:
        return -(-num_bytes // self.handle_bytes)

    def attach_s(self, num_bytes: int, cached_bytes: int = 0) -> float:
        """Attaching `num_bytes` of the reserve with `cached_bytes` of activations cached:
        the mapping (`map_s`), then the cache handed back (`cache_release_s`)."""
        if num_bytes <= 0:
            return 0.0
        return self.map_s(num_bytes) + self.cache_release_s(cached_bytes)

    def map_s(self, num_bytes: int) -> float:
        """Attaching `num_bytes` (> 0) of the reserve with no activations cached."""
        c = self.measured
        return (c.attach_fixed_s + self.num_handles(num_bytes) * c.attach_handle_s
                + num_bytes / GIB * c.attach_gib_s)

    def cache_release_s(self, cached_bytes: int) -> float:
        """Handing `cached_bytes` of cached activations back before an attach."""
        return cached_bytes / GIB * self.measured.attach_cache_gib_s

    def detach_s(self, num_bytes: int) -> float:
        if num_bytes <= 0:
            return 0.0
        c = self.measured
        return (c.detach_fixed_s + self.num_handles(num_bytes) * c.detach_handle_s
                + num_bytes / GIB * c.detach_gib_s)


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
