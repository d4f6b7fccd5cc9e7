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

Standby workers are kept apart from the spares: new nodes never take them. Each has run a
sandbox phase and holds no job. A node whose worker died is taken over by a standby, or
else a spare, instead of waiting for a new process; a standby used so is replaced in the
background. The standbys' names, in order, are in the GCS, and so is each replicated job's
buddy (``rollmux.core.replicas``: another held training node or a standby slot), which the
job's driver resolves to a worker when it copies its trainer or restores it.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass

import ray
from ray.experimental import internal_kv
from ray.util.placement_group import PlacementGroup, get_placement_group, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from rollmux.core.replicas import Buddy
from rollmux.core.spec import Pool
from rollmux.dataplane.workers import PoolWorker

NAMESPACE = "rollmux"
POOL_RESOURCE = {Pool.ROLLOUT: "rollmux_rollout_node", Pool.TRAIN: "rollmux_train_node"}
WORKER_PREFIX = "rollmux-worker-"
STANDBY_PREFIX = "rollmux-standby-"
STANDBY_PATIENCE_S = 10.0
"""A standby that does not answer for this long is taken for dead."""
REMOTE_WORKER = ray.remote(PoolWorker)
"""One actor class for every worker: Ray exports (pickles and fingerprints) a class once per
class object, which would otherwise be paid again at every node readied."""


def pool_resources(rollout_nodes: int, train_nodes: int) -> dict[str, float]:
    """Custom resources a local Ray instance offers for this many nodes of each pool."""
    return {POOL_RESOURCE[Pool.ROLLOUT]: float(rollout_nodes), POOL_RESOURCE[Pool.TRAIN]: float(train_nodes)}


def _directory_key(node_id: int) -> bytes:
    return f"rollmux-node-{node_id}".encode()


def _standby_key(pool: Pool) -> bytes:
    return f"rollmux-standby-{pool.value}".encode()


BUDDY_PREFIX = "rollmux-buddy-"


def _buddy_key(job: str) -> bytes:
    return f"{BUDDY_PREFIX}{job}".encode()


def name_buddy(job: str, key: str | None) -> None:
    """Write where the job keeps its replica (``Buddy.key``), or that it keeps none."""
    if key is None:
        internal_kv._internal_kv_del(_buddy_key(job), namespace=NAMESPACE)
    else:
        internal_kv._internal_kv_put(_buddy_key(job), key.encode(), overwrite=True, namespace=NAMESPACE)


def named_buddies() -> list[str]:
    """The jobs that have a buddy written in the GCS (a restarted control plane clears the
    ones it no longer plans)."""
    keys = internal_kv._internal_kv_list(BUDDY_PREFIX.encode(), namespace=NAMESPACE) or []
    return [key.decode()[len(BUDDY_PREFIX) :] for key in keys]


def buddy_of(job: str) -> ray.actor.ActorHandle | None:
    """The worker that keeps the job's replica (None: it has no buddy, or that worker is gone)."""
    key = internal_kv._internal_kv_get(_buddy_key(job), namespace=NAMESPACE)
    if key is None:
        return None
    buddy = Buddy.parse(key.decode())
    if buddy.standby is not None:
        return standby_worker(Pool.TRAIN, buddy.standby)
    name = worker_name_of(buddy.node)
    return _actor(name) if name is not None else None


def standby_worker(pool: Pool, slot: int) -> ray.actor.ActorHandle | None:
    """The pool's ``slot``-th standby worker, as written in the GCS (None: it has fewer)."""
    names = internal_kv._internal_kv_get(_standby_key(pool), namespace=NAMESPACE)
    listed = names.decode().split(",") if names else []
    return _actor(listed[slot]) if slot < len(listed) else None


