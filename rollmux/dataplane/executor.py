"""The control plane's hands on Ray: nodes as placement groups with a worker each, jobs as
drivers in warm driver processes, capacity as what the Ray cluster offers.

It only carries decisions out; what to provision, start or stop comes from the control
plane's state (:meth:`rollmux.service.control.ControlPlane._reconcile`). Blocking Ray
calls run in threads so the control plane's event loop never waits on them. What its
processes run of the job side comes from the entry point (:class:`JobCode`).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import ray

from rollmux.core.control import Capacity
from rollmux.core.roundrobin import ROLLOUT, TRAIN
from rollmux.core.spec import Pool
from rollmux.dataplane.hosts import HOST_PREFIX, Drive, start_host
from rollmux.dataplane.nodes import (
    NAMESPACE,
    POOL_RESOURCE,
    STANDBY_PATIENCE_S,
    NodeProvisioner,
    name_buddy,
    named_buddies,
    worker_of,
)
from rollmux.dataplane.platform import platform_failure
from rollmux.dataplane.warm import WarmOptions
from rollmux.wire.failpoints import failpoint
from rollmux.wire.tasks import describe, spawn

log = logging.getLogger("rollmux.executor")
STANDBY_CHECK_S = 5.0
"""How often the standby workers are checked (a dead one is replaced)."""


@dataclass(frozen=True)
class JobCode:
    """The job side's code that the data plane runs in its processes: its drivers, and the
    sandbox phase of a warm worker. The entry point hands it in (the CLI, or a run that
    embeds a control plane: ``rollmux.sdk.jobcode.JOB_CODE``), so that the control plane,
    which drives the data plane, imports nothing of the job side; Ray pickles the two
    functions by name, and the processes that run them import them."""

    drive: Drive
    sandbox: Callable[[], float]
    """A throw-away phase a warm worker runs before it counts, so the first real switch onto
    it finds the library's code paths, allocator and threads warm; returns its seconds."""


@dataclass
class _Host:
    name: str
    handle: Any
    drivers: dict[str, int] = field(default_factory=dict)
    """job -> incarnation of the drivers running here"""


