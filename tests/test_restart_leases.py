"""A control plane that takes longer than a lease to come back does not charge its jobs
for it (a real control plane and SQLite store, no Ray; the clock is the test's).

A crash test on a loaded machine saw every job restarted, counted, after the control
plane's own crash: its leases were counted from the rebuild, and reconnecting to Ray and
warming workers took longer than one before any driver could reach it."""

from __future__ import annotations

import asyncio

from rollmux.inputs.runfile import JobSubmission
from rollmux.service.control import ControlOptions, ControlPlane, NoExecutor
from rollmux.service.store import Store, default_url

LEASE_S = 3.0
START_S = 10.0
"""How long the restarted control plane takes to answer: over three leases."""


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class SlowStart(NoExecutor):
    """Warming its workers takes START_S of the test's clock."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock

    async def warm_up(self) -> None:
        self.clock.now += START_S


def external(name: str) -> JobSubmission:
    return JobSubmission.model_validate(
        {"name": name, "kind": "external", "rollout_s": 1.0, "train_s": 1.0, "slo": 3.0}
    )


async def state_after_a_slow_restart(tmp_path) -> tuple[str, str]:
    """A job with a live session; the control plane restarts and takes START_S to answer;
    its first check of leases at once. Returns the job's state then, and a lease later
    with no heartbeat."""
    clock = Clock()
    options = ControlOptions(regroup=None, slo_guard=False, lease_s=LEASE_S)
    store = Store(default_url(tmp_path))
    first = ControlPlane(store, options, clock=clock)
    await first.start()
    await first.submit([external("a")])
    epoch = (await first.begin_session("a", "test"))["epoch"]
    await first.activate("a", epoch, 0)
    await first.stop()

    again = ControlPlane(store, options, executor=SlowStart(clock), clock=clock)
    await again.start()
    try:
        await again._expire_once()
        just_started = (await again.view("a"))["state"]
        clock.now += LEASE_S + 0.1
        await again._expire_once()
        return just_started, (await again.view("a"))["state"]
    finally:
        await again.stop()
        store.engine.dispose()


def test_a_lease_runs_from_when_the_restarted_control_plane_answers(tmp_path):
    just_started, a_lease_later = asyncio.run(state_after_a_slow_restart(tmp_path))
    assert just_started == "running", "the job was lost for the control plane's slow start"
    assert a_lease_later == "lost", "a lease after it answers, a silent driver is lost as ever"
