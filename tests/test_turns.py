"""The runtime's turn-taking is the simulator's round-robin: replayed, they agree exactly."""

from __future__ import annotations

import heapq
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rollmux.core.errors import PhaseOrderError
from rollmux.core.roundrobin import ROLLOUT, TRAIN, Seat, fcfs_order, steady_state, timeline
from rollmux.core.turns import CyclicTurns, JobNodes
from tests.test_roundrobin import single_pair_groups, spatial_groups


def turns_for(seats: list[Seat]) -> CyclicTurns:
    jobs = [f"j{i}" for i in range(len(seats))]
    nodes = {job: JobNodes(s.rollout_nodes, s.train_nodes) for job, s in zip(jobs, seats, strict=False)}
    return CyclicTurns.build(jobs, nodes, fcfs_order(seats))


def replay(seats: list[Seat], iterations: int) -> dict[tuple[int, str, int], float]:
    """Event-driven execution driven only by CyclicTurns: start times per (seat, phase, k)."""
    turns = turns_for(seats)
    done = {job: 0 for job in turns.jobs}
    starts: dict[tuple[int, str, int], float] = {}
    running: list[tuple[float, int, str]] = []
    now = 0.0
    while True:
        for job, phase in turns.startable():
            seat = int(job[1:])
            if phase == ROLLOUT and done[job] >= iterations:
                continue
            turns.start(job, phase)
            starts[(seat, phase, done[job])] = now
            length = seats[seat].rollout_s if phase == ROLLOUT else seats[seat].train_s
            heapq.heappush(running, (now + length, seat, phase))
        if not running:
            return starts
        now, seat, phase = heapq.heappop(running)
        finished = [(seat, phase)]
        while running and running[0][0] == now:
            _, s, p = heapq.heappop(running)
            finished.append((s, p))
        for s, p in finished:
            turns.finish(f"j{s}", p)
            if p == TRAIN:
                done[f"j{s}"] += 1


@settings(max_examples=150, deadline=None)
@given(st.one_of(single_pair_groups(), spatial_groups()))
def test_turn_taking_reproduces_the_simulated_schedule(seats):
    iterations = 6
    replayed = replay(seats, iterations)
    for run in timeline(seats, iterations):
        assert math.isclose(replayed[(run.seat, run.phase, run.iteration)], run.start, abs_tol=1e-9)


def test_a_job_waits_for_its_turn_even_when_the_node_is_free():
    seats = [Seat(5, 5, (0,), (9,)), Seat(5, 5, (0,), (9,))]
    turns = turns_for(seats)
    assert turns.startable() == [("j0", ROLLOUT)]
    turns.start("j0", ROLLOUT)
    assert not turns.may_start("j1", ROLLOUT)  # node 0 is busy
    turns.finish("j0", ROLLOUT)
    assert set(turns.startable()) == {("j0", TRAIN), ("j1", ROLLOUT)}
    with pytest.raises(PhaseOrderError):
        turns.start("j0", ROLLOUT)


def test_membership_change_keeps_running_phases_and_progress():
    seats = [Seat(5, 5, (0,), (9,))]
    turns = turns_for(seats)
    turns.start("j0", ROLLOUT)
    both = [Seat(5, 5, (0,), (9,)), Seat(5, 5, (0,), (9,))]
    nodes = {"j0": JobNodes((0,), (9,)), "j1": JobNodes((0,), (9,))}
    grown = CyclicTurns.build(["j0", "j1"], nodes, fcfs_order(both), previous=turns)
    assert grown.holder == {0: "j0"}
    grown.finish("j0", ROLLOUT)
    assert grown.may_start("j1", ROLLOUT) and grown.may_start("j0", TRAIN)


