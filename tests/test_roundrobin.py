"""The round-robin group schedule: its bounds, its optimality claim and its invariants."""

from __future__ import annotations

import math
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from rollmux.core.roundrobin import (
    ROLLOUT,
    TRAIN,
    Seat,
    components,
    fcfs_order,
    lower_bounds,
    max_cycle_mean,
    round_matrix,
    steady_state,
    subgroup,
    timeline,
)
from tests.independent_schedule import random_group, simulated_period

TRAINER = 100
phase_s = st.integers(min_value=1, max_value=60).map(float)


@st.composite
def single_pair_groups(draw) -> list[Seat]:
    """Groups with one rollout node and one trainer shared by every job."""
    n = draw(st.integers(min_value=1, max_value=6))
    return [Seat(draw(phase_s), draw(phase_s), (0,), (TRAINER,)) for _ in range(n)]


@st.composite
def spatial_groups(draw) -> list[Seat]:
    """Groups where several rollout nodes share one trainer; each job pinned to one node."""
    n = draw(st.integers(min_value=2, max_value=6))
    nodes = draw(st.integers(min_value=2, max_value=3))
    return [Seat(draw(phase_s), draw(phase_s), (draw(st.integers(0, nodes - 1)),), (TRAINER,)) for _ in range(n)]


def close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)


def test_worked_example_gives_28():
    seats = [Seat(14, 14, (0,), (TRAINER,)), Seat(7, 7, (0,), (TRAINER,)), Seat(7, 7, (0,), (TRAINER,))]
    state = steady_state(seats)
    assert (state.t1, state.t2) == (28, 28)
    assert all(close(p, 28) for p in state.periods)


@settings(max_examples=300, deadline=None)
@given(single_pair_groups())
def test_one_rollout_node_and_one_trainer_reach_the_bound_exactly(seats):
    state = steady_state(seats)
    bound = max(lower_bounds(seats))
    assert all(close(p, bound) for p in state.periods)


@settings(max_examples=300, deadline=None)
@given(st.one_of(single_pair_groups(), spatial_groups()))
def test_every_period_is_at_least_both_lower_bounds(seats):
    state = steady_state(seats)
    t1, t2 = lower_bounds(seats)
    per_node = {}
    for s in seats:
        per_node[s.rollout_nodes[0]] = per_node.get(s.rollout_nodes[0], 0) + s.rollout_s
    assert t2 >= max(per_node.values())  # every rollout node is its own resource
    assert all(p >= max(t1, t2) * (1 - 1e-9) for p in state.periods)


@settings(max_examples=200, deadline=None)
@given(st.one_of(single_pair_groups(), spatial_groups()))
def test_no_node_runs_two_phases_at_once(seats):
    runs = timeline(seats, iterations=12)
    by_node: dict[int, list[tuple[float, float]]] = {}
    for run in runs:
        for node in run.nodes:
            by_node.setdefault(node, []).append((run.start, run.end))
    for intervals in by_node.values():
        intervals.sort()
        for (_, end), (start, _) in zip(intervals, intervals[1:], strict=False):
            assert start >= end - 1e-9


@settings(max_examples=200, deadline=None)
@given(st.one_of(single_pair_groups(), spatial_groups()))
def test_every_job_alternates_rollout_then_training(seats):
    runs = timeline(seats, iterations=12)
    for i in range(len(seats)):
        mine = sorted((r for r in runs if r.seat == i), key=lambda r: (r.start, r.phase != ROLLOUT))
        assert [r.phase for r in mine] == [ROLLOUT, TRAIN] * 12
        for before, after in zip(mine, mine[1:], strict=False):
            assert after.start >= before.end - 1e-9


@settings(max_examples=200, deadline=None)
@given(st.one_of(single_pair_groups(), spatial_groups()))
def test_period_is_the_steady_state_not_the_start_up(seats):
    """The reported period is what late meta-iterations take, however long the transient."""
    state = steady_state(seats)
    iterations = 400
    runs = [r for r in timeline(seats, iterations) if r.seat == 0 and r.phase == ROLLOUT]
    late = (runs[-1].start - runs[iterations // 2].start) / (iterations - 1 - iterations // 2)
    assert math.isclose(state.periods[0], late, rel_tol=0.02)


def test_start_up_transient_differs_from_steady_state():
    """A group whose first meta-iterations run faster than its steady period."""
    seats = [Seat(1, 10, (0,), (TRAINER,)), Seat(10, 1, (1,), (TRAINER,)), Seat(5, 5, (1,), (TRAINER,))]
    runs = [r for r in timeline(seats, 50) if r.seat == 0 and r.phase == ROLLOUT]
    first_gap = runs[1].start - runs[0].start
    state = steady_state(seats)
    assert not close(first_gap, state.periods[0])
    assert close(runs[-1].start - runs[-2].start, state.periods[0])


def test_fcfs_orders_trainings_by_rollout_end():
    seats = [Seat(9, 1, (0,), (TRAINER,)), Seat(2, 1, (1,), (TRAINER,)), Seat(5, 1, (2,), (TRAINER,))]
    order = fcfs_order(seats)
    assert order.rollout == (0, 1, 2)
    assert order.train == (1, 2, 0)


def test_jobs_on_disjoint_nodes_keep_their_own_period():
    seats = [Seat(3, 4, (0,), (10,)), Seat(20, 5, (1,), (11,))]
    assert steady_state(seats).periods == (7.0, 25.0)


def test_a_long_transient_gets_its_exact_period_not_an_average():
    # Filed in issue 27: the averaged fallback said 62.355993, below the true period.
    seats = [
        Seat(22.045063, 1.635633, (0,), (10,)),
        Seat(59.210359, 3.496415, (1,), (10,)),
        Seat(37.828241, 24.527752, (0,), (11,)),
    ]
    expected = simulated_period(seats, fcfs_order(seats))
    assert close(expected, 62.706774)
    assert all(close(p, expected) for p in steady_state(seats).periods)


def test_periods_equal_an_independent_event_simulation_on_random_real_valued_groups():
    """Both ways the core finds a period (a repeated state, the cycle mean) against the
    independent simulation; ``bench/steady_state_exact.py`` runs 100,000 such groups."""
    rng = random.Random(27)
    for _ in range(1_500):
        seats = random_group(rng)
        order, state = fcfs_order(seats), steady_state(seats)
        for members in components(seats):
            sub, sub_order = subgroup(seats, order, members)
            expected = simulated_period(sub, sub_order)
            assert close(state.periods[members[0]], expected), seats
            assert close(max_cycle_mean(round_matrix(sub, sub_order)), expected), seats
            assert all(expected >= seat.solo_s * (1 - 1e-12) for seat in sub)
