"""Moving running jobs (regrouping and the SLO guard) in the control plane's state machine:
a moving job finishes the phase it holds on its old nodes, nobody else is granted them
meanwhile, old nodes stay paid until its state has landed, and the move survives a restart."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from rollmux.core.control import DONE, GUARD_SAMPLES, PROFILE_SAMPLES, RUNNING, ControlState, PhaseTiming
from rollmux.core.regroup import DAY, RegroupConfig, RegroupState
from rollmux.core.spec import DEFAULT_PLANNING, CostModel, Pool
from rollmux.inputs.runfile import JobSubmission
from rollmux.service.store import Store
from tests.test_control import control, running, spec

SLO = 1.6
"""Three jobs of 1 s + 1 s phases fit a group (slowdown 1.5), four do not (2.0)."""
FREE_MOVES = RegroupConfig(pause_s=0.0, s_per_gb=0.0)
"""Moves without a pause: jobs seconds old could not afford one within their SLO."""


def start(state: ControlState, names: str, now: float = 0.0) -> dict[str, int]:
    return running(state, *names, now=now, slo=SLO)


def half_empty() -> tuple[ControlState, dict[str, int]]:
    """Two groups of three, then two jobs of one group and one of the other leave: a, d, f
    are left on four nodes where two would do (a joins d and f: one move)."""
    state = control()
    epochs = start(state, "abcdef")
    assert len(state.cluster.groups) == 2
    for name in "bce":
        state.end(name, DONE, 1.0)
    return state, epochs


def held_nodes(state: ControlState) -> set[int]:
    """Nodes paid for now, by the node log so far."""
    held: set[int] = set()
    for entry in state.drain().nodes:
        (held.add if entry.held else held.discard)(entry.node)
    return held


def test_regrouping_moves_jobs_at_their_phase_boundary_and_keeps_their_old_nodes_until_then():
    state, epochs = half_empty()
    grant = state.acquire("a", "rollout", epochs["a"], 2.0)
    old_nodes = set(grant.nodes)
    state.drain()
    moved = state.regroup(FREE_MOVES, RegroupState(), 3.0)
    assert moved == ["a"], "a joins d and f where they are: one move, not three"
    delta = state.drain()
    assert "a" not in delta.movable, "a holds a grant: it moves at its phase boundary"
    assert delta.movable == set(moved) - {"a"}
    released = {n.node for n in delta.nodes if not n.held}
    assert not released & old_nodes, "a's old nodes keep its state: still paid"
    assert state.movable() == sorted(set(moved) - {"a"}, key=list(state.jobs).index)
    for name in state.movable():
        assert state.acquire(name, "rollout", epochs[name], 3.5) is None, "no grant before its state has landed"
    state.release("a", "rollout", epochs["a"], grant.token, PhaseTiming(1.0), 4.0)
    assert "a" in state.drain().movable
    for name in moved:
        move = state.jobs[name].move
        assert state.finish_move(name, epochs[name], move.decided_at, 1024, 5.0)
    delta = state.drain()
    assert {m.job for m in delta.moves} == set(moved)
    assert all(m.pause_s >= 0 and m.outcome == "moved" for m in delta.moves)
    assert old_nodes <= {n.node for n in delta.nodes if not n.held}, "old nodes given back once a's state landed"
    assert len(state.cluster.groups) == 1
    seat = state.seat("a")
    assert state.jobs["a"].in_turns and not {*seat.rollout_nodes, *seat.train_nodes} & old_nodes


def test_the_nodes_a_moving_job_still_holds_are_nobody_elses():
    state, epochs = half_empty()
    grant = state.acquire("a", "rollout", epochs["a"], 2.0)
    assert state.regroup(FREE_MOVES, RegroupState(), 3.0) == ["a"]
    for turns in state.turns.values():
        assert all(turns.holder.get(n) in (None, "a") for n in grant.nodes)
    assert state.acquire("d", "rollout", epochs["d"], 3.5) is not None, "d goes on in the group a joins"
    assert not set(state.jobs["d"].grant.nodes) & set(grant.nodes)


def test_a_move_survives_a_restart_of_the_control_plane(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'state.db'}")
    state, epochs = half_empty()
    store.apply([state.drain()])
    grant = state.acquire("a", "rollout", epochs["a"], 2.0)
    moved = state.regroup(FREE_MOVES, RegroupState(), 3.0)
    store.apply([state.drain()])
    again = ControlState.restore(store.load(), CostModel(), DEFAULT_PLANNING, state.policy, 10.0)
    assert again.moving() == state.moving() and sorted(again.moving()) == sorted(moved)
    assert again.draining() == state.draining()
    assert again.jobs["a"].grant == grant
    again.release("a", "rollout", epochs["a"], grant.token, PhaseTiming(1.0), 11.0)
    for name in moved:
        assert again.finish_move(name, epochs[name], again.jobs[name].move.decided_at, 0, 12.0)
    assert again.moving() == [] and again.draining() == {}
    assert all(again.jobs[name].in_turns for name in moved)


def test_a_job_lost_while_moving_abandons_its_move_and_frees_its_old_nodes():
    state, epochs = half_empty()
    state.acquire("a", "rollout", epochs["a"], 2.0)
    state.regroup(FREE_MOVES, RegroupState(), 3.0)
    state.drain()
    state.lose("a", 4.0, "lease expired")
    delta = state.drain()
    assert state.jobs["a"].move is None
    assert [m.outcome for m in delta.moves] == ["abandoned"]
    assert not state.finish_move("a", epochs["a"], 3.0, 0, 5.0), "a late transfer of an abandoned move is ignored"


def c_twice_as_slow() -> tuple[ControlState, dict[str, int], float]:
    """a, b and c in one group, c's phases twice their estimate: for as many iterations as
    its profile is re-estimated from, then as many as the SLO guard judges it by."""
    state = control()
    epochs = start(state, "abc")
    assert len(state.cluster.groups) == 1
    now = 1.0
    for _ in range(PROFILE_SAMPLES + GUARD_SAMPLES + 1):
        for name in "abc":
            for phase, planned in (("rollout", 1.0), ("train", 1.0)):
                grant = state.acquire(name, phase, epochs[name], now)
                assert grant is not None
                held = planned * (2 if name == "c" else 1)
                now += held
                state.release(name, phase, epochs[name], grant.token, PhaseTiming(held), now)
    return state, epochs, now


def test_the_slo_guard_moves_the_job_whose_measured_phases_break_the_group():
    state, epochs, now = c_twice_as_slow()
    assert state.jobs["c"].spec.rollout.mean == 2.0
    moved = state.guard(now)
    assert moved == ["c"]
    state.finish_move("c", epochs["c"], state.jobs["c"].move.decided_at, 0, now + 0.1)
    assert all(s <= SLO * 1.02 for g in state.cluster.groups.values() for s in g.slowdowns().values())
    assert all(state.jobs[n].state == RUNNING and state.jobs[n].in_turns for n in "abc")
    assert state.guard(now + 1) == []


def test_moves_keep_the_pools_of_their_nodes():
    state, _ = half_empty()
    state.regroup(FREE_MOVES, RegroupState(), 3.0)
    for name in state.moving():
        move = state.jobs[name].move
        assert {p for n, p in move.origin if n in move.rollout_from} == {Pool.ROLLOUT}


def test_jobs_not_started_yet_are_reseated_at_once_without_a_move():
    """As the simulator regroups an arriving job for free, a job placed but never run holds
    no state: regrouping seats it anew, and its old nodes go back at once."""
    state = control()
    for name in "abcdef":
        state.submit(spec(name, slo=SLO), {}, 0.0)
    for name in "bce":
        state.end(name, DONE, 1.0)
    before = held_nodes(state)
    moved = state.regroup(RegroupConfig(), RegroupState(), 2.0)
    assert moved == ["a"] and len(state.cluster.groups) == 1
    delta = state.drain()
    assert not delta.moves and not delta.movable and state.moving() == []
    assert {e.job for e in delta.events if e.kind == "reseated"} == {"a"}
    now_held = (before | {n.node for n in delta.nodes if n.held}) - {n.node for n in delta.nodes if not n.held}
    assert now_held == set(state.cluster.node_pool), "nodes no seat uses are not paid for"


def test_a_running_job_is_moved_only_once_its_pause_fits_its_slo_over_its_life():
    """The simulator's lifetime check, with the live job's progress: jobs seconds old
    cannot afford a 30 s pause within an SLO of 1.6; the same jobs a day old can."""
    state, epochs = half_empty()
    assert state.regroup(RegroupConfig(), RegroupState(), 3.0) == []
    assert state.regroup(RegroupConfig(), RegroupState(), 86_400.0) == ["a"]


def test_a_job_keeps_the_pauses_of_its_moves():
    state, epochs = half_empty()
    state.regroup(FREE_MOVES, RegroupState(), 3.0)
    decided = state.jobs["a"].move.decided_at
    assert state.finish_move("a", epochs["a"], decided, 0, 3.25)
    assert state.jobs["a"].paused_s == 0.25 and state.jobs["d"].paused_s == 0.0
    assert state.jobs["a"].moves == 1 and state.jobs["d"].moves == 0


def test_a_job_whose_driver_is_on_its_way_keeps_its_seat():
    """Once the service starts a job's driver on its seat (it claims it), regrouping may no
    longer re-seat it: the driver would come up on nodes given back."""
    state = control()
    for name in "abcdef":
        state.submit(spec(name, slo=SLO), {}, 0.0)
    for name in "bce":
        state.end(name, DONE, 1.0)
    seat = state.seat("a")
    state.claim("a")
    moved = state.regroup(RegroupConfig(), RegroupState(), 2.0)
    assert "a" not in moved and state.seat("a") == seat


def test_nodes_a_moving_job_still_keeps_are_paid_after_their_group_is_gone():
    """c moves out; a and b leave before c's state has left their nodes: the node log keeps
    those nodes held until c's move lands (their release is logged once, then)."""
    state, epochs, now = c_twice_as_slow()
    assert state.guard(now) == ["c"]
    old = {n for n, _ in state.jobs["c"].move.origin}
    state.drain()
    for name in "ab":
        state.end(name, DONE, now + 1)
    assert not {n.node for n in state.drain().nodes if not n.held} & old
    state.finish_move("c", epochs["c"], state.jobs["c"].move.decided_at, 0, now + 2)
    released = [n.node for n in state.drain().nodes if not n.held]
    assert sorted(released) == sorted(old)


