"""A job waiting for its turn hears of its grant at once, however the commits interleave
(a real control plane and SQLite store, no Ray: external jobs drive themselves).

The busiest windows of the production trace replayed live showed phases that started
5 s (half a lease) after their grant: a job was granted while its own request was still
committing, the grant's wake-up found no one waiting, and the request then waited out its
long poll. Every such phase cost the job a period over its SLO."""

from __future__ import annotations

import asyncio

from rollmux.core.control import PhaseTiming
from rollmux.core.regroup import RegroupConfig
from rollmux.inputs.runfile import JobSubmission
from rollmux.service.control import ControlOptions, ControlPlane
from rollmux.service.store import Store, default_url

LEASE_S = 60.0
"""Long: a lost wake-up would hold the waiting request for half of it."""


def external(name: str) -> JobSubmission:
    return JobSubmission.model_validate(
        {"name": name, "kind": "external", "rollout_s": 10.0, "train_s": 10.0, "slo": 3.0}
    )


async def granted_while_committing(tmp_path) -> tuple[bool, float]:
    """Job b asks for the rollout a holds; a releases it while b's request is still
    committing (held there by the test), before b waits for its wake-up. Returns whether
    b got its grant, and how long after the commit it took."""
    store = Store(default_url(tmp_path))
    control = ControlPlane(store, ControlOptions(regroup=RegroupConfig(), slo_guard=False, lease_s=LEASE_S))
    await control.start()
    try:
        await control.submit([external("a"), external("b")])
        assert len(control.groups()) == 1, "the two jobs share one group's turns"
        epochs = {}
        for name in "ab":
            epochs[name] = (await control.begin_session(name, "test"))["epoch"]
            await control.activate(name, epochs[name], 0)
        first = await control.acquire("a", "rollout", epochs["a"], wait_s=1.0)
        assert first is not None and first.job == "a"

        committing, commit_done = asyncio.Event(), asyncio.Event()
        persist = control._persist

        async def held_commit() -> None:
            await persist()
            if asyncio.current_task() is asking:
                committing.set()
                await commit_done.wait()

        control._persist = held_commit
        asking = asyncio.create_task(control.acquire("b", "rollout", epochs["b"], wait_s=LEASE_S))
        await asyncio.wait_for(committing.wait(), timeout=10)
        await control.release("a", "rollout", epochs["a"], first.token, PhaseTiming(busy_s=1.0))
        committed = asyncio.get_running_loop().time()
        commit_done.set()
        grant = await asyncio.wait_for(asking, timeout=LEASE_S)
        return grant is not None and grant.job == "b", asyncio.get_running_loop().time() - committed
    finally:
        await control.stop()
        store.engine.dispose()


def test_a_grant_made_while_the_request_commits_is_not_lost(tmp_path):
    granted, waited_s = asyncio.run(granted_while_committing(tmp_path))
    assert granted
    assert waited_s < 2.0, f"b heard of its grant {waited_s:.1f} s late (a lost wake-up waits {LEASE_S / 2:g} s)"
