"""Where each job's replica is kept: the buddy plan.

A job with replicas leaves a copy of its sleeping trainer in the host memory of another
node of the training pool (its buddy) after every training phase, so the failure of the
node its trainer sits on loses no progress: the node's replacement pulls the copy from the
buddy, a peer, instead of reading the last checkpoint. Rollout weights need no copy of
their own: they are the trainer's, given again to the rollouts after a restore.

A copy counts in its buddy's residency budget like any resident state, but it never
displaces one: buddies are chosen among the room that the placement leaves. Held training
nodes come first, the one with the most room left (their host memory is paid for anyway,
and a standby then keeps all of its memory for the node it takes over), then the pool's
standby nodes. A copy that fits nowhere is not kept, and its job recovers from its
checkpoint; a trainer spread over several nodes has no copy (each shard would need a buddy
of its own). The plan is a function of the cluster alone, so a restarted control plane
finds the buddies it named before.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from rollmux.core.cluster import Cluster
from rollmux.core.spec import Pool


@dataclass(frozen=True, order=True)
class Buddy:
    """A node that keeps a job's replica: a held training node (``node``, its id) or the
    training pool's ``standby``-th standby node."""

    node: int | None = None
    standby: int | None = None

    def __post_init__(self) -> None:
        if (self.node is None) == (self.standby is None):
            raise ValueError("a buddy is either a held node or a standby slot, exactly one")

    @property
    def key(self) -> str:
        """``node:<id>`` or ``standby:<slot>``: how the runtime names it."""
        return f"node:{self.node}" if self.node is not None else f"standby:{self.standby}"

    @staticmethod
    def parse(key: str) -> Buddy:
        kind, _, number = key.partition(":")
        if kind not in ("node", "standby") or not number.isdigit():
            raise ValueError(f"not a buddy: {key!r} (expected node:<id> or standby:<slot>)")
        return Buddy(node=int(number)) if kind == "node" else Buddy(standby=int(number))


@dataclass(frozen=True)
class BuddyPlan:
    """Each replicated job's buddy, and the replicated jobs whose copy has no buddy."""

    buddies: dict[str, Buddy]
    unplaced: tuple[str, ...]

    def replicated(self, job: str, failed: Buddy | None = None) -> bool:
        """Whether the job's copy survives the loss of ``failed`` (its buddy is another node)."""
        buddy = self.buddies.get(job)
        return buddy is not None and buddy != failed


def plan_buddies(cluster: Cluster, replicated: Collection[str], standby: int) -> BuddyPlan:
    """Name a buddy for every placed job of ``replicated`` whose trainer sits on one node:
    the largest copies first, each on the held training node (not its own) with the most
    room left after the placement and the copies already named, else on the first standby
    with room; ``standby`` is the number of standby training nodes kept."""
    usable = cluster.cost.usable_dram_gb(Pool.TRAIN)
    room: dict[Buddy, float] = {}
    copies: list[tuple[str, int, float]] = []
    placed: set[str] = set()
    for group in cluster.groups.values():
        for node in group.train_nodes:
            room[Buddy(node=node)] = usable - group.mem_used_gb(node)
        for member in group.members:
            placed.add(member.job.name)
            if member.job.name in replicated and len(member.train_nodes) == 1:
                copies.append((member.job.name, member.train_nodes[0], member.job.train_mem_gb))
    for slot in range(standby):
        room[Buddy(standby=slot)] = usable
    buddies: dict[str, Buddy] = {}
    for name, trainer, gb in sorted(copies, key=lambda c: (-c[2], c[0])):
        buddy = _roomiest(room, gb, exclude=Buddy(node=trainer))
        if buddy is not None:
            buddies[name] = buddy
            room[buddy] -= gb
    unplaced = tuple(sorted(n for n in replicated if n in placed and n not in buddies))
    return BuddyPlan(buddies, unplaced)


def _roomiest(room: dict[Buddy, float], gb: float, exclude: Buddy) -> Buddy | None:
    """The held node with the most room for ``gb`` (lowest id on a tie), else the first
    standby slot with room, else None."""
    tolerance = 1e-9
    held = [b for b in room if b.node is not None and b != exclude and room[b] + tolerance >= gb]
    if held:
        return min(held, key=lambda b: (-room[b], b.node))
    spare = sorted(b for b in room if b.standby is not None and room[b] + tolerance >= gb)
    return spare[0] if spare else None
