"""Logical RollMux nodes on Ray: each one a placement group holding one pool resource (and
the node type's GPUs), with a worker actor inside it.

A Ray node offers ``rollmux_rollout_node`` or ``rollmux_train_node`` resources, one unit
per RollMux node it can host (custom resources on a laptop, GPU hosts on a cluster).
Reserving a RollMux node is reserving one unit through a placement group, so Ray itself
refuses to hand the same node to two groups.

Workers are kept warm: a released node's worker is emptied and kept (up to ``warm`` per
pool), and the next node of its pool takes it over, so readying a node does not start a
process, import the libraries and wait for both (seconds of CPU each). A worker is
therefore named for itself, not for a node; which worker serves which node is written in
Ray's key-value store (the GCS), where every process of the cluster — drivers, workers,
a restarted control plane — finds it. Placement groups and workers are detached, so they
outlive a restart of the control plane.
"""

from __future__ import annotations

import asyncio
import itertools
import uuid
from dataclasses import dataclass

import ray
from ray.experimental import internal_kv
from ray.util.placement_group import PlacementGroup, get_placement_group, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from rollmux.core.spec import Pool
from rollmux.runtime.workers import PoolWorker

NAMESPACE = "rollmux"
POOL_RESOURCE = {Pool.ROLLOUT: "rollmux_rollout_node", Pool.TRAIN: "rollmux_train_node"}
WORKER_PREFIX = "rollmux-worker-"


def pool_resources(rollout_nodes: int, train_nodes: int) -> dict[str, float]:
    """Custom resources a local Ray instance offers for this many nodes of each pool."""
    return {POOL_RESOURCE[Pool.ROLLOUT]: float(rollout_nodes), POOL_RESOURCE[Pool.TRAIN]: float(train_nodes)}


def _directory_key(node_id: int) -> bytes:
    return f"rollmux-node-{node_id}".encode()


def worker_name_of(node_id: int) -> str | None:
    """The name of the worker serving a node now (None: the node has none)."""
    name = internal_kv._internal_kv_get(_directory_key(node_id), namespace=NAMESPACE)
    return None if name is None else name.decode()


def worker_of(node_id: int) -> ray.actor.ActorHandle:
    """The worker actor of a provisioned node, from any process of the Ray cluster."""
    name = worker_name_of(node_id)
    if name is None:
        raise ValueError(f"node {node_id} has no worker (it is not provisioned)")
    return ray.get_actor(name, namespace=NAMESPACE)


@dataclass
class ProvisionedNode:
    node_id: int
    pool: Pool
    group: PlacementGroup
    worker: ray.actor.ActorHandle
    name: str


