"""The control plane's hands on Ray: nodes as placement groups with a worker each, jobs as
detached driver actors, capacity as what the Ray cluster offers.

It only carries decisions out; what to provision, start or stop comes from the control
plane's state (:meth:`rollmux.service.control.ControlPlane._reconcile`). Blocking Ray
calls run in threads so the control plane's event loop never waits on them.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import ray

from rollmux.core.control import Capacity
from rollmux.core.spec import Pool
from rollmux.runtime.driver import driver_name, start_driver
from rollmux.runtime.nodes import NAMESPACE, POOL_RESOURCE, NodeProvisioner, worker_of
from rollmux.service.failpoints import failpoint

log = logging.getLogger("rollmux.executor")


class RayExecutor:
    def __init__(self, host_limit_bytes: int, gpus_per_node: dict[Pool, float] | None = None):
        self.nodes = NodeProvisioner(host_limit_bytes, gpus_per_node)
        self.drivers: dict[str, tuple[int, Any, Any]] = {}
        self.url = ""
        self.token = ""

    def connect(self, url: str, token: str) -> None:
        """Where drivers reach the control plane."""
        self.url, self.token = url, token

    async def capacity(self) -> Capacity | None:
        offered = await asyncio.to_thread(ray.cluster_resources)
        return Capacity(
            rollout=int(offered.get(POOL_RESOURCE[Pool.ROLLOUT], 0)),
            train=int(offered.get(POOL_RESOURCE[Pool.TRAIN], 0)),
        )

    async def sync_nodes(self, nodes: dict[int, Pool]) -> None:
        for node, pool in nodes.items():
            if node not in self.nodes.nodes:
                await asyncio.to_thread(self.nodes.ensure, node, pool)
        for node in [n for n in self.nodes.nodes if n not in nodes]:
            await asyncio.to_thread(self.nodes.release, node)

    async def wait_nodes(self, nodes: tuple[int, ...]) -> None:
        await asyncio.gather(*(self.nodes.ready(node) for node in nodes))

    async def transfer(self, job: str, epoch: int, pairs: list[tuple[str, int, int]]) -> int:
        """Move a job's roles — (phase, old node, new node) — to their new nodes, each new
        worker pulling from the old one directly; the old copies are dropped once every
        role has landed. Returns the bytes moved. A worker that died loses the job's state
        (RayActorError)."""
        nodes = {n for _, old, new in pairs for n in (old, new)}
        await asyncio.gather(*(self.nodes.ready(n) for n in nodes if n in self.nodes.nodes))
        workers = {n: self.nodes.nodes[n].worker if n in self.nodes.nodes else worker_of(n) for n in nodes}
        moved = await asyncio.gather(
            *(workers[new].adopt.remote(job, phase, epoch, workers[old]) for phase, old, new in pairs)
        )
        failpoint("move:adopted")
        olds = dict.fromkeys(old for _, old, new in pairs)
        await asyncio.gather(*(workers[old].unload.remote(job) for old in olds if old not in {n for *_, n in pairs}))
        return sum(moved)

    async def start_driver(self, job: str, incarnation: int) -> None:
        await self._stop(job)
        handle = await asyncio.to_thread(start_driver, job, incarnation)
        self.drivers[job] = (incarnation, handle, handle.run.remote(self.url, self.token, job))

    async def driver_alive(self, job: str, incarnation: int) -> bool:
        try:
            handle = await asyncio.to_thread(ray.get_actor, driver_name(job, incarnation), NAMESPACE)
            await asyncio.wait_for(handle.pid.remote(), timeout=10)
        except (ValueError, ray.exceptions.RayActorError, asyncio.TimeoutError):
            return False
        self.drivers[job] = (incarnation, handle, None)
        return True

    async def driver_ended(self, job: str, incarnation: int) -> str:
        if job not in self.drivers or self.drivers[job][0] != incarnation or self.drivers[job][2] is None:
            return "not started here"
        try:
            return await self.drivers[job][2]
        except (ray.exceptions.RayActorError, ray.exceptions.RayTaskError) as error:
            return f"{type(error).__name__}: {str(error).splitlines()[0]}"

    async def driver_pid(self, job: str) -> int:
        """The process id of the job's current driver (for operators and failure tests)."""
        return await self.drivers[job][1].pid.remote()

    async def stop_driver(self, job: str, incarnation: int) -> None:
        await self._stop(job)
        for node in self.nodes.nodes.values():
            node.worker.unload.remote(job)

    async def close(self) -> None:
        """Give everything back: drivers stopped, nodes released (jobs resume at the next
        start). Direct calls: at shutdown the thread pool may already be gone."""
        for _, handle, _ in self.drivers.values():
            ray.kill(handle)
        self.drivers.clear()
        self.nodes.release_all()

    async def _stop(self, job: str) -> None:
        if job in self.drivers:
            _, handle, _ = self.drivers.pop(job)
            await asyncio.to_thread(ray.kill, handle)
