"""Logical RollMux nodes on Ray: each one a placement group holding one pool resource (and
the node type's GPUs), with the node's worker actor inside it.

A Ray node offers ``rollmux_rollout_node`` or ``rollmux_train_node`` resources, one unit
per RollMux node it can host (custom resources on a laptop, GPU hosts on a cluster).
Reserving a RollMux node is reserving one unit through a placement group, so Ray itself
refuses to hand the same node to two groups. Placement groups and workers are detached
and named after the node, so they outlive a restart of the control plane, which finds
them again by name.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import ray
from ray.util.placement_group import PlacementGroup, get_placement_group, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from rollmux.core.spec import Pool
from rollmux.runtime.workers import PoolWorker

NAMESPACE = "rollmux"
POOL_RESOURCE = {Pool.ROLLOUT: "rollmux_rollout_node", Pool.TRAIN: "rollmux_train_node"}


def pool_resources(rollout_nodes: int, train_nodes: int) -> dict[str, float]:
    """Custom resources a local Ray instance offers for this many nodes of each pool."""
    return {POOL_RESOURCE[Pool.ROLLOUT]: float(rollout_nodes), POOL_RESOURCE[Pool.TRAIN]: float(train_nodes)}


def node_name(node_id: int) -> str:
    """Name of the node's placement group and of its worker actor."""
    return f"rollmux-node-{node_id}"


def worker_of(node_id: int) -> ray.actor.ActorHandle:
    """The worker actor of a provisioned node, from any process of the Ray cluster."""
    return ray.get_actor(node_name(node_id), namespace=NAMESPACE)


@dataclass
class ProvisionedNode:
    node_id: int
    pool: Pool
    group: PlacementGroup
    worker: ray.actor.ActorHandle


class NodeProvisioner:
    """Creates, finds again and releases the placement group and worker of each node."""

    def __init__(self, host_limit_bytes: int, gpus_per_node: dict[Pool, float] | None = None):
        self.host_limit_bytes = host_limit_bytes
        self.gpus_per_node = gpus_per_node or {}
        self.nodes: dict[int, ProvisionedNode] = {}

    def ensure(self, node_id: int, pool: Pool) -> ProvisionedNode:
        """The node's placement group and worker: found by name if they survived, else
        created. Does not wait for Ray to reserve them (see :meth:`ready`)."""
        if node_id in self.nodes:
            return self.nodes[node_id]
        name = node_name(node_id)
        try:
            group = get_placement_group(name)
        except ValueError:
            bundle = {POOL_RESOURCE[pool]: 1.0}
            gpus = self.gpus_per_node.get(pool, 0.0)
            if gpus:
                bundle["GPU"] = gpus
            group = placement_group([bundle], strategy="STRICT_PACK", name=name, lifetime="detached")
        self.nodes[node_id] = ProvisionedNode(node_id, pool, group, self._worker(node_id, pool, group))
        return self.nodes[node_id]

    def _worker(self, node_id: int, pool: Pool, group: PlacementGroup) -> ray.actor.ActorHandle:
        """The node's worker inside its reservation (the live one of that name, if any)."""
        return (
            ray.remote(PoolWorker)
            .options(
                name=node_name(node_id),
                namespace=NAMESPACE,
                lifetime="detached",
                get_if_exists=True,
                num_cpus=0,
                num_gpus=self.gpus_per_node.get(pool, 0.0),
                resources={POOL_RESOURCE[pool]: 1.0},
                max_concurrency=4,
                scheduling_strategy=PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=0),
            )
            .remote(node_id, pool.value, self.host_limit_bytes)
        )

    async def ready(self, node_id: int) -> None:
        """Wait until Ray has reserved the node and its worker answers; a worker that died
        is replaced by a fresh one in the same reservation (its jobs' roles are reloaded
        from their checkpoints when they restart)."""
        node = self.nodes[node_id]
        await node.group.ready()
        try:
            await node.worker.where.remote()
        except ray.exceptions.RayActorError:
            node.worker = await asyncio.to_thread(self._worker, node_id, node.pool, node.group)
            await node.worker.where.remote()

    async def wait_ready(self, node_id: int, timeout_s: float) -> bool:
        try:
            await asyncio.wait_for(self.ready(node_id), timeout=timeout_s)
        except asyncio.TimeoutError:
            return False
        return True

    def release(self, node_id: int) -> None:
        node = self.nodes.pop(node_id)
        ray.kill(node.worker)
        remove_placement_group(node.group)

    def release_all(self) -> None:
        for node_id in list(self.nodes):
            self.release(node_id)
