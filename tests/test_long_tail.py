"""Long-tail rollout migration in the core's model (issue 29, item 4): a rollout whose tail
moves onto fewer nodes frees its other nodes early for the next rollout in the group's
turns, which starts on the nodes it gets and takes the others as they come free (elastic:
its head's work shared out over the nodes it has). The periods equal an independent event
simulation, never grow by a moved tail, and the bound stays below the optimum."""

from __future__ import annotations

import math
import random
import re
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from rollmux.cli.main import app
from rollmux.core.bound import lower_bound
from rollmux.core.cluster import Member
from rollmux.core.optimum import optimum
from rollmux.core.roundrobin import (
    Seat,
    components,
    fcfs_order,
    max_cycle_mean,
    round_matrix,
    steady_state,
    subgroup,
    timeline,
)
from rollmux.core.spec import CostModel, JobSpec, Planning, RolloutTail
from rollmux.inputs.trace import Trace, TraceJob
from rollmux.sim.simulator import fluid_lower_bound_usd, with_long_tail
from tests.independent_schedule import random_group, simulated_periods
from tests.test_bound import job

COST = CostModel()
PLANNING = Planning.P95


def close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)


def test_the_next_rollout_starts_on_the_node_a_moved_tail_frees():
    """A's rollout (100 s on nodes 0 and 1) moves its last 40 % onto node 0; B's rollout
    (50 s on node 1) starts at 60 s instead of 100 s, and the period drops from 150 s (node
    1 busy 100 + 50 s) to 120 s (A's own chain)."""
    a, b = Seat(100, 20, (0, 1), (10,), 0.4, 1), Seat(50, 20, (1,), (11,))
    assert steady_state([a, b]).periods == pytest.approx((120.0, 120.0))
    assert steady_state([whole(a), b]).periods == pytest.approx((150.0, 150.0))
    first = [r for r in timeline([a, b], 1) if r.phase == "rollout"]
    runs = [(r.seat, r.start, r.end, r.nodes) for r in first]
    assert runs == [(0, 0, 100, (0,)), (0, 0, 60, (1,)), (1, 60, 110, (1,))]


def test_two_jobs_on_the_same_two_nodes_overlap_one_tail_with_the_others_head():
    """Each rollout takes 100 s on nodes 0 and 1, its last 30 % on one node. The next job
    starts its head on the freed node and takes the other when the tail ends, so no node
    idles through a tail: the period is the nodes' work, 2 x (70 + 30 / 2) = 170 s, not
    200 s (15 % shorter)."""
    a, b = Seat(100, 30, (0, 1), (10,), 0.3, 1), Seat(100, 30, (0, 1), (11,), 0.3, 1)
    assert steady_state([a, b]).periods == pytest.approx((170.0, 170.0))
    assert steady_state([whole(a), whole(b)]).periods == pytest.approx((200.0, 200.0))
    b_first = [(r.start, r.end, r.nodes) for r in timeline([a, b], 1) if r.phase == "rollout" and r.seat == 1]
    assert b_first == [(100.0, 155.0, (0,)), (70.0, 185.0, (1,))]  # begun on node 1 while A's tail runs on 0


def whole(seat: Seat) -> Seat:
    return replace(seat, tail_share=0.0, tail_width=0)


def test_periods_with_moved_tails_equal_an_independent_event_simulation_on_2500_random_groups():
    """Real-valued times, random tail shares and widths, co-located seats among them: the
    core's period and the event simulation's agree to 1e-6 where a rollout is elastic (both
    stop once the state repeats within a relative 1e-9 of its size; the bar is 0.1 %) and
    to 1e-9 elsewhere, where the max-plus cycle mean agrees too."""
    rng = random.Random(29)
    with_tails = 0
    for _ in range(2_500):
        seats = random_group(rng, tails=True)
        with_tails += any(s.elastic for s in seats)
        order, state = fcfs_order(seats), steady_state(seats)
        for members in components(seats):
            sub, sub_order = subgroup(seats, order, members)
            expected = simulated_periods(sub, sub_order)
            found = [state.periods[i] for i in members]
            if any(s.elastic for s in sub):
                assert all(math.isclose(a, b, rel_tol=1e-6) for a, b in zip(found, expected, strict=True)), seats
            else:
                assert all(close(a, b) for a, b in zip(found, expected, strict=True)), seats
                assert close(max_cycle_mean(round_matrix(sub, sub_order)), expected[0]), seats
    assert with_tails >= 1_000


def test_a_moved_tail_never_lengthens_a_period_in_the_same_order():
    rng = random.Random(291)
    for _ in range(1_000):
        seats = random_group(rng, tails=True)
        plain, tailed = steady_state([whole(s) for s in seats]), steady_state(seats)  # one turn order for both
        assert all(t <= p * (1 + 1e-12) for t, p in zip(tailed.periods, plain.periods, strict=True)), seats


def test_no_node_serves_two_phases_at_once_with_moved_tails():
    rng = random.Random(292)
    for _ in range(300):
        seats = random_group(rng, tails=True)
        busy: dict[int, list[tuple[float, float]]] = {}
        for run in timeline(seats, iterations=8):
            for node in run.nodes:
                busy.setdefault(node, []).append((run.start, run.end))
        for intervals in busy.values():
            intervals.sort()
            assert all(b[0] >= a[1] - 1e-9 for a, b in zip(intervals, intervals[1:], strict=False)), seats


