"""Regrouping builds a new group in place of an existing one: the members it keeps on their
nodes do not move (no pause, no move counted, their turns go on), only the others do."""

from __future__ import annotations

import copy
from dataclasses import replace

import pytest

from rollmux.core.cluster import Cluster, Member
from rollmux.core.configs import cheapest_config
from rollmux.core.control import DONE
from rollmux.core.placement import RollMuxPolicy
from rollmux.core.regroup import RegroupConfig, RegroupState, apply_regroup, plan_regroup
from rollmux.core.spec import CostModel, Planning
from rollmux.sim import simulator
from rollmux.sim.generate import BENCH_SHAPES, generate
from tests.test_configs import job
from tests.test_control import control
from tests.test_moves import FREE_MOVES, start

COST = CostModel()


def pair_and_two_alone() -> Cluster:
    """Jobs of 300 s rollout, 50 s training, SLO 1.5: j0 and j1 share a trainer, j2 and j3
    are each alone; all four fit one trainer with a rollout node each."""
    cluster = Cluster()
    jobs = [job(i, 300, 50, 1.5) for i in range(4)]
    for part in (jobs[:2], jobs[2:3], jobs[3:]):
        cluster.add_group(cheapest_config(part, COST, Planning.P95).members)
    return cluster


def seats(cluster: Cluster) -> dict[str, tuple[int, tuple[int, ...], tuple[int, ...]]]:
    return {m.job.name: (g.id, m.rollout_nodes, m.train_nodes) for g in cluster.groups.values() for m in g.members}


def test_a_merge_keeps_the_largest_group_where_it_is_and_moves_only_the_others():
    cluster = pair_and_two_alone()
    before = seats(cluster)
    plan = plan_regroup(cluster, RegroupConfig())
    assert plan is not None
    assert {j.name for j in plan.moved} == {"j2", "j3"}, "j0 and j1 stay on their nodes"
    (place,) = [p for p in plan.in_place if p]
    assert place.stayers == {"j0", "j1"} and place.group_id == before["j0"][0]
    apply_regroup(cluster, plan)
    after = seats(cluster)
    assert after["j0"] == before["j0"] and after["j1"] == before["j1"], "same group, same nodes"
    assert after["j2"][0] == after["j3"][0] == before["j0"][0]
    assert cluster.cost_per_hour() == pytest.approx(98.56)
    assert len(cluster.groups) == 1 and set(cluster.node_pool) == {
        n for g in cluster.groups.values() for n in (*g.rollout_nodes, *g.train_nodes)
    }


def test_a_stayer_is_charged_no_pause_and_no_dollars():
    plan = plan_regroup(pair_and_two_alone(), RegroupConfig())
    pause = RegroupConfig().migration_s(job(2, 300, 50, 1.5))
    assert plan.pauses_s == (pause, pause)
    # Paid twice while the movers finish their phase and pause: the two groups they leave
    # (a rollout and a training node each) and the two rollout nodes added; not the trainer
    # that is kept. Alone, a mover is in its 300 s rollout 300/350 of the time, 150 s left
    # on average, and in its 50 s training the rest, 25 s left: the drain is charged in
    # dollars, but it is no pause (the job works through it).
    drain = (300 * 150 + 50 * 25) / 350
    assert plan.migration_usd == pytest.approx((2 * 56.32 + 2 * 14.08) * (pause + drain) / 3600)


def test_reseating_refuses_a_stayer_off_its_nodes_and_a_member_left_out():
    cluster = pair_and_two_alone()
    group_id = cluster.job_group["j0"]
    group = cluster.groups[group_id]
    config = cheapest_config([m.job for m in group.members], COST, Planning.P95)
    members = list(config.members)
    swapped = [
        replace(members[0], rollout_nodes=members[1].rollout_nodes),
        replace(members[1], rollout_nodes=members[0].rollout_nodes),
    ]
    kept = {
        local: node
        for m, was in zip(members, group.members, strict=True)
        for local, node in zip((*m.rollout_nodes, *m.train_nodes), (*was.rollout_nodes, *was.train_nodes), strict=True)
    }
    with pytest.raises(ValueError, match="not on its nodes"):
        cluster.reseat(group_id, swapped, kept)
    alone = {local: kept[local] for local in (*members[0].rollout_nodes, *members[0].train_nodes)}
    with pytest.raises(ValueError, match="still holds"):
        cluster.reseat(group_id, members[:1], alone)
    with pytest.raises(ValueError, match="no member's node"):
        cluster.reseat(group_id, members[:1], kept)
    with pytest.raises(ValueError, match="is not a"):
        cluster.reseat(group_id, members, {local: node + 100 for local, node in kept.items()})
    cluster.reseat(group_id, members, kept)
    assert seats(cluster)["j0"][1:] == (group.members[0].rollout_nodes, group.members[0].train_nodes)


def test_over_a_trace_stayers_keep_their_seats_and_every_node_has_one_group(monkeypatch):
    """Every plan of a 40-job trace, applied by the simulator: stayers keep their group and
    nodes, movers are exactly the others, and nodes are never shared between groups."""
    found = []
    plan_regroup_of = simulator.plan_regroup

    def checked(cluster, *args, **kwargs):
        plan = plan_regroup_of(cluster, *args, **kwargs)
        if plan is not None:
            trial = copy.deepcopy(cluster)
            before = seats(trial)
            apply_regroup(trial, plan)
            after = seats(trial)
            stayers = frozenset().union(*(p.stayers for p in plan.in_place if p))
            assert not stayers & {j.name for j in plan.moved}
            for name in stayers:
                assert after[name] == before[name]
            owners = [n for g in trial.groups.values() for n in (*g.rollout_nodes, *g.train_nodes)]
            assert len(owners) == len(set(owners)) and set(owners) == set(trial.node_pool)
            found.append(len(stayers))
        return plan

    monkeypatch.setattr(simulator, "plan_regroup", checked)
    trace = generate(replace(BENCH_SHAPES["uniform"], jobs=40, seed=3))
    result = simulator.simulate(trace, RollMuxPolicy(), regroup=RegroupConfig())
    assert sum(found) > 0, "some plan kept jobs in place"
    assert result.slo_attainment == pytest.approx(1.0)


def test_the_control_plane_moves_only_the_jobs_that_leave_their_nodes():
    """Three groups of three, six leave: a, d and g are left alone and come together in the
    group of one of them, who keeps its nodes, its grant and its turns."""
    state = control()
    epochs = start(state, "abcdefghi")
    assert len(state.cluster.groups) == 3
    for name in "bcefhi":
        state.end(name, DONE, 1.0)
    seated: dict[str, Member] = {n: state.seat(n) for n in "adg"}
    grants = {n: state.acquire(n, "rollout", epochs[n], 2.0) for n in "adg"}
    moved = state.regroup(FREE_MOVES, RegroupState(), 3.0)
    (stayer,) = set("adg") - set(moved)
    assert len(moved) == 2 and len(state.cluster.groups) == 1
    assert state.seat(stayer) == seated[stayer], "the stayer's seat is unchanged"
    assert state.jobs[stayer].move is None and state.jobs[stayer].moves == 0
    assert state.jobs[stayer].grant == grants[stayer], "its phase goes on"
    assert all(state.jobs[n].move is not None for n in moved)
