"""The control plane's state machine under a virtual clock (``simulate --engine control``)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rollmux.cli.main import app
from rollmux.core.cluster import Member
from rollmux.core.control import Capacity, ControlState, Delta, PhaseEntry
from rollmux.core.placement import RollMuxPolicy, SoloPolicy
from rollmux.core.regroup import RegroupConfig
from rollmux.core.roundrobin import ROLLOUT, TRAIN, steady_state
from rollmux.core.spec import DEFAULT_PLANNING, JobSpec, PhaseTime, Pool, RolloutTail
from rollmux.core.turns import CyclicTurns
from rollmux.inputs.trace import Trace, TraceJob, load_profile, read_trace, uniform_slo
from rollmux.sim import control_host
from rollmux.sim.control_host import (
    HostCosts,
    InvariantBroken,
    Recorded,
    _Journal,
    check_phase_budget,
    simulate_control,
)
from rollmux.sim.faults import Faults
from rollmux.sim.generate import TraceShape, generate
from rollmux.sim.simulator import simulate, with_long_tail

DATA = Path(__file__).resolve().parents[1] / "data" / "traces"
SHAPE = TraceShape(jobs=14, seed=5, median_hours=6.0, burst_every_hours=1.0)


def spread(trace: Trace) -> Trace:
    """The trace with lognormal phase times (cv 0.3), so that draws differ by seed."""
    jobs = []
    for j in trace.jobs:
        s = j.spec
        jobs.append(
            TraceJob(
                JobSpec(
                    s.name,
                    PhaseTime(s.rollout.mean, cv=0.3),
                    PhaseTime(s.train.mean, cv=0.1),
                    s.slo,
                    s.rollout_width,
                    s.train_width,
                    s.rollout_mem_gb,
                    s.train_mem_gb,
                    None,
                    s.kind,
                ),
                j.arrival,
                j.departure,
            )
        )
    return Trace(tuple(jobs), trace.start)


def test_solo_pays_the_nodes_it_holds_as_the_fast_engine_books_them():
    trace = generate(SHAPE)
    control = simulate_control(trace, SoloPolicy()).result
    fast = simulate(trace, SoloPolicy())
    assert control.cost_usd == pytest.approx(fast.cost_usd, rel=1e-9)
    assert control.slo_attainment == 1.0


def test_rollmux_runs_every_job_to_its_end_within_its_slo_with_moves_paid():
    run = simulate_control(generate(SHAPE), RollMuxPolicy(), regroup=RegroupConfig())
    result = run.result
    assert run.phases > 500
    assert result.migrations == run.moves_started + run.guard_moves > 0
    assert run.moves_done <= result.migrations  # a job may leave before its state lands
    # Steady state keeps every SLO; over a job's life the wait for its first turn in a
    # group it joins counts too (here job8 is seated exactly at its SLO: 1.492 for 1.490).
    assert max(account.slowdown / account.spec.slo for account in result.jobs.values()) < 1.01
    assert all(account.work_s > 0 for account in result.jobs.values())
    solo = simulate(generate(SHAPE), SoloPolicy()).cost_usd
    assert result.cost_usd < solo


def test_the_same_seed_gives_the_same_run_and_another_seed_other_phase_times():
    trace = spread(generate(replace(SHAPE, jobs=8)))

    def summary(seed: int) -> str:
        run = simulate_control(trace, RollMuxPolicy(), regroup=RegroupConfig(), seed=seed)
        slowdowns = {name: account.slowdown for name, account in run.result.jobs.items()}
        return json.dumps([run.result.summary(), slowdowns, run.node_log, run.phases])

    assert summary(1) == summary(1)
    assert summary(1) != summary(2)


def test_a_job_alone_runs_at_slowdown_one_its_cold_start_and_last_partial_phase_counted():
    job = JobSpec("a", PhaseTime.fixed(100), PhaseTime.fixed(300), 1.5)
    trace = Trace((TraceJob(job, 0, 3650),))
    account = simulate_control(trace, SoloPolicy(), costs=HostCosts(job_start_s=80)).result.jobs["a"]
    # 80 s start-up, 8 iterations of 400 s, then 100 s of rollout and 270 s of training
    assert account.work_s == pytest.approx(80 + 8 * 400 + 100 + 270)
    assert account.slowdown == pytest.approx(1.0)


def test_two_jobs_on_one_node_at_once_are_caught(monkeypatch):
    monkeypatch.setattr(CyclicTurns, "may_start", lambda self, name, phase: True)
    with pytest.raises(InvariantBroken):
        simulate_control(generate(SHAPE), RollMuxPolicy(), regroup=RegroupConfig())


def test_simulate_command_runs_the_control_engine_and_refuses_it_with_failures(tmp_path):
    path = tmp_path / "t.jsonl"
    result = CliRunner().invoke(app, ["generate", str(path), "--jobs", "8", "--seed", "2"])
    assert result.exit_code == 0, result.output
    out = tmp_path / "r.json"
    args = ["simulate", str(path), "--policies", "rollmux,solo", "--engine", "control", "--json", str(out)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    assert report["ratios"]["solo"]["cost_over_rollmux"] > 1
    steady = report["steady_state_slo"]
    assert steady["solo"]["attainment"] == 1.0, "alone, every steady period is the solo one"
    assert steady["rollmux"]["judged_job_hours"] > 0 and 0 <= steady["rollmux"]["single_period_attainment"] <= 1
    assert "SLO by steady-state period" in result.output
    result = CliRunner().invoke(app, [*args, "--mtbf-hours", "50"])
    assert result.exit_code == 2
    assert "control engine" in result.output
    result = CliRunner().invoke(app, [*args, "--faults"])
    assert result.exit_code == 0, result.output
    faults = json.loads(out.read_text())["faults"]["policies"]
    assert set(faults) == {"rollmux", "solo"} and faults["rollmux"]["injected"]["plane-restart"] == 2
    result = CliRunner().invoke(app, [*args[:-4], "--faults"])
    assert result.exit_code == 2
    assert "--faults needs --engine control" in result.output


HARSH = Faults(driver_kills_per_job_day=1.0, lease_losses_per_job_day=1.0, node_failures_per_day=6.0, plane_restarts=3)


def test_faults_strike_every_way_and_every_invariant_holds_at_every_step():
    trace = generate(SHAPE)
    clean = simulate_control(trace, RollMuxPolicy(), regroup=RegroupConfig())
    run = simulate_control(trace, RollMuxPolicy(), regroup=RegroupConfig(), faults=HARSH)
    faults = run.faults
    assert faults is not None and faults.checked_steps == run.events
    assert all(count > 0 for count in faults.injected.values()), faults.injected
    assert faults.interruptions >= faults.injected["driver-kill"] + faults.injected["lease-loss"]
    assert faults.redo_s > 0 and faults.down_s > 0
    assert 0.9 < run.result.ettr < 1.0
    assert run.result.cost_usd > clean.result.cost_usd + faults.standby_usd * 0.99
    assert all(a.work_s > 0 for a in run.result.jobs.values())
    assert {name for name, a in run.result.jobs.items() if a.lost_s > 0} <= set(run.result.jobs)


def test_the_same_fault_seed_gives_the_same_run_and_another_seed_other_faults():
    trace = generate(replace(SHAPE, jobs=8))

    def summary(seed: int) -> str:
        run = simulate_control(trace, RollMuxPolicy(), regroup=RegroupConfig(), faults=replace(HARSH, seed=seed))
        assert run.faults is not None
        return json.dumps([run.result.summary(), run.faults.to_json(), run.node_log])

    assert summary(3) == summary(3)
    assert summary(3) != summary(4)


def test_a_journal_that_lost_rows_is_caught_at_the_restart(monkeypatch):
    monkeypatch.setattr(_Journal, "flush", lambda journal: journal.pending.clear())
    with pytest.raises(InvariantBroken, match="accepted but are gone after the control plane restarted"):
        simulate_control(generate(SHAPE), RollMuxPolicy(), regroup=RegroupConfig(), faults=HARSH)


def test_the_slo_guard_judges_a_co_located_member_against_itself_alone_disaggregated():
    """The production trace's first hours (SLO seed 0): job1 runs co-located next to job2,
    both within their SLOs by the plan and by every measured period. The guard used to
    divide a co-located member's period by its co-located phases (slower than alone on
    disaggregated nodes, which its SLO is relative to), saw 1.04x an SLO and moved job2."""
    trace = read_trace(
        DATA / "production-200jobs.trace", load_profile(DATA / "production-profile.json"), uniform_slo(1.2, 1.5, 0)
    )
    jobs = tuple(replace(j, departure=min(j.departure, 20_000.0)) for j in trace.jobs if j.arrival < 9_000)
    run = simulate_control(Trace(jobs), RollMuxPolicy(), regroup=RegroupConfig())
    assert any(account.colocated_s > 0 for account in run.result.jobs.values())
    assert run.guard_moves == 0
    assert run.result.jobs_over_slo == 0


def test_busy_fractions_are_the_phases_on_the_nodes_held():
    job = JobSpec("a", PhaseTime.fixed(100), PhaseTime.fixed(300), 1.5)
    trace = Trace((TraceJob(job, 0, 3280),))
    summary = simulate_control(trace, SoloPolicy(), costs=HostCosts(job_start_s=80)).result.summary()
    # 3,280 s held: 80 s start-up, then 8 iterations of 100 s rollout and 300 s training
    assert summary["rollout_busy_fraction"] == pytest.approx(800 / 3280)
    assert summary["train_busy_fraction"] == pytest.approx(2400 / 3280)


def test_a_trace_it_could_not_replay_in_bounded_time_is_refused_up_front():
    instant = JobSpec("z", PhaseTime.fixed(0), PhaseTime.fixed(0), 1.5)
    with pytest.raises(ValueError, match="job z: rollout and training take 0 s"):
        simulate_control(Trace((TraceJob(instant, 0, 10),)), SoloPolicy())
    fast = JobSpec("f", PhaseTime.fixed(0.5), PhaseTime.fixed(0.5), 1.5)
    with pytest.raises(ValueError, match="more than the control engine.s 2,000,000"):
        simulate_control(Trace((TraceJob(fast, 0, 1_000_001),)), SoloPolicy())
    check_phase_budget(generate(SHAPE))


def phase_log(monkeypatch: pytest.MonkeyPatch) -> list[PhaseEntry]:
    """Every phase-log line the state machine writes from now on, in order."""
    lines: list[PhaseEntry] = []
    drain = ControlState.drain

    def keep(state: ControlState) -> Delta:
        delta = drain(state)
        lines.extend(delta.phases)
        return delta

    monkeypatch.setattr(ControlState, "drain", keep)
    return lines


def test_a_moved_tail_sheds_a_node_and_the_next_rollout_starts_there_before_the_tail_ends(monkeypatch):
    """Two jobs roll out for 100 s on the same two nodes, their last 40 % on one of them.
    A's head is done at 60 s: it sheds node 1, where B's rollout starts at once, while A's
    tail runs on node 0 to 100 s; B is widened onto node 0 then. Each iteration takes the
    nodes' work, 2 x (60 + 40 / 2) = 160 s, not 200 s: the core's period for the group."""
    tailed = [
        JobSpec(name, PhaseTime.fixed(100), PhaseTime.fixed(30), 1.8, 2, 1, 100, 100, tail=RolloutTail(share=0.4))
        for name in ("a", "b")
    ]
    trace = Trace(tuple(TraceJob(spec, 0, 3000) for spec in tailed))
    lines = phase_log(monkeypatch)
    run = simulate_control(trace, RollMuxPolicy(), costs=HostCosts(job_start_s=0, settle_s=0, node_ready_s=0))

    shed = [e for e in lines if e.outcome == "shed" and e.ended_at + 40 < 3000]  # tails the departures spare
    assert len(shed) > 30 and all(len(e.grant.nodes) == 1 for e in shed)
    for line in shed:
        (node,) = line.grant.nodes
        other = "b" if line.grant.job == "a" else "a"
        starts = [
            e.grant.held_since(node)
            for e in lines
            if (e.grant.job, e.grant.phase) == (other, ROLLOUT) and node in e.grant.nodes
        ]
        assert line.ended_at in starts, line
        ends = [e.ended_at for e in lines if e.grant.token == line.grant.token and e.outcome == "released"]
        assert ends == [line.ended_at + 40]
    first = [(e.grant.job, e.grant.nodes, e.grant.granted_at, e.ended_at, e.outcome) for e in lines[:2]]
    assert first == [("a", (1,), 0, 60, "shed"), ("a", (0,), 0, 100, "released")]

    held: dict[int, list[tuple[float, float]]] = {}
    for e in lines:
        for node in e.grant.nodes:
            held.setdefault(node, []).append((e.grant.granted_at, e.ended_at))
    for spans in held.values():
        spans.sort()
        assert all(b[0] >= a[1] for a, b in zip(spans, spans[1:], strict=False)), spans

    trained = [e.ended_at for e in lines if e.grant.job == "a" and e.grant.phase == TRAIN and e.outcome == "released"]
    seats = [Member(spec, (0, 1), (2,)).seat(DEFAULT_PLANNING) for spec in tailed]
    assert [b - a for a, b in zip(trained, trained[1:], strict=False)] == pytest.approx([160.0] * (len(trained) - 1))
    assert steady_state(seats).periods == pytest.approx((160.0, 160.0))
    assert run.result.slo_attainment == 1.0
    assert all(account.work_s > 15 * 130 for account in run.result.jobs.values())


def two_node_rollouts(trace: Trace) -> Trace:
    """The trace with every rollout on two nodes or more, so that every tail moves."""
    jobs = tuple(replace(j, spec=replace(j.spec, rollout_width=max(2, j.spec.rollout_width))) for j in trace.jobs)
    return Trace(jobs, trace.start)


def test_with_moved_tails_the_control_engine_costs_what_the_fast_engine_does_and_no_more_than_without():
    """The fast engine's model of moved tails (the core's elastic seats) and the control
    engine driving the state machine's elastic grants agree on a small trace about as well
    as they do without tails (the control engine pays start-ups, readying and transfers on
    top: 1-2 % dearer there), and tails make neither dearer."""
    plain = two_node_rollouts(generate(SHAPE))
    tails = with_long_tail(plain, 0.5)
    control = [simulate_control(t, RollMuxPolicy(), regroup=RegroupConfig()).result.cost_usd for t in (plain, tails)]
    fast = [simulate(t, RollMuxPolicy(), regroup=RegroupConfig()).cost_usd for t in (plain, tails)]
    assert control == pytest.approx(fast, rel=0.03)
    assert control[1] <= control[0] and fast[1] <= fast[0]


def test_the_same_seed_gives_the_same_run_with_moved_tails():
    plain = spread(two_node_rollouts(generate(replace(SHAPE, jobs=8))))
    tails = with_long_tail(plain, 0.5)

    def summary(trace: Trace, seed: int) -> str:
        run = simulate_control(trace, RollMuxPolicy(), regroup=RegroupConfig(), seed=seed)
        slowdowns = {name: account.slowdown for name, account in run.result.jobs.items()}
        return json.dumps([run.result.summary(), slowdowns, run.node_log, run.phases])

    assert summary(tails, 1) == summary(tails, 1)
    assert summary(tails, 1) != summary(tails, 2)
    assert summary(tails, 1) != summary(plain, 1)


def test_moved_tails_keep_every_invariant_under_faults():
    """Kills, lease losses, node failures and restarts strike elastic rollouts mid-head and
    mid-tail: their stale head ends are dropped and no node is granted twice."""
    trace = with_long_tail(two_node_rollouts(generate(replace(SHAPE, jobs=8))), 0.5)
    run = simulate_control(trace, RollMuxPolicy(), regroup=RegroupConfig(), faults=HARSH)
    assert run.faults is not None and run.faults.checked_steps == run.events
    assert all(count > 0 for count in run.faults.injected.values()), run.faults.injected
    assert all(account.work_s > 0 for account in run.result.jobs.values())


def test_simulate_command_runs_long_tails_on_the_control_engine(tmp_path):
    path = tmp_path / "t.jsonl"
    result = CliRunner().invoke(app, ["generate", str(path), "--jobs", "8", "--seed", "2"])
    assert result.exit_code == 0, result.output
    out = tmp_path / "r.json"
    args = ["simulate", str(path), "--policies", "rollmux,solo", "--engine", "control", "--json", str(out)]
    result = CliRunner().invoke(app, [*args, "--long-tail", "0.5", "--tail-resume-s", "3"])
    assert result.exit_code == 0, result.output
    assert json.loads(out.read_text())["ratios"]["solo"]["cost_over_rollmux"] > 1


def test_a_round_that_plans_for_a_while_starts_its_jobs_and_moves_only_once_it_has_planned():
    """Live, a round plans in a thread while the world goes on: the jobs it has seen start,
    and its moves begin, only when its plan is ready; a round due meanwhile follows it.
    The virtual clock replaying a live run plans as long (``HostCosts.plan_s``)."""
    trace = generate(SHAPE)
    instant = simulate_control(trace, RollMuxPolicy(), regroup=RegroupConfig(), costs=HostCosts(plan_s=0.0))
    slow = simulate_control(trace, RollMuxPolicy(), regroup=RegroupConfig(), costs=HostCosts(plan_s=30.0))
    placed = {e["job"]: e["at"] for e in slow.decision_events if e["kind"] == "placed"}
    moving = [e for e in slow.decision_events if e["kind"] in ("moving", "reseated")]
    assert moving, "the trace has moves to make"
    # Every decision of a round lands at least one planning time after the arrival before it.
    assert all(e["at"] >= min(placed.values()) + 30.0 for e in moving)
    assert slow.result.cost_usd != instant.result.cost_usd  # the world moved on while it planned
    with pytest.raises(ValueError, match="planning"):
        HostCosts(plan_s=-1.0)


def test_a_round_lasts_until_its_new_nodes_are_ready_and_the_next_one_waits_for_it(monkeypatch):
    """Live, a round readies its plan's new nodes before the next round plans: a plan
    dropped after 16 s of readying was applied at once under the virtual clock, and the next
    rounds decided meanwhile (the busiest window parted from live at its first round)."""
    calls: list[tuple[str, float]] = []
    for name in ("plan", "apply"):
        original = getattr(control_host._Host, name)

        def spy(host, *args, name=name, original=original):
            calls.append((name, host.now))
            return original(host, *args)

        monkeypatch.setattr(control_host._Host, name, spy)
    ready_s = 300.0
    costs = HostCosts(node_ready_s=ready_s, plan_s=0.0)
    simulate_control(generate(SHAPE), RollMuxPolicy(), regroup=RegroupConfig(), costs=costs)
    plans = [at for name, at in calls if name == "plan"]
    readied = [at for name, at in calls if name == "apply" and any(abs(p - (at - ready_s)) < 1e-6 for p in plans)]
    assert readied, "some plans ready new nodes"
    assert not [at for at in readied for p in plans if at - ready_s + 1e-6 < p < at], "a round planned meanwhile"


def test_recorded_rounds_plan_and_ready_as_long_as_the_live_round_of_their_number():
    """Replaying a live run, round k plans and readies its new nodes as the live round k
    did; a round beyond the recorded ones takes the modelled times."""
    trace, policy, regroup = generate(SHAPE), RollMuxPolicy(), RegroupConfig()
    modelled = simulate_control(trace, policy, regroup=regroup, costs=HostCosts(plan_s=30.0, node_ready_s=7.0))
    rounds = modelled.result.regroup_rounds
    assert rounds > 2, "the trace has rounds to replay"
    every = Recorded(rounds={k: (30.0, 7.0) for k in range(1, 100 * rounds)})
    instant = HostCosts(plan_s=0.0, node_ready_s=0.0)
    replayed = simulate_control(trace, policy, regroup=regroup, costs=instant, recorded=every)
    assert replayed.decision_events == modelled.decision_events
    first_only = Recorded(rounds={1: (30.0, 7.0)})
    replayed = simulate_control(trace, policy, regroup=regroup, costs=instant, recorded=first_only)
    assert replayed.decision_events != modelled.decision_events
    first = min(e["at"] for e in replayed.decision_events if e["kind"] == "placed")
    assert all(e["at"] >= first + 30.0 for e in replayed.decision_events if e["kind"] in ("moving", "reseated"))


def test_with_the_live_capacity_no_more_nodes_are_held_and_a_plan_that_does_not_fit_waits_for_room():
    """The live plane never holds more nodes than the cluster offers: a round whose new
    nodes do not fit waits until nodes are given back. The virtual clock replaying a live
    run is given the same capacity and the same rule (without it, it moved jobs onto
    nodes the live cluster did not have)."""
    trace, costs = generate(SHAPE), HostCosts(node_ready_s=60.0)
    free = simulate_control(trace, RollMuxPolicy(), regroup=RegroupConfig(), costs=costs)
    peak = {pool: free.result.pools[pool].peak_nodes for pool in Pool}
    capacity = Capacity(rollout=peak[Pool.ROLLOUT] - 1, train=peak[Pool.TRAIN] - 1)
    bounded = simulate_control(trace, RollMuxPolicy(), regroup=RegroupConfig(), costs=costs, capacity=capacity)
    assert free.plans_waiting == 0
    assert bounded.plans_waiting > 0
    assert all(bounded.result.pools[pool].peak_nodes <= capacity.limit(pool) for pool in Pool)
