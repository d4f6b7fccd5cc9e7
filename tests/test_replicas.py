"""The buddy plan: every copy on another node, within the room placement leaves, and a
function of the cluster alone (both drivers call it and must agree)."""

from __future__ import annotations

import copy

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rollmux.core.cluster import Cluster
from rollmux.core.placement import ColocatedPolicy, RandomPolicy, RollMuxPolicy, SoloPolicy, place
from rollmux.core.replicas import Buddy, BuddyPlan, plan_buddies
from rollmux.core.spec import CostModel, Pool
from tests.test_placement import job

TOLERANCE = 1e-6


POLICIES = {
    "rollmux": RollMuxPolicy,
    "solo": SoloPolicy,
    "colocated": ColocatedPolicy,
    "random": lambda: RandomPolicy(seed=1),
}

jobs_strategy = st.lists(
    st.tuples(
        st.floats(min_value=10, max_value=900),
        st.floats(min_value=10, max_value=600),
        st.floats(min_value=1.0, max_value=2.5),
        st.sampled_from([1, 1, 1, 2]),
        st.floats(min_value=0, max_value=1600),
        st.booleans(),
    ),
    min_size=1,
    max_size=14,
)


def random_cluster(jobs: list[tuple], policy: str, data: st.DataObject) -> tuple[Cluster, set[str]]:
    """Jobs placed by the core's real placement, some removed again; the names of those
    that asked for a replica (placed or not)."""
    cluster = Cluster()
    chosen = POLICIES[policy]()
    live: list[str] = []
    replicated: set[str] = set()
    for i, (rollout, train, slo, width, mem, wants_copy) in enumerate(jobs):
        place(cluster, chosen, job(f"j{i}", rollout, train, slo=slo, width=width, mem=mem))
        live.append(f"j{i}")
        if wants_copy:
            replicated.add(f"j{i}")
        if len(live) > 2 and data.draw(st.booleans()):
            cluster.remove(live.pop(data.draw(st.integers(0, len(live) - 1))))
    return cluster, replicated


def copy_gb(cluster: Cluster) -> dict[str, float]:
    """Each placed job's copy: its trainer's resident state."""
    return {spec.name: spec.train_mem_gb for spec in cluster.jobs()}


def trainer_nodes(cluster: Cluster) -> dict[str, tuple[int, ...]]:
    return {m.job.name: m.train_nodes for g in cluster.groups.values() for m in g.members}


def room_left(cluster: Cluster, plan: BuddyPlan, standby: int) -> dict[Buddy, float]:
    """Every possible buddy's host memory left after the placement and the plan's copies."""
    usable = cluster.cost.usable_dram_gb(Pool.TRAIN)
    room = {Buddy(node=n): usable - g.mem_used_gb(n) for g in cluster.groups.values() for n in g.train_nodes}
    room.update({Buddy(standby=slot): usable for slot in range(standby)})
    sizes = copy_gb(cluster)
    for name, buddy in plan.buddies.items():
        room[buddy] -= sizes[name]
    return room


