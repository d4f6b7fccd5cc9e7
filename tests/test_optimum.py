"""The exact optimum (set-partitioning MILP) against exhaustive search, and regrouping."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rollmux.core.cluster import Cluster
from rollmux.core.optimum import cheapest_group, optimum, set_partitions
from rollmux.core.placement import RollMuxPolicy, place
from rollmux.core.regroup import RegroupConfig, apply_regroup, plan_regroup
from rollmux.core.spec import CostModel, JobSpec, PhaseTime, Planning, Pool

COST = CostModel()


def job(i: int, rollout: float, train: float, slo: float, mem: float = 300.0) -> JobSpec:
    return JobSpec(f"j{i}", PhaseTime.fixed(rollout), PhaseTime.fixed(train), slo, rollout_mem_gb=mem, train_mem_gb=mem)


def exhaustive(jobs: list[JobSpec]) -> float:
    """Test oracle: the cheapest partition, trying every one."""
    best = float("inf")
    for partition in set_partitions(list(range(len(jobs)))):
        plans = [cheapest_group(jobs, block, COST, Planning.P95) for block in partition]
        if all(plans):
            best = min(best, sum(p.cost_per_hour for p in plans))
    return best


def test_set_partitions_are_the_bell_numbers():
    assert [sum(1 for _ in set_partitions(list(range(n)))) for n in range(1, 7)] == [1, 2, 5, 15, 52, 203]


jobs_strategy = st.lists(
    st.tuples(st.integers(20, 400), st.integers(20, 400), st.floats(1.0, 2.0)), min_size=1, max_size=6
)


@settings(max_examples=40, deadline=None)
@given(jobs_strategy)
def test_milp_optimum_equals_exhaustive_search(specs):
    jobs = [job(i, r, t, s) for i, (r, t, s) in enumerate(specs)]
    best = optimum(jobs, COST, Planning.P95)
    assert best.cost_per_hour == pytest.approx(exhaustive(jobs))
    assert sorted(i for plan in best.groups for i in plan.jobs) == list(range(len(jobs)))


@settings(max_examples=40, deadline=None)
@given(jobs_strategy)
def test_optimum_is_never_dearer_than_online_placement(specs):
    jobs = [job(i, r, t, s) for i, (r, t, s) in enumerate(specs)]
    cluster = Cluster()
    for spec in jobs:
        place(cluster, RollMuxPolicy(), spec)
    assert optimum(jobs).cost_per_hour <= cluster.cost_per_hour() + 1e-9


def test_two_lonely_balanced_jobs_are_regrouped_when_it_pays():
    cluster = Cluster()
    for i in range(4):
        place(cluster, RollMuxPolicy(), job(i, 100, 100, 1.5))
    cluster.remove("j1")
    cluster.remove("j2")  # j0 and j3 are now alone in two groups
    assert cluster.cost_per_hour() == pytest.approx(2 * (COST.price(Pool.ROLLOUT) + COST.price(Pool.TRAIN)))
    plan = plan_regroup(cluster, RegroupConfig())
    assert plan is not None and len(plan.moved) == 1, "one joins the other where it is: one move, not two"
    assert (
        not plan.groups_in
        and plan.joins[0].group_id == cluster.group_of(({"j0", "j3"} - {plan.moved[0].name}).pop()).id
    )
    assert plan.saving_per_hour == pytest.approx(COST.price(Pool.ROLLOUT) + COST.price(Pool.TRAIN))
    apply_regroup(cluster, plan)
    assert len(cluster.groups) == 1
    assert cluster.cost_per_hour() == pytest.approx(COST.price(Pool.ROLLOUT) + COST.price(Pool.TRAIN))
    assert all(s <= 1.5 for s in cluster.slowdowns().values())


def test_regrouping_waits_when_the_migration_would_not_repay():
    cluster = Cluster()
    for i in range(4):
        place(cluster, RollMuxPolicy(), job(i, 100, 100, 1.5))
    cluster.remove("j1")
    cluster.remove("j2")
    assert plan_regroup(cluster, RegroupConfig(horizon_s=60.0)) is None


def test_groups_added_by_a_regrouping_get_fresh_nodes():
    cluster = Cluster()
    place(cluster, RollMuxPolicy(), job(9, 100, 100, 1.5))
    best = optimum([job(0, 100, 100, 1.5), job(1, 100, 100, 1.5)])
    group = cluster.add_group(best.groups[0].members)
    used = [n for g in cluster.groups.values() for n in (*g.rollout_nodes, *g.train_nodes)]
    assert len(used) == len(set(used)) == len(cluster.node_pool)
    assert group.slowdowns() == {"j0": 1.0, "j1": 1.0}
