"""Turn-taking of a live group: which job may start which phase on which nodes, now.

The round-robin schedule of :mod:`rollmux.core.roundrobin` computes *when* phases run
given their durations; the runtime does not know durations in advance, so it needs the
same discipline as a state machine: every node serves its jobs in the group's cyclic
order, a job alternates rollout and training, and a phase starts when the job is next on
every one of its nodes and those nodes are free. Pure code: no clock, no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from rollmux.core.errors import PhaseOrderError
from rollmux.core.roundrobin import ROLLOUT, TRAIN, Order


@dataclass(frozen=True)
class JobNodes:
    """The nodes one job uses for each phase."""

    rollout: tuple[int, ...]
    train: tuple[int, ...]

    def of(self, phase: str) -> tuple[int, ...]:
        return self.rollout if phase == ROLLOUT else self.train


@dataclass
class CyclicTurns:
    """Grants phases in the cyclic order of a group; built from the core's :class:`Order`."""

    jobs: list[str]
    nodes: dict[str, JobNodes]
    sequence: dict[int, list[str]] = field(default_factory=dict)
    position: dict[int, int] = field(default_factory=dict)
    holder: dict[int, str] = field(default_factory=dict)
    next_phase: dict[str, str] = field(default_factory=dict)

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
                    turns.sequence.setdefault(node, []).append(job)
        for job in jobs:
            turns.next_phase[job] = previous.next_phase.get(job, ROLLOUT) if previous else ROLLOUT
        for node, queue in turns.sequence.items():
            turns.position[node] = 0
            if previous is None:
                continue
            if node in previous.holder and previous.holder[node] in queue:
                turns.holder[node] = previous.holder[node]
                turns.position[node] = queue.index(previous.holder[node])
            elif node in previous.sequence and previous.sequence[node]:
                turns.position[node] = _resume_position(previous, node, queue)
        return turns

    def may_start(self, job: str, phase: str) -> bool:
        """True when ``phase`` is the job's next phase and it is next on all its free nodes."""
        if self.next_phase.get(job) != phase:
            return False
        return all(
            node not in self.holder and self.sequence[node][self.position[node]] == job
            for node in self.nodes[job].of(phase)
        )

    def start(self, job: str, phase: str) -> tuple[int, ...]:
        if not self.may_start(job, phase):
            raise PhaseOrderError(f"{job} may not start {phase} now")
        used = self.nodes[job].of(phase)
        for node in used:
            self.holder[node] = job
        return used

    def finish(self, job: str, phase: str) -> None:
        for node in self.nodes[job].of(phase):
            if self.holder.get(node) != job:
                raise PhaseOrderError(f"{job} does not hold node {node} for {phase}")
            del self.holder[node]
            self.position[node] = (self.position[node] + 1) % len(self.sequence[node])
        self.next_phase[job] = TRAIN if phase == ROLLOUT else ROLLOUT

    def due(self, node: int) -> str:
        """The job whose turn is next on ``node`` (the holder while it holds it)."""
        return self.sequence[node][self.position[node]]

    def resume(self, next_phase: Mapping[str, str], holder: Mapping[int, str], due: Mapping[int, str]) -> None:
        """Continue from persisted state: each job's next phase, each node's holder and the
        job due next on each node. Unknown jobs are ignored (they left meanwhile)."""
        for job in self.jobs:
            self.next_phase[job] = next_phase.get(job, ROLLOUT)
        for node, queue in self.sequence.items():
            if holder.get(node) in queue:
                self.holder[node] = holder[node]
                self.position[node] = queue.index(holder[node])
            elif due.get(node) in queue:
                self.position[node] = queue.index(due[node])

    def startable(self) -> list[tuple[str, str]]:
        """Every (job, phase) that may start now, in seat order."""
        return [(job, self.next_phase[job]) for job in self.jobs if self.may_start(job, self.next_phase[job])]


def _resume_position(previous: CyclicTurns, node: int, queue: list[str]) -> int:
    """After a membership change, continue with the first job that was due on ``node``
    and is still in the queue."""
    old = previous.sequence[node]
    start = previous.position.get(node, 0)
    for k in range(len(old)):
        job = old[(start + k) % len(old)]
        if job in queue:
            return queue.index(job)
    return 0


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