@settings(max_examples=80, deadline=None)
@given(jobs_strategy, st.sampled_from(sorted(POLICIES)), st.integers(0, 3), st.data())
def test_every_copy_is_on_another_node_within_the_room_placement_leaves(jobs, policy, standby, data):
    cluster, replicated = random_cluster(jobs, policy, data)
    plan = plan_buddies(cluster, replicated, standby)
    trainers = trainer_nodes(cluster)

    # (a) A buddy is a held training node other than the job's own trainer, or a standby slot.
    for name, buddy in plan.buddies.items():
        if buddy.node is not None:
            assert cluster.node_pool[buddy.node] is Pool.TRAIN
            assert buddy.node not in trainers[name]
        else:
            assert 0 <= buddy.standby < standby

    # (b) Each node's placed state plus the copies it keeps fits its usable host memory.
    room = room_left(cluster, plan, standby)
    assert all(left >= -TOLERANCE for left in room.values())

    # (c) Only placed, replicated, one-node trainers get buddies; every placed replicated
    # job is in exactly one of buddies and unplaced.
    placed_replicated = replicated & set(trainers)
    assert set(plan.buddies) <= {n for n in placed_replicated if len(trainers[n]) == 1}
    assert set(plan.unplaced) <= placed_replicated
    assert set(plan.buddies) | set(plan.unplaced) == placed_replicated
    assert not set(plan.buddies) & set(plan.unplaced)
    assert list(plan.unplaced) == sorted(plan.unplaced)

    # A one-node copy is left out only when no possible buddy has room for it.
    for name in plan.unplaced:
        if len(trainers[name]) == 1:
            own = Buddy(node=trainers[name][0])
            assert all(left < copy_gb(cluster)[name] + TOLERANCE for buddy, left in room.items() if buddy != own)

    # (d) A function of the cluster alone: the same plan again, from a copy, in any order.
    assert plan_buddies(cluster, replicated, standby) == plan
    assert plan_buddies(copy.deepcopy(cluster), sorted(replicated, reverse=True), standby) == plan


def test_two_jobs_on_separate_training_nodes_keep_each_others_copy():
    cluster = Cluster()
    for name in ("a", "b"):
        place(cluster, SoloPolicy(), job(name, 100, 100, mem=400))
    trainer = {name: node for name, (node,) in trainer_nodes(cluster).items()}
    plan = plan_buddies(cluster, {"a", "b"}, standby=1)
    assert plan.buddies == {"a": Buddy(node=trainer["b"]), "b": Buddy(node=trainer["a"])}
    assert plan.unplaced == ()
    assert plan.replicated("a") and not plan.replicated("a", failed=Buddy(node=trainer["b"]))
    assert plan.replicated("a", failed=Buddy(node=trainer["a"]))


def test_a_copy_that_fits_nowhere_is_unplaced_and_a_standby_takes_it():
    # 1,600 GB usable per node: two 1,000 GB trainers leave 600 GB each, no room for the other's copy.
    cluster = Cluster()
    for name in ("a", "b"):
        place(cluster, SoloPolicy(), job(name, 100, 100, mem=1000))
    assert plan_buddies(cluster, {"a", "b"}, standby=0) == BuddyPlan({}, ("a", "b"))
    # One standby holds one of them (the first by name on equal size), not both.
    assert plan_buddies(cluster, {"a", "b"}, standby=1) == BuddyPlan({"a": Buddy(standby=0)}, ("b",))


def test_a_lone_job_has_no_buddy_without_a_standby_and_a_wide_trainer_never_has_one():
    cluster = Cluster()
    place(cluster, SoloPolicy(), job("lone", 100, 100))
    assert plan_buddies(cluster, {"lone"}, standby=0).unplaced == ("lone",)
    assert plan_buddies(cluster, {"lone"}, standby=1).buddies == {"lone": Buddy(standby=0)}
    place(cluster, SoloPolicy(), job("wide", 100, 100, width=2))
    plan = plan_buddies(cluster, {"lone", "wide", "not-placed"}, standby=2)
    assert "wide" in plan.unplaced and "not-placed" not in plan.unplaced
    assert plan.buddies["lone"].node in trainer_nodes(cluster)["wide"]


def test_jobs_that_did_not_ask_keep_no_copy_and_take_no_room():
    cost = CostModel(dram_reserve_gb=0)  # 1,800 GB usable
    cluster = Cluster(cost=cost)
    for name, mem in (("a", 900), ("b", 900), ("c", 900)):
        place(cluster, SoloPolicy(), job(name, 100, 100, mem=mem))
    plan = plan_buddies(cluster, {"a", "c"}, standby=0)
    assert set(plan.buddies) == {"a", "c"} and plan.unplaced == ()
    assert not plan.replicated("b")


@pytest.mark.parametrize("key", ["node:3", "standby:0"])
def test_buddy_keys_round_trip(key):
    assert Buddy.parse(key).key == key