def tailed(i: int, rollout: float, train: float, slo: float, width: int, share: float, resume: float = 0.0) -> JobSpec:
    """A job of ``width`` rollout nodes and one trainer, with a tail of ``share`` (0: none)."""
    tail = RolloutTail(share=share, resume_s=resume) if share else None
    return replace(job(i, rollout, train, slo, mem=100.0, width=width), train_width=1, tail=tail)


def test_a_member_moves_its_tail_only_from_a_rollout_wider_than_the_tail():
    wide, narrow = tailed(0, 100, 20, 1.5, 2, 0.3, 5.0), tailed(1, 100, 20, 1.5, 1, 0.3, 5.0)
    seat = Member(wide, (3, 4), (9,)).seat(PLANNING)
    assert (seat.rollout_s, seat.tail_width) == (105.0, 1)
    assert seat.tail_share == pytest.approx(35.0 / 105.0)  # 30 % of 100 s, plus the 5 s resumption
    assert wide.planned_iteration(PLANNING) == 125.0 and wide.solo_iteration() == 120.0
    assert wide.rollout_node_seconds(100.0) == 2 * 105.0 - 35.0
    assert Member(narrow, (3,), (9,)).seat(PLANNING) == Seat(100.0, 20.0, (3,), (9,))
    assert not Member(wide, (9,), (9,), colocated=True).seat(PLANNING).elastic


@pytest.mark.parametrize(
    ("field", "value", "says"),
    [
        ("share", 1.0, "tail share must be in [0, 1)"),
        ("nodes", 0, "tail nodes must be >= 1"),
        ("threshold", 1.0, "tail threshold must be in (0, 1)"),
        ("resume_s", -1.0, "tail resume_s must be >= 0"),
    ],
)
def test_a_tail_out_of_range_is_refused_naming_the_field(field, value, says):
    with pytest.raises(ValueError, match=re.escape(says)):
        RolloutTail(**{"share": 0.3, field: value})


drawn_jobs = st.lists(
    st.tuples(
        st.integers(20, 400),
        st.integers(20, 400),
        st.floats(1.0, 2.0),
        st.sampled_from([1, 2, 3]),
        st.sampled_from([0.0, 0.2, 0.5, 0.8]),
    ),
    min_size=1,
    max_size=5,
)


@settings(max_examples=150, deadline=None)
@given(drawn_jobs)
def test_with_tails_the_bound_stays_below_the_optimum_and_tails_cost_no_more(drawn):
    """The bound counts a tailed rollout's nodes by their mean load (exact work) and their
    least (crowds): still a bound. With no resumption, a moved tail only frees nodes
    earlier, so the optimum with tails is never dearer than without."""
    jobs = [tailed(i, r, t, s, w, share) for i, (r, t, s, w, share) in enumerate(drawn)]
    best = optimum(jobs, COST, PLANNING, colocate=True).cost_per_hour
    assert lower_bound(jobs, COST, PLANNING).value <= best + 1e-6
    plain = [replace(j, tail=None) for j in jobs]
    assert best <= optimum(plain, COST, PLANNING, colocate=True).cost_per_hour + 1e-6


def test_with_long_tail_gives_wide_rollouts_a_tail_on_a_fifth_of_their_nodes():
    jobs = tuple(TraceJob(tailed(i, 100, 20, 1.5, w, 0.0), 0.0, 3600.0) for i, w in enumerate((1, 2, 6)))
    trace = with_long_tail(Trace(jobs), 0.3, 5.0)
    tails = [j.spec.tail for j in trace.jobs]
    assert [t.nodes for t in tails] == [1, 1, 2] and all(t.share == 0.3 and t.resume_s == 5.0 for t in tails)
    assert [j.spec.moves_tail for j in trace.jobs] == [False, True, True]
    assert fluid_lower_bound_usd(trace) < fluid_lower_bound_usd(Trace(jobs))


def test_a_resumption_time_without_long_tail_is_refused():
    trace = Path(__file__).parents[1] / "data" / "traces" / "production-200jobs.trace"
    told = CliRunner().invoke(app, ["simulate", str(trace), "--tail-resume-s", "3"])
    said = " ".join(told.output.split())
    assert told.exit_code == 2 and "--tail-resume-s needs --long-tail" in said, said


@pytest.mark.parametrize(("sigma", "requests"), [(0.2, 512), (0.32, 512), (0.5, 64)])
def test_the_share_of_a_lognormal_tail_matches_drawn_rollouts(sigma, requests):
    """Rollouts drawn from the named distribution (all requests decoding at one pace): the
    share of the time after 80 % of them are done, against the closed form."""
    rng = np.random.default_rng(7)
    lengths = rng.lognormal(0.0, sigma, size=(4_000, requests))
    drawn = 1.0 - np.quantile(lengths, 0.8, axis=1) / lengths.max(axis=1)
    assert RolloutTail.lognormal_share(sigma, requests) == pytest.approx(drawn.mean(), rel=0.05)
    assert RolloutTail.lognormal_share(0.0, requests) == 0.0
