"""Turn-taking of a live group: which job may start which phase on which nodes, now.

The round-robin schedule of :mod:`rollmux.core.roundrobin` computes *when* phases run
given their durations; the runtime does not know durations in advance, so it needs the
same discipline as a state machine: every node serves its jobs in the group's cyclic
order, a job alternates rollout and training, and a phase starts when the job is next on
every one of its nodes and those nodes are free. Pure code: no clock, no I/O.

An *elastic* rollout (a job that moves its long tail, DESIGN.md 5b, the live side of the
core's elastic seats) differs in two ways. It starts on the nodes where it is due and
free, and is widened onto the others as they come free (:meth:`CyclicTurns.widen`): the
job's engines share out the requests not yet started. And it *sheds* nodes before it ends
(:meth:`CyclicTurns.give_back`): once its unfinished requests moved onto a few of its nodes, the
others are served for this cycle and go to the next slot in their order, so the next
job's rollout starts there while this one's tail runs on.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

from rollmux.core.errors import PhaseOrderError
from rollmux.core.roundrobin import ROLLOUT, TRAIN, Order


@dataclass(frozen=True)
class JobNodes:
    """The nodes one job uses for each phase."""

    rollout: tuple[int, ...]
    train: tuple[int, ...]
    elastic: bool = False
    """Its rollout moves its tail: it starts, widens and sheds node by node."""

    def of(self, phase: str) -> tuple[int, ...]:
        return self.rollout if phase == ROLLOUT else self.train


@dataclass
class CyclicTurns:
    """Grants phases in the cyclic order of a group; built from the core's :class:`Order`.

    Each node keeps its slots — (job, phase) — in the group's cyclic order, and each job
    counts the meta-iterations (cycles) it completed in the group. A slot's count is the
    number of times it was served: the job's cycles, plus one for its rollout once that is
    done in the current cycle. A node serves the slot with the lowest count, the earliest
    in its order among equals: every job once per cycle, in the group's order.

    A job that joins a running group starts at the cycle of the least advanced rollout in
    it. Its slots then line up with the others' on every node, as if all had started
    together (a pointer kept per node would let a newcomer be due on a training node while
    it is behind on its rollout node, and chain the group's phases one after another).
    """

    jobs: list[str]
    nodes: dict[str, JobNodes]
    sequence: dict[int, list[tuple[str, str]]] = field(default_factory=dict)
    holder: dict[int, str] = field(default_factory=dict)
    next_phase: dict[str, str] = field(default_factory=dict)
    cycles: dict[str, int] = field(default_factory=dict)
    shed: dict[str, set[int]] = field(default_factory=dict)
    """Elastic rollouts whose tail moved, and their rollout nodes they do not keep: served
    for this cycle."""

    @staticmethod
    def build(
        jobs: Sequence[str], nodes: Mapping[str, JobNodes], order: Order, previous: CyclicTurns | None = None
    ) -> CyclicTurns:
        """Turns for ``jobs`` (seat order) under ``order``; carries a previous state across a
        membership change so running phases and each job's progress are kept."""
        turns = CyclicTurns(list(jobs), dict(nodes))
        for phase, seat_order in ((ROLLOUT, order.rollout), (TRAIN, order.train)):
            for seat in seat_order:
                job = jobs[seat]
                for node in nodes[job].of(phase):
                    turns.sequence.setdefault(node, []).append((job, phase))
        kept = [job for job in jobs if previous is not None and job in previous.cycles]
        joining_at = min((previous.rollout_count(job) for job in kept), default=0) if previous else 0
        for job in jobs:
            if previous is not None and job in kept:
                turns.next_phase[job] = previous.next_phase[job]
                turns.cycles[job] = previous.cycles[job]
            else:
                turns.next_phase[job] = ROLLOUT
                turns.cycles[job] = joining_at
        if previous is not None:
            turns.holder = {n: j for n, j in previous.holder.items() if n in turns.sequence and j in turns.cycles}
            turns.shed = {j: set(nodes) for j, nodes in previous.shed.items() if j in kept}
        return turns

    def rollout_count(self, job: str) -> int:
        """Rollouts the job completed in the group."""
        return self.cycles[job] + (1 if self.next_phase[job] == TRAIN else 0)

    def count(self, job: str, phase: str) -> int:
        return self.rollout_count(job) if phase == ROLLOUT else self.cycles[job]

    def due_slot(self, node: int) -> tuple[str, str]:
        """The slot a node serves next: the lowest count, the earliest in its order. A
        rollout that shed the node counts as served on it."""
        slots = self.sequence[node]
        return min(slots, key=lambda slot: (self._served(node, *slot), slots.index(slot)))

    def _served(self, node: int, job: str, phase: str) -> int:
        return self.count(job, phase) + (1 if phase == ROLLOUT and node in self.shed.get(job, ()) else 0)

    def due(self, node: int) -> str:
        """The job whose turn is next on ``node`` (the holder while it holds it)."""
        return self.holder.get(node) or self.due_slot(node)[0]

    def elastic(self, job: str, phase: str) -> bool:
        return phase == ROLLOUT and self.nodes[job].elastic

    def may_start(self, job: str, phase: str) -> bool:
        """True when ``phase`` is the job's next phase and it is next on all its free nodes
        (an elastic rollout: on any of them)."""
        if self.next_phase.get(job) != phase:
            return False
        if self.elastic(job, phase):
            return bool(self._ready(job, phase))
        return all(
            node not in self.holder and self.due_slot(node) == (job, phase) for node in self.nodes[job].of(phase)
        )

    def _ready(self, job: str, phase: str) -> tuple[int, ...]:
        """The job's nodes for ``phase`` that are free, due to it and not shed by it."""
        shed = self.shed.get(job, ())
        return tuple(
            node
            for node in self.nodes[job].of(phase)
            if node not in self.holder and node not in shed and self.due_slot(node) == (job, phase)
        )

    def start(self, job: str, phase: str) -> tuple[int, ...]:
        """Hold the phase's nodes (an elastic rollout: those ready now); returns them."""
        if not self.may_start(job, phase):
            raise PhaseOrderError(f"{job} may not start {phase} now")
        used = self._ready(job, phase) if self.elastic(job, phase) else self.nodes[job].of(phase)
        for node in used:
            self.holder[node] = job
        return used

    def held(self, job: str, phase: str) -> tuple[int, ...]:
        return tuple(node for node in self.nodes[job].of(phase) if self.holder.get(node) == job)

    def widen(self, job: str) -> tuple[int, ...]:
        """Nodes an elastic rollout under way takes as they come due and free, until it
        sheds; returns them."""
        if self.next_phase.get(job) != ROLLOUT or not self.elastic(job, ROLLOUT) or not self.held(job, ROLLOUT):
            return ()
        if job in self.shed:
            return ()  # its tail moved: it takes no node it would not use
        added = self._ready(job, ROLLOUT)
        for node in added:
            self.holder[node] = job
        return added

    def give_back(self, job: str, nodes: tuple[int, ...]) -> None:
        """An elastic rollout's tail moved: it sheds ``nodes`` (none, when it keeps all it
        holds) and is widened no more; it keeps at least one node. Every rollout node it
        does not keep, held or not, counts as served for this cycle (the core's visit of
        no length): a node it never got is not kept waiting for a rollout that will not
        take it."""
        if not self.elastic(job, ROLLOUT) or self.next_phase.get(job) != ROLLOUT:
            raise PhaseOrderError(f"{job} has no elastic rollout under way to shed nodes from")
        held = self.held(job, ROLLOUT)
        if not set(nodes) <= set(held) or not set(held) - set(nodes):
            raise PhaseOrderError(f"{job} may shed only nodes it holds, keeping one: holds {held}, sheds {nodes}")
        for node in nodes:
            del self.holder[node]
        kept = set(held) - set(nodes)
        self.shed.setdefault(job, set()).update(n for n in self.nodes[job].rollout if n not in kept)

    def finish(self, job: str, phase: str) -> None:
        if self.elastic(job, phase):
            released = self.held(job, phase)
            if not released:
                raise PhaseOrderError(f"{job} holds none of its nodes for {phase}")
        else:
            released = self.nodes[job].of(phase)
            for node in released:
                if self.holder.get(node) != job:
                    raise PhaseOrderError(f"{job} does not hold node {node} for {phase}")
        for node in released:
            del self.holder[node]
        self.shed.pop(job, None)
        if phase == ROLLOUT:
            self.next_phase[job] = TRAIN
        else:
            self.next_phase[job] = ROLLOUT
            self.cycles[job] += 1

    def resume(
        self,
        next_phase: Mapping[str, str],
        cycles: Mapping[str, int],
        holder: Mapping[int, str],
        shed: Mapping[str, Collection[int]] | None = None,
    ) -> None:
        """Continue from persisted state: each job's next phase and cycles, each node's
        holder, the elastic rollouts whose tail moved and the nodes each shed."""
        for job in self.jobs:
            self.next_phase[job] = next_phase.get(job, ROLLOUT)
            self.cycles[job] = cycles.get(job, 0)
        self.holder = {n: j for n, j in holder.items() if n in self.sequence and j in self.cycles}
        self.shed = {j: set(nodes) for j, nodes in (shed or {}).items() if j in self.cycles}

    def startable(self) -> list[tuple[str, str]]:
        """Every (job, phase) that may start now, in seat order."""
        return [(job, self.next_phase[job]) for job in self.jobs if self.may_start(job, self.next_phase[job])]


@dataclass(frozen=True)
class PhaseRecord:
    """One executed phase: when it was asked for, granted, worked and handed back.

    The runtime fills it from wall-clock times; reports draw runtime and simulated phases
    alike from it.
    """

    job: str
    phase: str
    iteration: int
    nodes: tuple[int, ...]
    requested: float
    granted: float
    started: float
    ended: float
    released: float
    wake_s: float
    sleep_s: float

    @property
    def busy_s(self) -> float:
        return self.ended - self.started