def test_a_job_beyond_its_budget_of_moves_stays_where_it_is():
    """One move at any time, plus ``moves_per_day`` per day run: a job that moved once
    moves again only a day later."""
    budget = RegroupConfig(pause_s=0.0, s_per_gb=0.0, moves_per_day=1.0)
    state, _ = half_empty()
    state.jobs["a"].moves = 1
    assert "a" not in state.regroup(budget, RegroupState(), 3.0), "a used its move"
    again, _ = half_empty()
    again.jobs["a"].moves = 1
    assert again.regroup(budget, RegroupState(), 86_400.0) == ["a"], "a day later it has one more"


@pytest.mark.parametrize(
    ("earlier_moves", "moved"),
    [pytest.param(0, ["a"], id="first-move"), pytest.param(2, [], id="third-move")],
)
def test_each_earlier_move_of_a_job_makes_its_next_move_dearer(earlier_moves, moved):
    """a's move saves $56.32/h, $112.64 over the 2-hour horizon: it repays a $40 risk, but
    with growth 1 a job moved twice before risks $40 x 3 = $120 on its third move."""
    state, _ = half_empty()
    state.jobs["a"].moves = earlier_moves
    config = replace(FREE_MOVES, move_risk_usd=40.0, move_risk_growth=1.0, move_risk_grace=0)
    assert state.regroup(config, RegroupState(), 3.0) == moved


