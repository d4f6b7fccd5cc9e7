"""The control plane's reconciliation with its executor, in process (a real control plane
and SQLite store; an executor that keeps Ray's rules without Ray: a node is known once a
sync provisioned it, and waiting for an unknown node raises KeyError). A job placed while
a sync of nodes is under way is started once its nodes are provisioned: it once stayed
``placed`` forever (its launch met nodes the executor did not know yet, took that for
"released", and nothing launched it again)."""

from __future__ import annotations

import asyncio

from rollmux.core.spec import Pool
from rollmux.inputs.runfile import JobSubmission
from rollmux.service.control import ControlOptions, ControlPlane, NoExecutor
from rollmux.service.store import Store, default_url
from tests.test_regroup_events import wait_for


class SlowSyncExecutor(NoExecutor):
    """Provisions nodes when synced; a sync can be held open; drivers run until stopped."""

    def __init__(self) -> None:
        self.nodes: set[int] = set()
        self.started: list[str] = []
        self.hold = asyncio.Event()
        self.hold.set()
        self.syncing = asyncio.Event()

    async def sync_nodes(self, nodes: dict[int, Pool]) -> None:
        self.syncing.set()
        await self.hold.wait()
        await asyncio.sleep(0.05)  # Ray's calls take a while, in threads
        self.nodes = set(nodes)

    async def wait_nodes(self, nodes: tuple[int, ...]) -> None:
        for node in nodes:
            if node not in self.nodes:
                raise KeyError(node)

    async def start_driver(self, job: str, incarnation: int) -> None:
        self.started.append(job)

    async def driver_ended(self, job: str, incarnation: int) -> str:
        await asyncio.Event().wait()  # until the control plane stops
        return "stopped"


def managed(name: str) -> JobSubmission:
    return JobSubmission.model_validate({"name": name, "kind": "grpo", "iterations": 1, "slo": 3.0})


async def placed_during_a_sync(tmp_path) -> list[str]:
    store = Store(default_url(tmp_path))
    executor = SlowSyncExecutor()
    control = ControlPlane(store, ControlOptions(runs_jobs=True, regroup=None, slo_guard=False), executor)
    await control.start()
    try:
        await control.submit([managed("a")])
        await wait_for(lambda: executor.started == ["a"])
        await control.cancel("a")
        await asyncio.sleep(0.2)  # its reconciliation released a's nodes
        executor.hold.clear()
        executor.syncing.clear()
        reconciling = asyncio.create_task(control._reconcile())
        await wait_for(executor.syncing.is_set)
        await control.submit([managed("b")])  # placed on new nodes while that sync is held open
        executor.hold.set()
        await reconciling
        await wait_for(lambda: "b" in executor.started, timeout_s=5)
        return executor.started
    finally:
        executor.hold.set()
        await control.stop()
        store.engine.dispose()


def test_a_job_placed_while_nodes_are_synced_is_started_once_they_are_provisioned(tmp_path):
    assert asyncio.run(placed_during_a_sync(tmp_path)) == ["a", "b"]