def replay_with_joins(seats: list[Seat], joins: list[float], cycles: int = 200) -> dict[int, list[float]]:
    """Event-driven turns where seat i joins the group's turns at ``joins[i]`` (the group
    is rebuilt at each join, as the control plane rebuilds it): training ends per seat,
    over ``cycles`` times the group's total work after the last join. 200, not 40: a late
    join can leave a transient that outlasts 40 (:func:`test_a_late_join_settles_after_a_long_transient`)."""
    names = [f"j{i}" for i in range(len(seats))]
    nodes = {n: JobNodes(s.rollout_nodes, s.train_nodes) for n, s in zip(names, seats, strict=False)}
    pending = sorted(range(len(seats)), key=lambda i: joins[i])
    active: list[int] = []
    turns: CyclicTurns | None = None
    ends: dict[int, list[float]] = {i: [] for i in range(len(seats))}
    running: list[tuple[float, int, str]] = []
    now = 0.0
    horizon = max(joins) + cycles * sum(s.rollout_s + s.train_s for s in seats)
    while now <= horizon:
        while pending and joins[pending[0]] <= now:
            active = sorted([*active, pending.pop(0)])
            jobs = [names[i] for i in active]
            turns = CyclicTurns.build(jobs, nodes, fcfs_order([seats[i] for i in active]), turns)
        if turns is not None:
            for job, phase in turns.startable():
                turns.start(job, phase)
                seat = int(job[1:])
                length = seats[seat].rollout_s if phase == ROLLOUT else seats[seat].train_s
                heapq.heappush(running, (now + length, seat, phase))
        upcoming = [running[0][0]] if running else []
        upcoming += [joins[pending[0]]] if pending else []
        if not upcoming:
            break
        now = min(upcoming)
        while running and running[0][0] == now:
            _, seat, phase = heapq.heappop(running)
            turns.finish(f"j{seat}", phase)
            if phase == TRAIN:
                ends[seat].append(now)
    return ends


@settings(max_examples=150, deadline=None)
@given(st.one_of(single_pair_groups(), spatial_groups()), st.data())
def test_jobs_joining_a_running_group_reach_its_planned_periods(seats, data):
    """Whenever each job joins (mid-phase of the others included), the group settles into
    the steady state the simulator plans for all its jobs together."""
    joins = [0.0] + [data.draw(st.floats(0.0, 3 * sum(s.solo_s for s in seats))) for _ in seats[1:]]
    ends = replay_with_joins(seats, joins)
    planned = steady_state(seats).periods
    for seat, times in ends.items():
        last = times[-10:]
        assert math.isclose((last[-1] - last[0]) / (len(last) - 1), planned[seat], rel_tol=1e-6), (seat, joins)


def test_a_late_join_settles_after_a_long_transient():
    """Found by the test above on a clean clone: six jobs on one pair of nodes, one joining
    at 327 s, still ran a period of 140 s (not the planned 141) 40 cycles of the group's
    work later; 80 cycles later it runs 141 for good."""
    sizes = [(1, 1), (9, 23), (60, 9), (8, 60), (60, 1), (3, 46)]
    seats = [Seat(float(r), float(t), (0,), (100,)) for r, t in sizes]
    ends = replay_with_joins(seats, [0.0, 0.0, 0.0, 0.0, 327.0, 0.0])
    planned = steady_state(seats).periods
    for seat, times in ends.items():
        assert [b - a for a, b in zip(times[-11:-1], times[-10:], strict=True)] == 10 * [planned[seat]]


def test_a_job_joining_while_its_partner_trains_does_not_chain_their_phases():
    """The case met on the live system: a pointer per node put the newcomer's training
    before its partner's next one while its rollout came after, so every phase waited for
    the other job's whole iteration."""
    seats = [Seat(1.59, 1.32, (0,), (1,)), Seat(2.07, 0.80, (0,), (1,))]
    ends = replay_with_joins(seats, [0.0, 2.55])
    periods = [b - a for a, b in zip(ends[0][-5:], ends[0][-4:], strict=False)]
    assert max(periods) < 1.59 + 2.07 + 0.5  # not 1.59 + 2.07 + 0.80 + 1.32 = 5.78
    assert all(math.isclose(p, steady_state(seats).periods[0], rel_tol=1e-6) for p in periods)