class NodeProvisioner:
    """Creates, finds again, recycles and releases the placement group and worker of each node."""

    def __init__(self, host_limit_bytes: int, gpus_per_node: dict[Pool, float] | None = None, warm: int = 0):
        self.host_limit_bytes = host_limit_bytes
        self.gpus_per_node = gpus_per_node or {}
        self.warm = warm
        """Empty workers kept per pool for the next nodes (each holds one unit of its pool)."""
        self.nodes: dict[int, ProvisionedNode] = {}
        self.spares: dict[Pool, list[ProvisionedNode]] = {pool: [] for pool in Pool}

    def ensure(self, node_id: int, pool: Pool) -> ProvisionedNode:
        """The node's placement group and worker: found again if they survived, a warm
        spare of its pool, or created. Does not wait for Ray to reserve them (see :meth:`ready`)."""
        if node_id in self.nodes:
            return self.nodes[node_id]
        node = self._surviving(node_id, pool) or self._take_spare(pool) or self._create(pool)
        node.node_id = node_id
        node.worker.assign.remote(node_id)
        internal_kv._internal_kv_put(_directory_key(node_id), node.name.encode(), overwrite=True, namespace=NAMESPACE)
        self.nodes[node_id] = node
        return node

    def _surviving(self, node_id: int, pool: Pool) -> ProvisionedNode | None:
        """The node's worker and reservation from before a restart of the control plane."""
        name = worker_name_of(node_id)
        if name is None:
            return None
        try:
            return ProvisionedNode(node_id, pool, get_placement_group(name), ray.get_actor(name, NAMESPACE), name)
        except ValueError:
            return None

    def _take_spare(self, pool: Pool) -> ProvisionedNode | None:
        return self.spares[pool].pop() if self.spares[pool] else None

    def _create(self, pool: Pool) -> ProvisionedNode:
        name = f"{WORKER_PREFIX}{pool.value}-{uuid.uuid4().hex[:12]}"
        bundle = {POOL_RESOURCE[pool]: 1.0}
        gpus = self.gpus_per_node.get(pool, 0.0)
        if gpus:
            bundle["GPU"] = gpus
        group = placement_group([bundle], strategy="STRICT_PACK", name=name, lifetime="detached")
        return ProvisionedNode(-1, pool, group, self._worker(name, pool, group), name)

    def _worker(self, name: str, pool: Pool, group: PlacementGroup) -> ray.actor.ActorHandle:
        """A worker inside the reservation ``group``."""
        return (
            ray.remote(PoolWorker)
            .options(
                name=name,
                namespace=NAMESPACE,
                lifetime="detached",
                get_if_exists=True,
                num_cpus=0,
                num_gpus=self.gpus_per_node.get(pool, 0.0),
                resources={POOL_RESOURCE[pool]: 1.0},
                max_concurrency=4,
                scheduling_strategy=PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=0),
            )
            .remote(pool.value, self.host_limit_bytes)
        )

    def top_up(self, free: dict[Pool, int]) -> None:
        """Start spares until each pool has ``warm`` of them, on units no node holds."""
        for pool in Pool:
            for _ in range(min(self.warm - len(self.spares[pool]), free.get(pool, 0))):
                self.spares[pool].append(self._create(pool))

    def adopt_spares(self) -> None:
        """After a restart: the warm workers no node uses are spares again (beyond
        ``warm`` per pool, they are given back)."""
        serving = {node.name for node in self.nodes.values()} | {s.name for s in itertools.chain(*self.spares.values())}
        for entry in ray.util.list_named_actors(all_namespaces=True):
            name = entry["name"]
            if entry["namespace"] != NAMESPACE or not name.startswith(WORKER_PREFIX) or name in serving:
                continue
            pool = Pool(name[len(WORKER_PREFIX) :].rsplit("-", 1)[0])
            try:
                spare = ProvisionedNode(-1, pool, get_placement_group(name), ray.get_actor(name, NAMESPACE), name)
            except ValueError:
                continue
            if len(self.spares[pool]) < self.warm:
                self.spares[pool].append(spare)
            else:
                _give_back(spare)

    async def ready(self, node_id: int) -> None:
        """Wait until Ray has reserved the node and its worker answers; a worker that died
        is replaced by a fresh one in the same reservation (its jobs' roles are reloaded
        from their checkpoints when they restart)."""
        node = self.nodes[node_id]
        await node.group.ready()
        try:
            await node.worker.where.remote()
        except ray.exceptions.RayActorError:
            node.worker = await asyncio.to_thread(self._worker, node.name, node.pool, node.group)
            node.worker.assign.remote(node_id)
            await node.worker.where.remote()

    def release(self, node_id: int) -> None:
        """The node is given back; its worker, emptied, is kept as a spare if its pool has
        room for one (a worker that no longer answers is not)."""
        node = self.nodes.pop(node_id)
        internal_kv._internal_kv_del(_directory_key(node_id), namespace=NAMESPACE)
        if len(self.spares[node.pool]) < self.warm:
            try:
                ray.get(node.worker.reset.remote(), timeout=10)
            except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
                _give_back(node)
                return
            self.spares[node.pool].append(node)
        else:
            _give_back(node)

    def release_all(self) -> None:
        for node_id in list(self.nodes):
            _give_back(self.nodes.pop(node_id))
            internal_kv._internal_kv_del(_directory_key(node_id), namespace=NAMESPACE)
        for spares in self.spares.values():
            while spares:
                _give_back(spares.pop())


def _give_back(node: ProvisionedNode) -> None:
    ray.kill(node.worker)
    remove_placement_group(node.group)
