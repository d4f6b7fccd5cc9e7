"""The control plane: the scheduling core, hosted in one named Ray actor.

It owns the cluster state (groups, nodes), places jobs with the core's policy, provisions
the placement's nodes on Ray, and grants phases with the core's turn-taking. Job drivers
talk to it through the phase API. It forks nothing of the core: placement is
``rollmux.core.placement.place``, the intra-group order is ``fcfs_order`` and turns are
``CyclicTurns``, exactly what the simulator uses.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import ray

from rollmux.core.cluster import Cluster, Group
from rollmux.core.placement import make_policy, place
from rollmux.core.roundrobin import ROLLOUT, TRAIN, fcfs_order
from rollmux.core.spec import CostModel, JobSpec, PhaseTime, Planning, Pool
from rollmux.core.turns import CyclicTurns, JobNodes
from rollmux.runtime.nodes import NodeProvisioner

CONTROL_NAME = "rollmux-control"
NAMESPACE = "rollmux"
PROFILE_WINDOW = 20
"""Measured phases kept per job and phase to re-estimate its profile."""


@dataclass(frozen=True)
class RuntimeConfig:
    policy: str = "rollmux"
    planning: Planning = Planning.HIGH
    cost: CostModel = field(default_factory=CostModel)
    host_limit_bytes: int = 8 * 2**30
    ready_timeout_s: float = 60.0


@dataclass(frozen=True)
class JobPlacement:
    """Where a submitted job runs: its group, its nodes and their worker actors."""

    job: str
    group_id: int
    kind: str
    rollout_nodes: tuple[int, ...]
    train_nodes: tuple[int, ...]
    workers: dict[int, Any]

    def workers_of(self, phase: str) -> list[Any]:
        return [self.workers[n] for n in (self.rollout_nodes if phase == ROLLOUT else self.train_nodes)]


@dataclass(frozen=True)
class PhaseRecord:
    """One executed phase as the job driver measured it (wall-clock seconds since epoch)."""

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


@dataclass
class JobStatus:
    state: str = "placed"
    phase: str = "-"
    iteration: int = 0
    metrics: dict[str, float] = field(default_factory=dict)
    error: str = ""


class ControlPlane:
    """Cluster state and phase grants; wrapped by ``ray.remote`` in :mod:`launch`."""

    def __init__(self, config: RuntimeConfig):
        self.config = config
        self.cluster = Cluster(cost=config.cost, planning=config.planning)
        self.policy = make_policy(config.policy)
        self.nodes = NodeProvisioner(config.host_limit_bytes, config.ready_timeout_s)
        self.active: dict[int, list[str]] = {}
        self.turns: dict[int, CyclicTurns] = {}
        self.changed = asyncio.Condition()
        self.placing = asyncio.Lock()
        self.records: list[PhaseRecord] = []
        self.status: dict[str, JobStatus] = {}
        self.measured: dict[tuple[str, str], list[float]] = {}

    async def submit(self, spec: JobSpec) -> JobPlacement:
        """Place a job with the core's policy and provision any nodes the placement adds.

        If Ray cannot provide a node, the placement is rolled back: nothing half-done.
        """
        async with self.placing:
            placement = place(self.cluster, self.policy, spec)
            provisioned: list[int] = []
            try:
                for node_id, pool in placement.added_nodes:
                    await self.nodes.add(node_id, pool)
                    provisioned.append(node_id)
            except BaseException:
                for node_id in provisioned:
                    self.nodes.release(node_id)
                self.cluster.remove(spec.name)
                raise
            member = next(m for m in self.cluster.groups[placement.group_id].members if m.job.name == spec.name)
            self.status[spec.name] = JobStatus()
            used = (*member.rollout_nodes, *member.train_nodes)
            return JobPlacement(
                spec.name,
                placement.group_id,
                placement.kind.value,
                member.rollout_nodes,
                member.train_nodes,
                {n: self.nodes.worker(n) for n in used},
            )

    async def activate(self, job: str) -> None:
        """The job's roles are loaded: it joins its group's turn-taking."""
        async with self.changed:
            group = self.cluster.group_of(job)
            self.active.setdefault(group.id, []).append(job)
            self._rebuild_turns(group)
            self.status[job].state = "running"
            self.changed.notify_all()

    async def acquire(self, job: str, phase: str) -> float:
        """Block until the group's round-robin grants ``phase`` to ``job``; returns the wait."""
        start = time.time()
        async with self.changed:
            await self.changed.wait_for(lambda: self._turns_of(job).may_start(job, phase))
            self._turns_of(job).start(job, phase)
            self.status[job].phase = phase
        return time.time() - start

    async def release(self, record: PhaseRecord) -> None:
        """The phase is over: free its nodes for the next job in turn and learn its duration."""
        async with self.changed:
            self._turns_of(record.job).finish(record.job, record.phase)
            self.records.append(record)
            self.status[record.job].phase = "-"
            window = self.measured.setdefault((record.job, record.phase), [])
            window.append(record.busy_s)
            del window[:-PROFILE_WINDOW]
            if record.phase == TRAIN:
                self._update_profile(record.job)
            self.changed.notify_all()

    async def progress(self, job: str, iteration: int, metrics: dict[str, float]) -> None:
        self.status[job].iteration = iteration
        self.status[job].metrics = dict(metrics)

    async def complete(self, job: str, error: str = "") -> None:
        """The job ended (or failed): leave the turns, free its roles and unused nodes."""
        async with self.placing, self.changed:
            group = self.cluster.group_of(job)
            if job in self.active.get(group.id, []):
                self.active[group.id].remove(job)
            member = next(m for m in group.members if m.job.name == job)
            removal = self.cluster.remove(job)
            released = {node for node, _ in removal.released_nodes}
            for node in {*member.rollout_nodes, *member.train_nodes} - released:
                self.nodes.worker(node).unload.remote(job)
            for node in released:
                self.nodes.release(node)
            if group.id in self.cluster.groups and self.active.get(group.id):
                self._rebuild_turns(self.cluster.groups[group.id])
            else:
                self.turns.pop(group.id, None)
                self.active.pop(group.id, None)
            self.status[job].state = "failed" if error else "done"
            self.status[job].error = error
            self.changed.notify_all()

    async def shutdown(self) -> None:
        """Release every node (worker actors and placement groups) before the actor goes."""
        async with self.placing:
            self.nodes.release_all()

    def snapshot(self) -> dict[str, Any]:
        """Jobs, groups and cost rate, for progress displays and reports."""
        slowdowns = self.cluster.slowdowns()
        return {
            "jobs": {name: {**asdict(s), "slowdown": slowdowns.get(name)} for name, s in self.status.items()},
            "groups": {
                g.id: {
                    "rollout_nodes": list(g.rollout_nodes),
                    "train_nodes": list(g.train_nodes),
                    "jobs": [m.job.name for m in g.members],
                    "cycle_s": g.schedule.cycle,
                }
                for g in self.cluster.groups.values()
            },
            "cost_per_hour": self.cluster.cost_per_hour(),
            "nodes": {pool.value: self.cluster.nodes(pool) for pool in Pool},
        }

    def phase_records(self) -> list[PhaseRecord]:
        return list(self.records)

    def _turns_of(self, job: str) -> CyclicTurns:
        return self.turns[self.cluster.group_of(job).id]

    def _rebuild_turns(self, group: Group) -> None:
        """Turns of the group's active jobs in the core's FCFS cyclic order."""
        active = [m for m in group.members if m.job.name in self.active.get(group.id, [])]
        seats = [m.seat(self.cluster.planning) for m in active]
        nodes = {m.job.name: JobNodes(m.rollout_nodes, m.train_nodes) for m in active}
        jobs = [m.job.name for m in active]
        self.turns[group.id] = CyclicTurns.build(jobs, nodes, fcfs_order(seats), self.turns.get(group.id))

    def _update_profile(self, job: str) -> None:
        """Feed measured phase durations back into the job's profile in the core."""
        times = {phase: self.measured.get((job, phase), []) for phase in (ROLLOUT, TRAIN)}
        if not all(times.values()):
            return
        profile = {phase: _profile(values) for phase, values in times.items()}
        self.cluster.update_phase_times(job, profile[ROLLOUT], profile[TRAIN])


def _profile(values: list[float]) -> PhaseTime:
    """Mean and a high quantile (p95, or the max of few samples) of measured durations."""
    mean = statistics.fmean(values)
    high = max(values) if len(values) < 20 else statistics.quantiles(values, n=20)[-1]
    return PhaseTime(mean=mean, high=max(high, mean), high_quantile=0.95)


def control_actor(config: RuntimeConfig):
    """Start the named control-plane actor (get it back with ``ray.get_actor``)."""
    return (
        ray.remote(ControlPlane)
        .options(name=CONTROL_NAME, namespace=NAMESPACE, num_cpus=0, max_concurrency=1000)
        .remote(config)
    )