@pytest.mark.parametrize(
    ("earlier_moves", "moved"),
    [pytest.param(2, ["a"], id="third-move-in-grace"), pytest.param(4, [], id="fifth-move")],
)
def test_a_grace_of_moves_keeps_a_jobs_first_moves_at_the_flat_risk(earlier_moves, moved):
    """With a grace of 2, growth counts only the moves after the second: a's third move
    risks the flat $40 and repays it, its fifth risks $40 x (1 + 2) = $120 and does not."""
    state, _ = half_empty()
    state.jobs["a"].moves = earlier_moves
    config = replace(FREE_MOVES, move_risk_usd=40.0, move_risk_growth=1.0, move_risk_grace=2)
    assert state.regroup(config, RegroupState(), 3.0) == moved


@pytest.mark.parametrize(
    ("hours", "moved"),
    [pytest.param(2.0, [], id="two-hours"), pytest.param(8.0, ["a"], id="eight-hours")],
)
def test_the_horizon_is_how_long_a_moves_saving_has_to_repay_its_risk(hours, moved):
    """a's move saves $56.32/h: $112.64 within 2 hours does not repay a $150 risk, $450.56
    within 8 hours does (a says no end, so its window is the whole horizon)."""
    state, _ = half_empty()
    config = replace(FREE_MOVES, move_risk_usd=150.0, horizon_s=hours * 3600)
    assert state.regroup(config, RegroupState(), 3.0) == moved


