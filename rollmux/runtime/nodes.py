"""Logical RollMux nodes on Ray: each one a placement group holding one pool resource.

A Ray node offers ``rollmux_rollout_node`` or ``rollmux_train_node`` resources, one unit
per RollMux node it can host (custom resources on a laptop, GPUs' hosts on a cluster).
Reserving a RollMux node is reserving one unit through a placement group, so Ray itself
refuses to hand the same node to two groups; the node's worker actor is scheduled into
that placement group.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import ray
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from rollmux.core.errors import RollMuxError
from rollmux.core.spec import Pool
from rollmux.runtime.workers import PoolWorker

POOL_RESOURCE = {Pool.ROLLOUT: "rollmux_rollout_node", Pool.TRAIN: "rollmux_train_node"}


class NoCapacity(RollMuxError):
    """The Ray cluster has no free node of the pool a placement needs."""


def pool_resources(rollout_nodes: int, train_nodes: int) -> dict[str, float]:
    """Custom resources a local Ray instance offers for this many nodes of each pool."""
    return {POOL_RESOURCE[Pool.ROLLOUT]: float(rollout_nodes), POOL_RESOURCE[Pool.TRAIN]: float(train_nodes)}


@dataclass
class ProvisionedNode:
    node_id: int
    pool: Pool
    group: PlacementGroup
    worker: ray.actor.ActorHandle


class NodeProvisioner:
    """Creates and releases the placement group and worker actor of each logical node."""

    def __init__(self, host_limit_bytes: int, ready_timeout_s: float = 60.0):
        self.host_limit_bytes = host_limit_bytes
        self.ready_timeout_s = ready_timeout_s
        self.nodes: dict[int, ProvisionedNode] = {}

    async def add(self, node_id: int, pool: Pool) -> ray.actor.ActorHandle:
        resource = POOL_RESOURCE[pool]
        group = placement_group([{resource: 1.0}], strategy="STRICT_PACK")
        try:
            await asyncio.wait_for(group.ready(), timeout=self.ready_timeout_s)
        except asyncio.TimeoutError:
            remove_placement_group(group)
            raise NoCapacity(
                f"no free {pool.value} node in the Ray cluster within {self.ready_timeout_s:.0f} s: "
                f"add Ray nodes offering the '{resource}' resource or release jobs"
            ) from None
        worker = (
            ray.remote(PoolWorker)
            .options(
                num_cpus=0,
                resources={resource: 1.0},
                max_concurrency=4,
                scheduling_strategy=PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=0),
            )
            .remote(node_id, pool.value, self.host_limit_bytes)
        )
        self.nodes[node_id] = ProvisionedNode(node_id, pool, group, worker)
        return worker

    def worker(self, node_id: int) -> ray.actor.ActorHandle:
        return self.nodes[node_id].worker

    def release_all(self) -> None:
        for node_id in list(self.nodes):
            self.release(node_id)

    def release(self, node_id: int) -> None:
        node = self.nodes.pop(node_id)
        ray.kill(node.worker)
        remove_placement_group(node.group)
