"""Inter-group placement: least marginal cost, SLOs and residency kept, nodes released."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rollmux.core.cluster import Cluster, PlacementKind
from rollmux.core.errors import ResidencyExceeded
from rollmux.core.placement import (
    ColocatedPolicy,
    RandomPolicy,
    RollMuxPolicy,
    SoloPolicy,
    _group_may_host,
    _may_fit,
    group_candidates,
    place,
)
from rollmux.core.spec import CostModel, JobSpec, PhaseTime, Pool


def job(name: str, rollout: float, train: float, slo: float = 1.5, width: int = 1, mem: float = 100.0) -> JobSpec:
    return JobSpec(
        name=name,
        rollout=PhaseTime.fixed(rollout),
        train=PhaseTime.fixed(train),
        slo=slo,
        rollout_width=width,
        train_width=width,
        rollout_mem_gb=mem,
        train_mem_gb=mem,
        colocated=(PhaseTime.fixed(rollout * 1.1), PhaseTime.fixed(train)),
    )


def test_two_balanced_jobs_pack_onto_one_pair_of_nodes():
    cluster = Cluster()
    first = place(cluster, RollMuxPolicy(), job("a", 100, 100))
    second = place(cluster, RollMuxPolicy(), job("b", 100, 100))
    assert first.kind is PlacementKind.ISOLATE
    assert second.kind is PlacementKind.PACK and second.delta_per_hour == 0
    assert (cluster.nodes(Pool.ROLLOUT), cluster.nodes(Pool.TRAIN)) == (1, 1)
    assert cluster.slowdowns() == {"a": 1.0, "b": 1.0}


def test_rollout_heavy_jobs_share_a_trainer_on_their_own_rollout_nodes():
    cluster = Cluster()
    place(cluster, RollMuxPolicy(), job("a", 300, 100, slo=1.2))
    second = place(cluster, RollMuxPolicy(), job("b", 300, 100, slo=1.2))
    assert second.kind is PlacementKind.SCALE_ROLLOUT
    assert second.delta_per_hour == pytest.approx(cluster.cost.price(Pool.ROLLOUT))
    assert (cluster.nodes(Pool.ROLLOUT), cluster.nodes(Pool.TRAIN)) == (2, 1)
    assert max(cluster.slowdowns().values()) <= 1.2


def test_a_job_that_would_break_a_neighbours_slo_is_isolated():
    cluster = Cluster()
    place(cluster, RollMuxPolicy(), job("long", 900, 500, slo=2.0))
    short = place(cluster, RollMuxPolicy(), job("short", 100, 100, slo=1.2))
    assert short.kind is PlacementKind.ISOLATE
    assert len(cluster.groups) == 2


def test_residency_bounds_the_group():
    cost = CostModel(dram_reserve_gb=0)  # 1800 GB per node: four 450 GB jobs fit, a fifth does not
    cluster = Cluster(cost=cost)
    for i in range(5):
        place(cluster, RollMuxPolicy(), job(f"j{i}", 10, 10, slo=10.0, mem=450))
    sizes = sorted(len(g.members) for g in cluster.groups.values())
    assert sizes == [1, 4]


def test_state_larger_than_a_node_is_refused_with_a_reason():
    with pytest.raises(ResidencyExceeded, match="exceeds"):
        place(Cluster(), RollMuxPolicy(), job("huge", 10, 10, mem=5000))


def test_departures_release_nodes_and_empty_groups():
    cluster = Cluster()
    policy = RollMuxPolicy()
    place(cluster, policy, job("a", 300, 100, slo=1.2))
    place(cluster, policy, job("b", 300, 100, slo=1.2))
    removal = cluster.remove("b")
    assert [pool for _, pool in removal.released_nodes] == [Pool.ROLLOUT]
    cluster.remove("a")
    assert cluster.groups == {} and cluster.node_pool == {} and cluster.cost_per_hour() == 0


def test_baselines_hold_the_nodes_they_promise():
    solo, colo = Cluster(), Cluster()
    for name in ("a", "b"):
        place(solo, SoloPolicy(), job(name, 100, 100))
        place(colo, ColocatedPolicy(), job(name, 100, 100))
    assert (solo.nodes(Pool.ROLLOUT), solo.nodes(Pool.TRAIN)) == (2, 2)
    assert (colo.nodes(Pool.ROLLOUT), colo.nodes(Pool.TRAIN)) == (0, 2)
    assert colo.slowdowns()["a"] == pytest.approx((110 + 100) / 200)


def test_random_policy_is_reproducible_by_seed():
    def run(seed: int) -> list[int]:
        cluster = Cluster()
        policy = RandomPolicy(seed=seed)
        return [place(cluster, policy, job(f"j{i}", 50 + i, 60, mem=10)).group_id for i in range(12)]

    assert run(3) == run(3)


jobs_strategy = st.lists(
    st.tuples(
        st.floats(min_value=10, max_value=900),
        st.floats(min_value=10, max_value=600),
        st.floats(min_value=1.0, max_value=2.0),
        st.sampled_from([1, 1, 1, 2]),
        st.floats(min_value=100, max_value=600),
    ),
    min_size=1,
    max_size=14,
)


@settings(max_examples=60, deadline=None)
@given(jobs_strategy, st.data())
def test_rollmux_keeps_every_job_within_slo_and_residency(jobs, data):
    cluster = Cluster()
    policy = RollMuxPolicy()
    live: list[str] = []
    for i, (rollout, train, slo, width, mem) in enumerate(jobs):
        place(cluster, policy, job(f"j{i}", rollout, train, slo=slo, width=width, mem=mem))
        live.append(f"j{i}")
        if len(live) > 2 and data.draw(st.booleans()):
            cluster.remove(live.pop(data.draw(st.integers(0, len(live) - 1))))
        slow = cluster.slowdowns()
        for spec in cluster.jobs():
            assert slow[spec.name] <= spec.slo * (1 + 1e-9)
        for group in cluster.groups.values():
            for node in (*group.rollout_nodes, *group.train_nodes):
                assert group.mem_used_gb(node) <= cluster.cost.usable_dram_gb(cluster.node_pool[node]) + 1e-9
    assert sum(len(g.members) for g in cluster.groups.values()) == len(live)


@settings(max_examples=60, deadline=None)
@given(jobs_strategy)
def test_the_cheap_pre_checks_never_reject_a_feasible_candidate(jobs):
    cluster = Cluster()
    policy = RollMuxPolicy()
    *placed, (rollout, train, slo, width, mem) = jobs
    for i, (r, t, s, w, m) in enumerate(placed):
        place(cluster, policy, job(f"j{i}", r, t, slo=s, width=w, mem=m))
    newcomer = job("new", rollout, train, slo=slo, width=width, mem=mem)
    for group in cluster.groups.values():
        for candidate in group_candidates(cluster, group, newcomer):
            if _group_may_host(cluster, group, newcomer) and _may_fit(cluster, group, candidate):
                continue
            state = cluster.evaluate(group, candidate.member)
            members = [*group.members, candidate.member]
            assert any(p > m.job.period_budget for m, p in zip(members, state.periods, strict=False))