class RayExecutor:
    def __init__(
        self,
        host_limit_bytes: int,
        job_code: JobCode,
        gpus_per_node: dict[Pool, float] | None = None,
        warm: WarmOptions | None = None,
    ):
        self.warm = warm or WarmOptions()
        self.job_code = job_code
        self.nodes = NodeProvisioner(
            host_limit_bytes, job_code.sandbox, gpus_per_node, self.warm.spare_workers, self.warm.standby_workers
        )
        self.drivers: dict[str, tuple[int, _Host, Any]] = {}
        """job -> (incarnation, its host, the task that ends with its driver; None if found after a restart)"""
        self.hosts: dict[str, _Host] = {}
        self._discovered = False
        self._refill: asyncio.Task | None = None
        self._watch: asyncio.Task | None = None
        self._buddies: dict[str, str] | None = None
        """The buddies written in the GCS (None: not read since this executor started)."""
        self.url = ""
        self.token = ""

    def connect(self, url: str, token: str) -> None:
        """Where drivers reach the control plane."""
        self.url, self.token = url, token

    async def capacity(self) -> Capacity | None:
        """The nodes Ray offers per pool, less the units the standby workers keep."""
        offered = await asyncio.to_thread(ray.cluster_resources)
        standby = self.warm.standby_workers
        return Capacity(
            rollout=max(0, int(offered.get(POOL_RESOURCE[Pool.ROLLOUT], 0)) - standby),
            train=max(0, int(offered.get(POOL_RESOURCE[Pool.TRAIN], 0)) - standby),
            standby=standby,
        )

    async def sync_nodes(self, nodes: dict[int, Pool]) -> None:
        """Release the nodes no longer held, then provision the new ones (from spares first).
        In that order: a released node's worker becomes a spare that keeps its unit, so a
        node created before it was released would wait for that unit forever."""
        if not self._discovered:
            await self._discover()
        for node in [n for n in self.nodes.nodes if n not in nodes]:
            await asyncio.to_thread(self.nodes.release, node)
        for node, pool in nodes.items():
            if node not in self.nodes.nodes:
                await asyncio.to_thread(self.nodes.ensure, node, pool)
        self._keep_standbys()

    async def name_buddies(self, buddies: dict[str, str]) -> None:
        if buddies != self._buddies:  # most node syncs change no buddy: no thread, no GCS call
            await asyncio.to_thread(self._write_buddies, buddies)

    def _write_buddies(self, buddies: dict[str, str]) -> None:
        """Write the buddies that changed, and clear those of jobs that keep no copy now
        (after a restart, every one found in the GCS is checked)."""
        if self._buddies is None:
            self._buddies = dict.fromkeys(named_buddies(), "")
        for job in set(self._buddies) | set(buddies):
            if self._buddies.get(job) != buddies.get(job):
                name_buddy(job, buddies.get(job))
        self._buddies = dict(buddies)

    async def warm_up(self) -> None:
        """Start the spare driver processes and workers and wait until they answer, so the
        first jobs do not wait for processes to start (nor share the cores with them).
        Spare workers are started here only; released nodes' workers refill them later."""
        if not self._discovered:
            await self._discover()
        await self._spare_hosts()
        if self.warm.spare_workers or self.warm.standby_workers:
            await asyncio.to_thread(self.nodes.top_up)
        if self.warm.standby_workers and self._watch is None:
            self._watch = spawn(self._watch_standbys(), "watching the standby workers")
        idle = [h.handle.pid.remote() for h in self.hosts.values() if not h.drivers]
        warm = itertools.chain(*self.nodes.spares.values(), *self.nodes.standbys.values())
        spares = [s.worker.where.remote() for s in warm]
        await asyncio.gather(*idle, *spares)

    async def wait_nodes(self, nodes: tuple[int, ...]) -> None:
        """Wait until the nodes are reserved and their workers answer; where a standby took a
        dead worker's node over, a new standby is started in the background."""
        await asyncio.gather(*(self.nodes.ready(node) for node in nodes))
        self._keep_standbys()

    def nodes_readied(self) -> int:
        return self.nodes.readied

    def _keep_standbys(self) -> None:
        """Start standbys in the background where a pool has fewer than it keeps (one took a
        dead node over), on units no node holds."""
        if self.nodes.short_of_standbys() and self._discovered and self._refill is None:
            self._refill = spawn(self._provision_standbys(), "starting a standby worker")

    async def _watch_standbys(self) -> None:
        """Every few seconds, a standby that died is replaced: the buddy that keeps the
        jobs' copies must be alive when a node dies."""
        while True:
            await asyncio.sleep(STANDBY_CHECK_S)
            try:
                if await self.nodes.drop_dead_standbys():
                    log.warning("a standby worker died; starting another")
                self._keep_standbys()
            except Exception:  # noqa: BLE001 - Ray busy or shutting down: the next round tries again
                log.warning("checking the standby workers failed", exc_info=True)

    async def _provision_standbys(self) -> None:
        try:
            await asyncio.to_thread(self.nodes.top_up, False)
        except Exception:  # noqa: BLE001 - Ray shutting down, or out of units: the next call tries again
            log.warning("starting a standby failed", exc_info=True)
        finally:
            self._refill = None

    async def transfer(self, job: str, epoch: int, pairs: list[tuple[str, int, int]]) -> int:
        """Move a job's roles — (phase, old node, new node) — to their new nodes, worker to
        worker through Ray's object store (this process passes references); the old copies are dropped once every
        role has landed. Returns the bytes moved. A worker that died loses the job's state
        (RayActorError)."""
        nodes = {n for _, old, new in pairs for n in (old, new)}
        await asyncio.gather(*(self.nodes.ready(n) for n in nodes if n in self.nodes.nodes))
        workers = {n: self.nodes.nodes[n].worker if n in self.nodes.nodes else worker_of(n) for n in nodes}
        moved: list[int] = []
        for kind in (TRAIN, ROLLOUT):  # a rollout then lands beside its trainer (no copy of its own), or
            # leaves it taking its weights, never while the trainer's own export lends its tensors out
            carried = [self._carry(job, epoch, p, workers[old], workers[new]) for p, old, new in pairs if p == kind]
            moved += await asyncio.gather(*carried)
        failpoint("move:adopted")
        olds = dict.fromkeys(old for _, old, new in pairs)
        await asyncio.gather(*(workers[old].unload.remote(job) for old in olds if old not in {n for *_, n in pairs}))
        return sum(moved)

    @staticmethod
    async def _carry(job: str, epoch: int, phase: str, source: Any, target: Any) -> int:
        """One role from its old worker to its new one, unless it is there already."""
        if await target.holds.remote(job, phase, epoch):
            return 0
        return await target.adopt.remote(job, phase, epoch, source.export.remote(job, phase, epoch))

    async def start_driver(self, job: str, incarnation: int) -> None:
        """Run the job's driver in a warm driver process with room for it (one is started if
        none has), then start a spare for the next job (the job's start does not depend on it)."""
        failpoint("executor:start-driver")
        await self._stop(job)
        if not self._discovered:
            await self._discover()
        host = self._host_with_room() or await self._new_host()
        host.drivers[job] = incarnation
        ended = asyncio.ensure_future(host.handle.run.remote(self.url, self.token, job, incarnation))
        ended.add_done_callback(lambda done, host=host: self._driver_gone(host, job, incarnation, done))
        self.drivers[job] = (incarnation, host, ended)
        try:
            await self._spare_hosts()
        except Exception as error:  # noqa: BLE001 - Ray short of memory or busy: the next start tries again
            log.warning("starting a spare driver process failed: %s", describe(error))

    def _host_with_room(self) -> _Host | None:
        """The fullest host with room: shared hosts fill up, and empty ones stay spare."""
        room = [h for h in self.hosts.values() if len(h.drivers) < self.warm.drivers_per_process]
        return max(room, key=lambda h: len(h.drivers), default=None)

    async def _new_host(self) -> _Host:
        name, handle = await asyncio.to_thread(start_host, self.warm.drivers_per_process, self.job_code.drive)
        host = self.hosts[name] = _Host(name, handle)
        return host

    async def _spare_hosts(self) -> None:
        """Start driver processes until ``spare_driver_slots`` more drivers fit in them."""
        per_process = self.warm.drivers_per_process
        while sum(per_process - len(h.drivers) for h in self.hosts.values()) < self.warm.spare_driver_slots:
            await self._new_host()

    def _driver_gone(self, host: _Host, job: str, incarnation: int, ended: asyncio.Future) -> None:
        """The driver's thread ended: its slot is free. If its process died (killed, or by
        Ray's memory monitor), the host is gone."""
        if host.drivers.get(job) == incarnation:
            del host.drivers[job]
        if not ended.cancelled() and ended.exception() is not None and platform_failure(ended.exception()):
            self.hosts.pop(host.name, None)

    async def driver_alive(self, job: str, incarnation: int) -> bool:
        if not self._discovered:
            await self._discover()
        for host in self.hosts.values():
            if host.drivers.get(job) == incarnation:
                ended = asyncio.ensure_future(host.handle.until_ended.remote(job, incarnation))
                ended.add_done_callback(lambda done, host=host: self._driver_gone(host, job, incarnation, done))
                self.drivers[job] = (incarnation, host, None)
                return True
        return False

    async def _discover(self) -> None:
        """After a restart: the driver hosts and spare workers that survived, and which
        driver runs where (a host that does not answer is given back). A host whose
        drivers call another address is stopped: they would go on calling a control plane
        that is gone until their leases expired; stopped, their jobs restart at once."""
        self._discovered = True
        named = await asyncio.to_thread(ray.util.list_named_actors, True)
        for entry in named:
            if entry["namespace"] != NAMESPACE or not entry["name"].startswith(HOST_PREFIX):
                continue
            try:
                handle = await asyncio.to_thread(ray.get_actor, entry["name"], NAMESPACE)
                async with asyncio.timeout(20):
                    running = await handle.drivers.remote()
                    serves = await handle.serves.remote()
            except (ValueError, ray.exceptions.RayActorError, TimeoutError):
                continue
            if serves not in (None, self.url):
                await asyncio.to_thread(ray.kill, handle)
                continue
            self.hosts[entry["name"]] = _Host(entry["name"], handle, dict(running))
        await asyncio.to_thread(self.nodes.adopt_spares)

    async def driver_ended(self, job: str, incarnation: int) -> str:
        """How the driver ended: what it returned, or what Ray said of its process (killed,
        by an operator or Ray's memory monitor, or lost with its node)."""
        if job not in self.drivers or self.drivers[job][0] != incarnation or self.drivers[job][2] is None:
            return "not started here"
        try:
            return await asyncio.shield(self.drivers[job][2])
        except ray.exceptions.RayError as error:
            return describe(error)

    async def driver_pid(self, job: str) -> int:
        """The process id of the job's current driver (for operators and failure tests)."""
        return await self.drivers[job][1].handle.pid.remote()

    async def stop_driver(self, job: str, incarnation: int) -> None:
        await self._stop(job)
        for node in [*self.nodes.nodes.values(), *itertools.chain(*self.nodes.standbys.values())]:
            node.worker.unload.remote(job)  # its roles, and its replicas where it kept them

    async def close(self) -> None:
        """Give everything back: driver processes stopped, nodes released (jobs resume at the
        next start). Direct calls: at shutdown the thread pool may already be gone. The
        background tasks (standby watch and refill) are cancelled, and waited for a moment
        when they run on this loop, so the loop's own shutdown finds them ended."""
        background = [task for task in (self._refill, self._watch) if task is not None]
        for task in background:
            task.cancel()
        here = [task for task in background if task.get_loop() is asyncio.get_running_loop()]
        if here:
            await asyncio.wait(here, timeout=STANDBY_PATIENCE_S)
        self._refill = self._watch = None
        for host in self.hosts.values():
            ray.kill(host.handle)
        self.hosts.clear()
        self.drivers.clear()
        self.nodes.release_all()

    async def _stop(self, job: str) -> None:
        """A driver alone in its process is stopped with it; one sharing a process is left to
        end by itself (every call of its old session is refused from now on)."""
        if job not in self.drivers:
            return
        incarnation, host, _ = self.drivers.pop(job)
        if host.drivers.get(job) != incarnation:
            return  # it ended already: its process may run another job's driver by now
        if self.warm.drivers_per_process == 1:
            self.hosts.pop(host.name, None)
            await asyncio.to_thread(ray.kill, host.handle)
