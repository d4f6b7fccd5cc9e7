"""The lower bound on any snapshot's cost: never above the exact optimum or any feasible
placement, equal to the optimum where the LP is integral, and still a bound when its
work budget runs out."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rollmux.core.bound import BoundConfig, _Exact, lower_bound, price_unit
from rollmux.core.cluster import Cluster
from rollmux.core.configs import Config
from rollmux.core.optimum import optimum
from rollmux.core.placement import RollMuxPolicy, place
from rollmux.core.spec import CostModel, JobSpec, NodeType, PhaseTime, Planning, Pool

COST = CostModel()
PLANNING = Planning.P95


def job(i: int, rollout: float, train: float, slo: float, mem: float = 300.0, width: int = 1) -> JobSpec:
    return JobSpec(
        f"j{i}",
        PhaseTime.fixed(rollout),
        PhaseTime.fixed(train),
        slo,
        rollout_width=width,
        train_width=width,
        rollout_mem_gb=mem,
        train_mem_gb=mem,
    )


specs = st.lists(
    st.tuples(st.integers(20, 400), st.integers(20, 400), st.floats(1.0, 2.0), st.sampled_from([100.0, 300.0, 700.0])),
    min_size=1,
    max_size=5,
)


def jobs_of(drawn: list[tuple[int, int, float, float]]) -> list[JobSpec]:
    return [job(i, r, t, s, mem) for i, (r, t, s, mem) in enumerate(drawn)]


@settings(max_examples=40, deadline=None)
@given(specs)
def test_bound_is_at_most_the_exact_optimum(drawn):
    jobs = jobs_of(drawn)
    best = optimum(jobs, COST, PLANNING, colocate=True).cost_per_hour
    bound = lower_bound(jobs, COST, PLANNING)
    assert bound.lp <= bound.value <= best + 1e-6
    assert bound.upper >= best - 1e-6


@settings(max_examples=40, deadline=None)
@given(specs, st.integers(1, 30), st.integers(1, 4))
def test_bound_stays_a_bound_when_its_work_budget_runs_out(drawn, nodes, evaluations):
    jobs = jobs_of(drawn)
    best = optimum(jobs, COST, PLANNING, colocate=True).cost_per_hour
    starved = BoundConfig(nodes_per_pass=nodes, evaluations=evaluations, rounds=2, columns_per_round=2)
    assert lower_bound(jobs, COST, PLANNING, starved).value <= best + 1e-6


@settings(max_examples=40, deadline=None)
@given(specs, st.integers(1, 40))
def test_bound_priced_by_milp_over_the_floor_is_at_most_the_optimum(drawn, rounds):
    """Every part of two or more jobs priced by the floor MILP (as a snapshot of 60-90 jobs
    is), converged or stopped after ``rounds``: still a bound, and the MILP proved every
    set it did not solve exactly."""
    jobs = jobs_of(drawn)
    best = optimum(jobs, COST, PLANNING, colocate=True).cost_per_hour
    bound = lower_bound(jobs, COST, PLANNING, BoundConfig(depth_first_jobs=1, floor_rounds=rounds))
    assert bound.value <= best + 1e-6


def test_floor_milp_bound_converges_above_the_fluid_price():
    """Fourteen jobs priced by the floor MILP (parts beyond four jobs, as a burst's 60-90
    are beyond 32): column generation runs until no set has a negative floor reduced cost,
    and the bound it proves lies between the fluid price and the best placement found."""
    jobs = [job(i, 60 + 7 * (i % 9), 40 + 11 * (i % 5), 1.3 + 0.05 * (i % 7), mem=400.0) for i in range(14)]
    bound = lower_bound(jobs, COST, PLANNING, BoundConfig(depth_first_jobs=4))
    fluid = sum(
        (j.rollout.mean * COST.price(Pool.ROLLOUT) + j.train.mean * COST.price(Pool.TRAIN)) / j.period_budget
        for j in jobs
    )
    assert bound.floor_priced and bound.converged
    assert fluid < bound.value <= bound.upper + 1e-6


@settings(max_examples=40, deadline=None)
@given(specs.filter(lambda drawn: len(drawn) <= 4))
def test_bound_is_at_most_the_cost_of_online_placement(drawn):
    """Groups of at most four jobs: every configuration online placement can form is one
    the model searches (mixed co-location is searched up to four jobs)."""
    jobs = jobs_of(drawn)
    cluster = Cluster()
    for spec in jobs:
        place(cluster, RollMuxPolicy(), spec)
    assert lower_bound(jobs, COST, PLANNING).value <= cluster.cost_per_hour() + 1e-6


def test_bound_equals_the_optimum_where_the_lp_is_integral():
    """Two balanced jobs share one pair of nodes; a job whose chain fits no other's budget
    stays alone: the cheapest cover is also the LP's."""
    jobs = [job(0, 100, 100, 1.5), job(1, 100, 100, 1.5), job(2, 900, 900, 1.1)]
    bound = lower_bound(jobs, COST, PLANNING)
    best = optimum(jobs, COST, PLANNING, colocate=True).cost_per_hour
    assert bound.lp == pytest.approx(best)
    assert bound.value == pytest.approx(best) and bound.optimal and bound.converged


