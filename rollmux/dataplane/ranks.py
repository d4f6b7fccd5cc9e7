"""Roles that span several nodes: one rank per node of the phase, joined by a process group.

A job whose phase is N nodes wide has a role on each of those nodes. RollMux makes them
the N ranks of one torch.distributed process group (gloo on CPU, NCCL where the role's
device is a GPU), built per job and phase beside the worker's other jobs — never the
process-wide default group, which a worker hosting several jobs cannot share. The
driver's first call of a wide phase builds it (the rank-0 worker opens a store, every
rank joins) and builds it again when the job has moved; role code reaches its rank, the
world size and the group through :func:`current` while one of its calls runs.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import ray
import torch
import torch.distributed as dist

JOIN_TIMEOUT = timedelta(seconds=120)


@dataclass(frozen=True)
class Ranks:
    """This role's place in its phase: rank ``rank`` of ``world``, and their group."""

    rank: int = 0
    world: int = 1
    group: Any = None

    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum ``tensor`` over the ranks in place (nothing to do alone)."""
        if self.world > 1:
            self.group.allreduce([tensor]).wait()
        return tensor

    def shard(self, count: int) -> slice:
        """This rank's share of ``count`` items: contiguous, sizes differing by one at most."""
        return slice(self.rank * count // self.world, (self.rank + 1) * count // self.world)


ALONE = Ranks()
_serving = threading.local()


def current() -> Ranks:
    """The ranks of the role whose call runs in this thread (alone outside a wide phase)."""
    return getattr(_serving, "ranks", ALONE)


@contextmanager
def serving(ranks: Ranks) -> Iterator[None]:
    _serving.ranks = ranks
    try:
        yield
    finally:
        _serving.ranks = ALONE


def open_store() -> tuple[dist.TCPStore, str, int]:
    """A rendezvous store served by this process on a free port, and where to reach it."""
    store = dist.TCPStore("0.0.0.0", 0, is_master=True, wait_for_workers=False, timeout=JOIN_TIMEOUT)
    return store, ray.util.get_node_ip_address(), store.port


def join(store: dist.Store | None, host: str, port: int, rank: int, world: int, prefix: str) -> Ranks:
    """Join the group ``prefix`` as ``rank`` of ``world``; blocks until every rank has joined.
    Rank 0 passes the store it opened, the others reach it at ``host:port``."""
    if store is None:
        store = dist.TCPStore(host, port, is_master=False, timeout=JOIN_TIMEOUT)
    scoped = dist.PrefixStore(prefix, store)
    if torch.cuda.is_available():
        group = dist.ProcessGroupNCCL(scoped, rank, world)
    else:
        group = dist.ProcessGroupGloo(scoped, rank, world, JOIN_TIMEOUT)
    return Ranks(rank, world, group)