def _actor(name: str) -> ray.actor.ActorHandle | None:
    try:
        return ray.get_actor(name, namespace=NAMESPACE)
    except ValueError:
        return None


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

    def __init__(
        self,
        host_limit_bytes: int,
        sandbox: Callable[[], float],
        gpus_per_node: dict[Pool, float] | None = None,
        warm: int = 0,
        standby: int = 0,
    ):
        self.host_limit_bytes = host_limit_bytes
        self.sandbox = sandbox
        """The phase a warm worker runs before it counts (the job side's: ``JobCode.sandbox``)."""
        self.gpus_per_node = gpus_per_node or {}
        self.warm = warm
        """Empty workers kept per pool for the next nodes (each holds one unit of its pool)."""
        self.standby = standby
        """Standby workers kept per pool for nodes whose worker dies (one unit each)."""
        self.nodes: dict[int, ProvisionedNode] = {}
        self.spares: dict[Pool, list[ProvisionedNode]] = {pool: [] for pool in Pool}
        self.standbys: dict[Pool, list[ProvisionedNode]] = {pool: [] for pool in Pool}
        self._topping_up = threading.Lock()
        self._replacing: dict[int, asyncio.Lock] = {}
        self.readied = 0
        """Workers :meth:`ready` has seen answer for the first time (the platform's progress:
        a launch waiting for its own nodes watches it)."""
        self._answered: set[str] = set()

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

    def _name_standbys(self, pool: Pool) -> None:
        """Write the pool's standbys in order: a buddy ``standby:<slot>`` is the slot-th."""
        if self.standbys[pool]:
            names = ",".join(standby.name for standby in self.standbys[pool]).encode()
            internal_kv._internal_kv_put(_standby_key(pool), names, overwrite=True, namespace=NAMESPACE)
        else:
            internal_kv._internal_kv_del(_standby_key(pool), namespace=NAMESPACE)

    def _create(self, pool: Pool, prefix: str = WORKER_PREFIX) -> ProvisionedNode:
        name = f"{prefix}{pool.value}-{uuid.uuid4().hex[:12]}"
        bundle = {POOL_RESOURCE[pool]: 1.0}
        gpus = self.gpus_per_node.get(pool, 0.0)
        if gpus:
            bundle["GPU"] = gpus
        group = placement_group([bundle], strategy="STRICT_PACK", name=name, lifetime="detached")
        return ProvisionedNode(-1, pool, group, self._worker(name, pool, group), name)

    def _worker(self, name: str, pool: Pool, group: PlacementGroup) -> ray.actor.ActorHandle:
        """A worker inside the reservation ``group``."""
        return REMOTE_WORKER.options(
            name=name,
            namespace=NAMESPACE,
            lifetime="detached",
            get_if_exists=True,
            num_cpus=0,
            num_gpus=self.gpus_per_node.get(pool, 0.0),
            resources={POOL_RESOURCE[pool]: 1.0},
            max_concurrency=4,
            scheduling_strategy=PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=0),
        ).remote(pool.value, self.host_limit_bytes)

    def top_up(self, spares: bool = True) -> None:
        """Start standbys (and spares, unless not asked) until each pool has ``standby`` and
        ``warm`` of them, on units that neither a node nor another of them holds (standbys
        first); each runs its sandbox phase before it counts. One top-up at a time."""
        with self._topping_up:
            offered = ray.cluster_resources()
            started: list[tuple[list[ProvisionedNode], ProvisionedNode]] = []
            for pool in Pool:
                taken = len(self.spares[pool]) + len(self.standbys[pool])
                free = int(offered.get(POOL_RESOURCE[pool], 0)) - taken - sum(n.pool == pool for n in self._held())
                for kept, wanted, prefix in (
                    (self.standbys[pool], self.standby, STANDBY_PREFIX),
                    (self.spares[pool], self.warm if spares else 0, WORKER_PREFIX),
                ):
                    for _ in range(max(0, min(wanted - len(kept), free))):
                        started.append((kept, self._create(pool, prefix)))
                        free -= 1
            ray.get([worker.worker.warm_up.remote(self.sandbox) for _, worker in started])
            for kept, worker in started:
                kept.append(worker)
            for pool in Pool:
                self._name_standbys(pool)

    async def drop_dead_standbys(self) -> int:
        """Give back the standbys that no longer answer (process killed, host lost) and name
        a live buddy; returns how many were dropped."""
        dropped = 0
        for pool in Pool:
            for standby in list(self.standbys[pool]):
                try:
                    async with asyncio.timeout(STANDBY_PATIENCE_S):
                        await standby.worker.where.remote()
                except (ray.exceptions.RayActorError, TimeoutError):
                    if standby in self.standbys[pool]:
                        self.standbys[pool].remove(standby)
                        await asyncio.to_thread(_give_back, standby)
                        dropped += 1
            self._name_standbys(pool)
        return dropped

    def short_of_standbys(self) -> bool:
        return any(len(self.standbys[pool]) < self.standby for pool in Pool)

    def _held(self) -> list[ProvisionedNode]:
        return list(self.nodes.values())

    def adopt_spares(self) -> None:
        """After a restart: the warm workers no node uses are spares or standbys again (as
        named; beyond the counts kept per pool, they are given back)."""
        kept = [*self.nodes.values(), *itertools.chain(*self.spares.values(), *self.standbys.values())]
        serving = {node.name for node in kept}
        for entry in ray.util.list_named_actors(all_namespaces=True):
            name = entry["name"]
            prefix = next((p for p in (WORKER_PREFIX, STANDBY_PREFIX) if name.startswith(p)), None)
            if entry["namespace"] != NAMESPACE or prefix is None or name in serving:
                continue
            pool = Pool(name[len(prefix) :].rsplit("-", 1)[0])
            try:
                found = ProvisionedNode(-1, pool, get_placement_group(name), ray.get_actor(name, NAMESPACE), name)
            except ValueError:
                continue
            into, wanted = (self.spares, self.warm) if prefix == WORKER_PREFIX else (self.standbys, self.standby)
            if len(into[pool]) < wanted:
                into[pool].append(found)
            else:
                _give_back(found)
        for pool in Pool:
            self._name_standbys(pool)

    async def ready(self, node_id: int) -> None:
        """Wait until Ray has reserved the node and its worker answers. A worker that died
        is replaced: by a standby of its pool if there is one, else a spare, else by a
        fresh process in the same reservation (cold). Its jobs' trainers come back from
        their buddies' copies when they restart, else from their checkpoints."""
        node = self.nodes[node_id]
        await node.group.ready()
        async with self._replacing.setdefault(node_id, asyncio.Lock()):  # one replacement per death
            await self._answering(node)
        if node.name not in self._answered:
            self._answered.add(node.name)
            self.readied += 1

    async def _answering(self, node: ProvisionedNode) -> None:
        """Return once the node's worker answers, replacing it if it died."""
        try:
            await node.worker.where.remote()
            return
        except ray.exceptions.RayActorError:
            pass
        while self.standbys[node.pool] or self.spares[node.pool]:
            await asyncio.to_thread(self._standby_takes_over, node)
            try:
                await node.worker.where.remote()
                return
            except ray.exceptions.RayActorError:
                continue  # that standby died too: the next one
        node.worker = await asyncio.to_thread(self._worker, node.name, node.pool, node.group)
        node.worker.assign.remote(node.node_id)
        await node.worker.where.remote()

    def _standby_takes_over(self, node: ProvisionedNode) -> None:
        """The dead worker's reservation is given back (its unit will hold a new standby)
        and the first standby (else a spare) serves the node from now on."""
        standby = self.standbys[node.pool].pop(0) if self.standbys[node.pool] else self.spares[node.pool].pop()
        self._name_standbys(node.pool)
        dead_group = node.group
        node.group, node.worker, node.name = standby.group, standby.worker, standby.name
        node.worker.assign.remote(node.node_id)
        internal_kv._internal_kv_put(
            _directory_key(node.node_id), node.name.encode(), overwrite=True, namespace=NAMESPACE
        )
        remove_placement_group(dead_group)

    def release(self, node_id: int) -> None:
        """The node is given back; its worker, emptied, is kept as a spare if its pool has
        room for one (a worker that no longer answers is not)."""
        node = self.nodes.pop(node_id)
        self._replacing.pop(node_id, None)
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
        for pool in Pool:
            for kept in (self.spares[pool], self.standbys[pool]):
                while kept:
                    _give_back(kept.pop())
            self._name_standbys(pool)


def _give_back(node: ProvisionedNode) -> None:
    ray.kill(node.worker)
    remove_placement_group(node.group)
