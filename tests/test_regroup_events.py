"""The control plane's regrouping rounds and the events that ask for them, in process
(a real control plane and SQLite store, no Ray: external jobs drive themselves). An event
that lands while a round is planning must ask for another round: three departures within
milliseconds once left two groups that one would serve, and nothing moved."""

from __future__ import annotations

import asyncio
import threading
import time

from rollmux.core import regroup as regroup_module
from rollmux.core.control import Capacity
from rollmux.core.regroup import RegroupConfig
from rollmux.inputs.runfile import JobSubmission
from rollmux.service import control as control_module
from rollmux.service.control import ControlOptions, ControlPlane
from rollmux.service.store import Store, default_url

RESIDENT_GB = 450.0  # three jobs' roles fill a node's host memory: groups of three


def external(name: str) -> JobSubmission:
    return JobSubmission.model_validate(
        {
            "name": name,
            "kind": "external",
            "rollout_s": 10.0,
            "train_s": 10.0,
            "colo_rollout_s": 100.0,
            "colo_train_s": 100.0,
            "slo": 3.0,
            "rollout_mem_gb": RESIDENT_GB,
            "train_mem_gb": RESIDENT_GB,
        }
    )


async def wait_for(condition, timeout_s: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached"
        await asyncio.sleep(0.01)


async def six_running(control: ControlPlane) -> None:
    """Jobs a to f submitted, each in a session and running in its turns."""
    await control.submit([external(n) for n in "abcdef"])
    for name in "abcdef":
        session = await control.begin_session(name, "test")
        await control.activate(name, session["epoch"], 0)


def rounds_by_hand(control: ControlPlane) -> None:
    """Stop the control plane's own regrouping rounds: the test runs each one."""
    for task in control._tasks:
        if task.get_name() == "regroup":
            task.cancel()


async def departures_while_planning(tmp_path, monkeypatch) -> list[str]:
    """Six running jobs in two groups of three; b and c leave, and e leaves while the
    round that b and c asked for is still planning. Returns the jobs of the one group left."""
    planning, resume = threading.Event(), threading.Event()
    plan_regroup = control_module.plan_regroup

    def slow_plan(*args, **kwargs):
        planning.set()
        resume.wait(timeout=10)
        return plan_regroup(*args, **kwargs)

    store = Store(default_url(tmp_path))
    # Moves cost no pause here: jobs a second old could not afford one within their SLO.
    free_moves = RegroupConfig(pause_s=0.0, s_per_gb=0.0)
    options = ControlOptions(regroup=free_moves, slo_guard=False, regroup_poll_s=0.01)
    control = ControlPlane(store, options)
    await control.start()
    try:
        await six_running(control)
        assert len(control.groups()) == 2
        await wait_for(lambda: not control._regroup_due)  # the arrivals' rounds are over
        monkeypatch.setattr(control_module, "plan_regroup", slow_plan)
        await control.cancel("b")
        await control.cancel("c")
        await wait_for(planning.is_set)  # a round plans {a}, {d, e, f}: nothing to gain
        await control.cancel("e")  # {a} and {d, f}: one group would do
        resume.set()
        await wait_for(lambda: len(control.groups()) == 1, timeout_s=10)
        return sorted(j["name"] for j in control.groups()[0]["jobs"])
    finally:
        resume.set()
        await control.stop()
        store.engine.dispose()


def test_a_departure_during_a_regrouping_round_gets_a_round_of_its_own(tmp_path, monkeypatch):
    assert asyncio.run(departures_while_planning(tmp_path, monkeypatch)) == ["a", "d", "f"]


async def placed_then_examined(tmp_path) -> tuple[bool, bool, str]:
    """A job placed on arrival, before and after the regrouping round that sees it."""
    store = Store(default_url(tmp_path))
    control = ControlPlane(store, ControlOptions(regroup=RegroupConfig(), slo_guard=False, regroup_poll_s=3600))
    await control.start()
    rounds_by_hand(control)
    try:
        await control.submit([external("a")])
        job = control.state.jobs["a"]
        before = control._settled(job)
        await control._regroup_once()
        return before, control._settled(job), job.state
    finally:
        await control.stop()
        store.engine.dispose()


def test_a_placed_job_starts_only_once_a_regrouping_round_has_seen_it(tmp_path):
    """Its driver waits for that round, which may seat it elsewhere for free (as the
    simulator regroups an arriving job at once) instead of moving it once it runs."""
    before, after, state = asyncio.run(placed_then_examined(tmp_path))
    assert (before, after, state) == (False, True, "placed")


async def placed_and_examined_at_once(tmp_path) -> float:
    """Seconds from a job's placement to a regrouping round that saw it, with rounds
    polled once an hour."""
    store = Store(default_url(tmp_path))
    control = ControlPlane(store, ControlOptions(regroup=RegroupConfig(), slo_guard=False, regroup_poll_s=3600))
    await control.start()
    try:
        loop = asyncio.get_running_loop()
        placed = loop.time()
        await control.submit([external("a")])
        await wait_for(lambda: control._settled(control.state.jobs["a"]), timeout_s=30)
        return loop.time() - placed
    finally:
        await control.stop()
        store.engine.dispose()


def test_an_arrival_starts_a_regrouping_round_at_once_not_at_the_next_poll(tmp_path):
    """A placed job's driver waits for that round: polling alone would hold it back up to
    a poll period (an hour here)."""
    assert asyncio.run(placed_and_examined_at_once(tmp_path)) < 30


async def three_leave_with_capacity(tmp_path, nodes_per_pool: int) -> tuple[list[str], bool]:
    """Six running jobs in two groups of three (two nodes of each pool); b, c and e leave.
    Returns the jobs moving after a round, and whether regrouping waits for room."""
    tmp_path.mkdir()
    store = Store(default_url(tmp_path))
    capacity = Capacity(rollout=nodes_per_pool, train=nodes_per_pool)
    free_moves = RegroupConfig(pause_s=0.0, s_per_gb=0.0)
    options = ControlOptions(regroup=free_moves, slo_guard=False, regroup_poll_s=3600, capacity=capacity)
    control = ControlPlane(store, options)
    await control.start()
    rounds_by_hand(control)
    try:
        await six_running(control)
        await control._regroup_once()
        for name in "bce":
            await control.cancel(name)
        await control._regroup_once()
        return sorted(control.state.moving()), control._waiting_room
    finally:
        await control.stop()
        store.engine.dispose()


def test_a_regrouping_that_does_not_fit_the_capacity_waits_instead_of_stopping_its_jobs(tmp_path, monkeypatch):
    """Without joins and groups built in place (a joins d and f where they are, on nodes
    they hold), a, d and f together need a new node of each pool while their old ones
    still hold their state: with two of each offered, none of them stops (they would wait
    at their boundaries for nodes only their own moves free); with three, they move."""
    assert asyncio.run(three_leave_with_capacity(tmp_path / "join", 2)) == (["a"], False)
    monkeypatch.setattr(regroup_module, "_relocations", lambda *_: [])
    monkeypatch.setattr(regroup_module, "_in_place", lambda *_: None)
    assert asyncio.run(three_leave_with_capacity(tmp_path / "two", 2)) == ([], True)
    assert asyncio.run(three_leave_with_capacity(tmp_path / "three", 3)) == (["a", "d", "f"], False)


async def timed_rounds(tmp_path, monkeypatch) -> list[dict]:
    """Six running jobs, three rounds by hand (the second plans for at least 0.2 s, the
    third moves a, d and f onto three new nodes of each pool); two rounds are kept."""
    plan_regroup = control_module.plan_regroup
    slow = iter([False, True, False])

    def timed_plan(*args, **kwargs):
        if next(slow):
            time.sleep(0.2)
        return plan_regroup(*args, **kwargs)

    monkeypatch.setattr(control_module, "plan_regroup", timed_plan)
    monkeypatch.setattr(control_module, "ROUND_LOG", 2)
    monkeypatch.setattr(regroup_module, "_relocations", lambda *_: [])
    monkeypatch.setattr(regroup_module, "_in_place", lambda *_: None)
    store = Store(default_url(tmp_path))
    options = ControlOptions(
        regroup=RegroupConfig(pause_s=0.0, s_per_gb=0.0), slo_guard=False, capacity=Capacity(rollout=3, train=3)
    )
    control = ControlPlane(store, options)
    await control.start()
    rounds_by_hand(control)
    try:
        await six_running(control)
        await control._regroup_once()
        control._regroup_due = True
        await control._regroup_once()
        for name in "bce":
            await control.cancel(name)
        await control._regroup_once()
        assert [r["id"] for r in control.rounds(2, 10)] == [3]
        assert len(control.rounds(-1, 1)) == 1
        return control.rounds(-1, 10)
    finally:
        await control.stop()
        store.engine.dispose()


def test_each_regrouping_round_records_its_planning_and_readying_time(tmp_path, monkeypatch):
    """What the virtual clock replays round by round (``rollmux replay``): the slow round
    plans at least as long as it slept, the round that moves readies new nodes first, and
    only the newest rounds are kept."""
    second, third = asyncio.run(timed_rounds(tmp_path, monkeypatch))
    assert (second["id"], third["id"]) == (2, 3)
    assert second["plan_s"] >= 0.2 and second["moves"] == 0 and second["ready_s"] == 0.0
    assert third["plan_s"] < 0.2 and third["moves"] == 3 and third["ready_s"] > 0.0


async def stopped_as_a_round_is_asked_for(tmp_path) -> bool:
    """Whether the control plane stops when its regrouping task is cancelled in the very
    instant an event asks for a round."""
    store = Store(default_url(tmp_path))
    control = ControlPlane(store, ControlOptions(regroup=RegroupConfig(), slo_guard=False, regroup_poll_s=3600))
    await control.start()
    try:
        await asyncio.sleep(0.05)  # the regrouping task waits for an event
        assert control._regroup_now is not None
        control._regroup_now.set()
        async with asyncio.timeout(20):
            await control.stop()
        return True
    except TimeoutError:
        return False
    finally:
        store.engine.dispose()


def test_the_control_plane_stops_when_a_round_is_asked_for_as_it_stops(tmp_path):
    """``asyncio.wait_for`` on Python 3.11 swallowed that cancellation: the regrouping
    task ran on and the stop waited for it for ever (a CI run hung 600 s)."""
    assert asyncio.run(stopped_as_a_round_is_asked_for(tmp_path))
