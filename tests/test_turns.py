"""The runtime's turn-taking is the simulator's round-robin: replayed, they agree exactly."""

from __future__ import annotations

import heapq
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rollmux.core.errors import PhaseOrderError
from rollmux.core.roundrobin import ROLLOUT, TRAIN, Seat, fcfs_order, timeline
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