def test_exact_search_closes_the_lp_gap():
    """Four balanced jobs of SLO 1.5: three fit one pair of nodes, so the LP prices each
    job at a third of a pair, but four need two pairs: the search over every column that
    could beat the best placement found proves the optimum."""
    jobs = [job(i, 100, 100, 1.5) for i in range(4)]
    bound = lower_bound(jobs, COST, PLANNING)
    best = optimum(jobs, COST, PLANNING, colocate=True).cost_per_hour
    assert bound.lp < best - 1e-6
    assert bound.value == pytest.approx(best) and bound.optimal and bound.enumerated


def test_price_unit_is_a_rollout_node_in_the_published_model():
    assert price_unit(COST) == pytest.approx(COST.price(Pool.ROLLOUT))
    odd = CostModel(rollout=NodeType("R", Pool.ROLLOUT, 10.0), train=NodeType("T", Pool.TRAIN, 10.0 * 2**0.5))
    assert price_unit(odd) is None


def test_a_job_infeasible_even_alone_is_refused():
    with pytest.raises(ValueError, match="even alone"):
        lower_bound([job(0, 100, 100, 1.5, mem=5000.0)], COST, PLANNING)


def test_by_default_the_bound_covers_the_optimums_groups_of_seven():
    # Issue 27: with groups limited to 6 the bound said 9 units, optimal, where one group of
    # all seven costs 7. Both now default to the same space: co-location, groups up to 8.
    drawn = [(40, 6, 1.85), (31, 9, 1.99), (38, 10, 1.8), (33, 12, 1.69), (31, 11, 1.84), (31, 8, 1.81), (29, 12, 1.76)]
    jobs = [job(i, r, t, slo, mem=10.0) for i, (r, t, slo) in enumerate(drawn)]
    best = optimum(jobs, COST, PLANNING)
    bound = lower_bound(jobs, COST, PLANNING)
    assert bound.value <= best.cost_per_hour + 1e-6
    assert not bound.optimal or bound.upper == pytest.approx(best.cost_per_hour)


def test_every_job_alone_is_searched_however_much_earlier_parts_spent():
    # Seen on a 300-job uniform trace: earlier independent parts spent the call's steps, and
    # the next part's seed (a job alone) came back unknown and was refused as infeasible.
    spent = _Exact({}, COST, PLANNING, colocate=True, left=0, steps_per_search=50_000, steps=0)
    alone = spent.get([job(0, 100, 50, 1.0)], always=True)
    assert isinstance(alone, Config) and alone.cost_per_hour == pytest.approx(
        COST.price(Pool.ROLLOUT) + COST.price(Pool.TRAIN)
    )
    assert not isinstance(spent.get([job(1, 100, 50, 1.0)]), Config), "other searches stay within the steps"