def test_a_negative_risk_growth_is_refused_by_name():
    with pytest.raises(ValueError, match="move_risk_growth"):
        RegroupConfig(move_risk_growth=-0.5)


@pytest.mark.parametrize(
    ("iterations", "moved"),
    [
        pytest.param(None, ["a"], id="no-end-said"),
        pytest.param(1_000_000, ["a"], id="days-left"),
        pytest.param(100, [], id="minutes-left"),
    ],
)
def test_a_job_about_to_end_is_not_moved_for_a_saving_it_would_not_live_to_repay(iterations, moved):
    """a's move frees a rollout and a training node ($56.32/h); a risk price of $12 is repaid
    within the 2-hour horizon, not within the minutes a has left when it says it runs 100
    more iterations of 3 s (it must still be repaid within 10 minutes then: $72/h)."""
    state = control()
    for name in "abcdef":
        state.submit(replace(spec(name, slo=SLO), iterations=iterations), {}, 0.0)
    for name in "abcdef":
        state.activate(name, state.begin_session(name, 0.0).epoch, 0, 0.0)
    for name in "bce":
        state.end(name, DONE, 1.0)
    assert state.regroup(replace(FREE_MOVES, move_risk_usd=12.0), RegroupState(), 3.0) == moved


def test_a_long_horizon_does_not_make_a_dying_jobs_move_cheaper():
    """As above with a 24-hour horizon: a, minutes from its end, must still repay the $12
    risk within 10 minutes ($72/h against the $56.32/h it saves), not within a share of
    the horizon (a twelfth of 24 hours would ask $6/h and move it)."""
    state = control()
    for name in "abcdef":
        state.submit(replace(spec(name, slo=SLO), iterations=100), {}, 0.0)
    for name in "abcdef":
        state.activate(name, state.begin_session(name, 0.0).epoch, 0, 0.0)
    for name in "bce":
        state.end(name, DONE, 1.0)
    assert state.regroup(replace(FREE_MOVES, move_risk_usd=12.0, horizon_s=DAY), RegroupState(), 3.0) == []


@pytest.mark.parametrize("field", ["min_repay_s", "horizon_s"])
@pytest.mark.parametrize("value", [0.0, -1.0, math.nan, math.inf])
def test_a_window_that_is_not_positive_is_refused_by_name(field, value):
    with pytest.raises(ValueError, match=field):
        RegroupConfig(**{field: value})


@pytest.mark.parametrize("field", ["s_per_gb", "pause_s", "moves_per_day", "move_risk_usd", "move_risk_growth"])
@pytest.mark.parametrize("value", [-1.0, math.nan, math.inf])
def test_a_price_that_is_negative_or_not_finite_is_refused_by_name(field, value):
    """A nan or infinite price would reach the regrouping LP (benches pass argparse floats)."""
    with pytest.raises(ValueError, match=field):
        RegroupConfig(**{field: value})


def test_a_submitted_jobs_iterations_tell_the_control_plane_how_long_it_runs_on():
    job = JobSubmission.model_validate(
        {"name": "a", "kind": "grpo", "iterations": 7, "slo": 3.0, "rollout_s": 1.0, "train_s": 1.0}
    )
    state = control()
    state.submit(job.spec(), job.program(), 0.0)
    epoch = state.begin_session("a", 0.0).epoch
    state.activate("a", epoch, 0, 0.0)
    for phase, at in (("rollout", 0.0), ("train", 1.0)):
        grant = state.acquire("a", phase, epoch, at)
        state.release("a", phase, epoch, grant.token, PhaseTiming(1.0), at + 1.0)
    left = state.progress(state.cluster, 2.0)["a"].remaining_s
    assert left == 6 * 2.0, "6 iterations of 2 s (alone: rollout then training) are left"
