"""The control plane on Ray: the core's ControlState hosted in one named Ray actor.

It provisions each placement's nodes on Ray and blocks phase requests until the core's
turn-taking grants them. Job drivers talk to it through the phase API.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

import ray

from rollmux.core.cluster import Cluster
from rollmux.core.control import ControlState
from rollmux.core.placement import make_policy
from rollmux.core.roundrobin import ROLLOUT
from rollmux.core.spec import DEFAULT_PLANNING, CostModel, JobSpec, Planning
from rollmux.core.turns import PhaseRecord
from rollmux.runtime.nodes import NodeProvisioner

CONTROL_NAME = "rollmux-control"
NAMESPACE = "rollmux"


@dataclass(frozen=True)
class RuntimeConfig:
    policy: str = "rollmux"
    planning: Planning = DEFAULT_PLANNING
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


class ControlPlane:
    """The core's :class:`ControlState` hosted in a Ray actor: an event loop to block phase
    requests until granted, and Ray placement groups for the nodes of each placement."""

    def __init__(self, config: RuntimeConfig):
        self.config = config
        self.state = ControlState(Cluster(cost=config.cost, planning=config.planning), make_policy(config.policy))
        self.nodes = NodeProvisioner(config.host_limit_bytes, config.ready_timeout_s)
        self.changed = asyncio.Condition()
        self.placing = asyncio.Lock()
        self.records: list[PhaseRecord] = []

    @property
    def cluster(self) -> Cluster:
        return self.state.cluster

    async def submit(self, spec: JobSpec) -> JobPlacement:
        """Place a job with the core's policy and provision any nodes the placement adds.

        If Ray cannot provide a node, the placement is rolled back: nothing half-done.
        """
        async with self.placing:
            placement = self.state.submit(spec)
            provisioned: list[int] = []
            try:
                for node_id, pool in placement.added_nodes:
                    await self.nodes.add(node_id, pool)
                    provisioned.append(node_id)
            except BaseException:
                for node_id in provisioned:
                    self.nodes.release(node_id)
                self.state.undo_submit(spec.name)
                raise
            member = self.state.member(spec.name)
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
            self.state.activate(job)
            self.changed.notify_all()

    async def acquire(self, job: str, phase: str) -> float:
        """Block until the group's round-robin grants ``phase`` to ``job``; returns the wait."""
        start = time.time()
        async with self.changed:
            self.state.check_order(job, phase)
            await self.changed.wait_for(lambda: self.state.may_start(job, phase))
            self.state.start(job, phase)
        return time.time() - start

    async def release(self, record: PhaseRecord) -> None:
        """The phase is over: free its nodes for the next job in turn and learn its duration."""
        async with self.changed:
            self.state.finish(record.job, record.phase, record.busy_s)
            self.records.append(record)
            self.changed.notify_all()

    async def progress(self, job: str, iteration: int, metrics: dict[str, float]) -> None:
        self.state.progress(job, iteration, metrics)

    async def complete(self, job: str, error: str = "") -> None:
        """The job ended (or failed): leave the turns, free its roles and unused nodes."""
        async with self.placing, self.changed:
            member = self.state.member(job)
            removal = self.state.complete(job, "failed" if error else "done", error)
            released = {node for node, _ in removal.released_nodes}
            for node in {*member.rollout_nodes, *member.train_nodes} - released:
                self.nodes.worker(node).unload.remote(job)
            for node in released:
                self.nodes.release(node)
            self.changed.notify_all()

    async def shutdown(self) -> None:
        """Release every node (worker actors and placement groups) before the actor goes."""
        async with self.placing:
            self.nodes.release_all()

    def snapshot(self) -> dict[str, Any]:
        return self.state.snapshot()

    def phase_records(self) -> list[PhaseRecord]:
        return list(self.records)


def control_actor(config: RuntimeConfig):
    """Start the named control-plane actor (get it back with ``ray.get_actor``)."""
    return (
        ray.remote(ControlPlane)
        .options(name=CONTROL_NAME, namespace=NAMESPACE, num_cpus=0, max_concurrency=1000)
        .remote(config)
    )
