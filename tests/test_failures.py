"""Failure injection in the simulator: seeded, exact on a hand-made case, and never
flattering (ETTR in [0, 1], standby paid, replicas lose no progress where the buddy plan
found them room, and only there)."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from rollmux.cli.main import app
from rollmux.core.placement import RollMuxPolicy, SoloPolicy
from rollmux.core.spec import HOUR, CostModel, JobSpec, PhaseTime, Pool
from rollmux.inputs.trace import Trace, TraceJob
from rollmux.sim.compare import compare
from rollmux.sim.failures import FailureModel, Recovery, RecoveryTimes
from rollmux.sim.generate import TraceShape, generate, write_jsonl
from rollmux.sim.simulator import simulate

COST = CostModel()
PAIR = COST.price(Pool.ROLLOUT) + COST.price(Pool.TRAIN)


def spec(
    name: str, rollout: float = 100, train: float = 100, slo: float = 1.5, mem: float = 0.0, width: int = 1
) -> JobSpec:
    fixed = (PhaseTime.fixed(rollout), PhaseTime.fixed(train))
    return JobSpec(name, *fixed, slo, rollout_width=width, train_width=width, train_mem_gb=mem, colocated=fixed)


def jobs_trace(count: int, hours: float) -> Trace:
    """``count`` balanced jobs, all held for ``hours`` from time 0."""
    return Trace(tuple(TraceJob(spec(f"j{k}"), 0, hours * HOUR) for k in range(count)))


def test_same_seed_same_failures_other_seed_others():
    trace = jobs_trace(6, 48)
    model = FailureModel(mtbf_hours=20, standby=1, replicas=True, seed=3)
    first, again = simulate(trace, SoloPolicy(), failures=model), simulate(trace, SoloPolicy(), failures=model)
    assert first.failures.log == again.failures.log and first.failures.failures > 10
    assert first.cost_usd == again.cost_usd and first.ettr == again.ettr
    other = simulate(trace, SoloPolicy(), failures=FailureModel(mtbf_hours=20, standby=1, replicas=True, seed=4))
    assert [h.time for h in other.failures.log] != [h.time for h in first.failures.log]


@pytest.mark.parametrize("mtbf", [math.inf, 1_000_000.0])
def test_without_failures_ettr_is_one_and_cost_is_the_fault_free_cost(mtbf):
    trace = jobs_trace(4, 24)
    for policy in (SoloPolicy(), RollMuxPolicy()):
        fault_free = simulate(trace, policy)
        run = simulate(trace, policy, failures=FailureModel(mtbf_hours=mtbf))
        assert run.failures.failures == 0 and run.ettr == 1.0
        assert run.cost_usd == fault_free.cost_usd
        assert run.work_efficiency == fault_free.work_efficiency
        assert run.slo_attainment == fault_free.slo_attainment


def test_standby_is_charged_while_its_pool_holds_a_node():
    # One job for 10 h: one standby per pool costs a rollout and a training node for 10 h.
    trace = jobs_trace(1, 10)
    run = simulate(trace, SoloPolicy(), failures=FailureModel(mtbf_hours=math.inf, standby=1))
    assert run.failures.standby_usd == pytest.approx(10 * PAIR)
    assert run.cost_usd == pytest.approx(simulate(trace, SoloPolicy()).cost_usd + 10 * PAIR)


def single_failure_run(model: FailureModel):
    """Solo, one job held 0-12 h: the first seed whose run has exactly one node failure."""
    trace = jobs_trace(1, 12)
    for seed in range(200):
        run = simulate(trace, SoloPolicy(), failures=replace(model, seed=seed))
        if run.failures.failures == 1:
            return trace, run
    raise AssertionError("no seed gave exactly one failure")


def test_one_failure_is_accounted_exactly_by_hand():
    # Jobs checkpoint every 1,800 s since they started; no standby: a cold restart of 300 s.
    model = FailureModel(mtbf_hours=12, checkpoint_interval_s=1800, downtimes=RecoveryTimes(cold_s=300))
    trace, run = single_failure_run(model)
    (hit,) = run.failures.log
    t = hit.time
    assert hit.kind is Recovery.COLD and run.failures.recoveries[Recovery.COLD] == 1
    downtime = min(300.0, 12 * HOUR - t)
    redo = t % 1800
    assert hit.downtime_s == pytest.approx(downtime) and hit.redo_s == pytest.approx(redo)
    job = run.jobs["j0"]
    assert job.lost_s == pytest.approx(downtime + redo)
    # Alone on its nodes at slowdown 1: every lost second is a second of solo work lost.
    assert job.work_s == pytest.approx(12 * HOUR - downtime - redo)
    assert run.ettr == pytest.approx(1 - (downtime + redo) / (12 * HOUR))
    # Two nodes held for it (rollout + training), no one else on them.
    assert run.failures.wasted_node_s == pytest.approx(2 * (downtime + redo))
    assert run.cost_usd == pytest.approx(simulate(trace, SoloPolicy()).cost_usd)


def test_one_failure_with_standby_and_buddy_loses_only_the_switch():
    model = FailureModel(mtbf_hours=12, standby=1, replicas=True, downtimes=RecoveryTimes(standby_buddy_s=20))
    _, run = single_failure_run(model)
    (hit,) = run.failures.log
    assert hit.kind is Recovery.STANDBY_BUDDY
    assert hit.redo_s == 0 and hit.downtime_s == pytest.approx(min(20.0, 12 * HOUR - hit.time))
    assert run.jobs["j0"].lost_s == pytest.approx(hit.downtime_s)


def test_a_failed_node_interrupts_every_job_seated_on_it():
    # Two balanced jobs that RollMux packs on one rollout and one training node.
    trace = jobs_trace(2, 48)
    run = simulate(trace, RollMuxPolicy(), failures=FailureModel(mtbf_hours=10, seed=1))
    assert run.failures.failures > 0
    assert run.failures.interruptions == 2 * run.failures.failures
    # Each node is split between the two jobs: each job is charged one node's worth.
    lost = sum(h.lost_s for h in run.failures.log)
    assert run.failures.wasted_node_s == pytest.approx(lost * 1.0)


def test_standby_and_buddy_lose_less_than_cold_restarts_on_the_same_failures():
    trace = jobs_trace(8, 72)
    cold = simulate(trace, SoloPolicy(), failures=FailureModel(mtbf_hours=30, seed=2))
    warm = simulate(trace, SoloPolicy(), failures=FailureModel(mtbf_hours=30, standby=2, replicas=True, seed=2))
    # The held nodes' failures do not depend on how they are recovered.
    assert [(h.job, h.time) for h in warm.failures.log] == [(h.job, h.time) for h in cold.failures.log]
    assert cold.failures.recoveries[Recovery.COLD] == cold.failures.failures > 20
    assert warm.failures.recoveries[Recovery.STANDBY_BUDDY] > 0
    assert all(h.downtime_s <= 300 for h in cold.failures.log)
    assert all(h.downtime_s <= (20 if h.kind is Recovery.STANDBY_BUDDY else 300) for h in warm.failures.log)
    assert warm.failures.downtime_s < cold.failures.downtime_s / 5
    assert warm.failures.lost_s < cold.failures.lost_s / 10
    assert warm.ettr > cold.ettr


def test_a_used_standby_is_back_only_after_its_restock_time():
    trace = jobs_trace(8, 72)

    def recoveries(restock_s: float) -> dict[Recovery, int]:
        model = FailureModel(mtbf_hours=30, standby=1, replicas=True, restock_s=restock_s, seed=2)
        return simulate(trace, SoloPolicy(), failures=model).failures.recoveries

    # Restocked at once: every failure finds a standby.
    assert recoveries(0)[Recovery.COLD] == 0
    # Restocked after a day: at most one standby per pool per day, the rest restart cold.
    slow = recoveries(86_400)
    assert slow[Recovery.STANDBY_BUDDY] <= 2 * 3 and slow[Recovery.COLD] > 0


def test_lost_progress_is_zero_with_replicas_and_not_without():
    trace = jobs_trace(8, 72)
    for standby in (0, 1):
        replicated = simulate(trace, SoloPolicy(), failures=FailureModel(30, standby=standby, replicas=True))
        assert replicated.failures.failures > 0 and replicated.failures.redo_s == 0
        assert all(h.redo_s == 0 for h in replicated.failures.log)
    plain = simulate(trace, SoloPolicy(), failures=FailureModel(30, standby=1, replicas=False))
    assert plain.failures.redo_s > 0
    assert plain.failures.recoveries[Recovery.STANDBY_CHECKPOINT] > 0


def test_a_job_whose_copy_has_no_room_redoes_its_progress_and_one_with_a_buddy_does_not():
    # Solo, 1,600 GB usable per training node: a's copy (1,000 GB) goes to c's node, c's
    # (100 GB) to a's; b's fits on no other node and there is no standby.
    jobs = (spec("a", mem=1000), spec("b", mem=1000), spec("c", mem=100))
    trace = Trace(tuple(TraceJob(job, 0, 72 * HOUR) for job in jobs))
    run = simulate(trace, SoloPolicy(), failures=FailureModel(mtbf_hours=10, replicas=True, seed=1))
    account = run.failures
    hits = {name: [h for h in account.log if h.job == name] for name in ("a", "b", "c")}
    assert all(hits.values()) and all(h.kind is Recovery.COLD for h in account.log)
    assert not any(h.replica for h in hits["b"]) and sum(h.redo_s for h in hits["b"]) > 0
    assert all(h.replica and h.redo_s == 0 for h in hits["a"] + hits["c"])
    assert account.redo_s == sum(h.redo_s for h in hits["b"])
    assert account.unreplicated_job_s == pytest.approx(72 * HOUR)


def test_the_jobs_of_one_failed_node_recover_each_on_its_own_terms():
    # RollMux packs a one-node job beside a two-node one: the narrow trainer's copy lives
    # on the wide job's second training node; the wide trainer has none (two shards).
    trace = Trace(
        (TraceJob(spec("wide", slo=2.0, width=2), 0, 72 * HOUR), TraceJob(spec("narrow", slo=2.0), 0, 72 * HOUR))
    )
    model = FailureModel(mtbf_hours=20, standby=1, replicas=True, seed=0)
    run = simulate(trace, RollMuxPolicy(), failures=model)
    account = run.failures
    by_time: dict[float, dict[str, Recovery]] = {}
    for hit in account.log:
        by_time.setdefault(hit.time, {})[hit.job] = hit.kind
    shared = [kinds for kinds in by_time.values() if len(kinds) == 2]
    assert shared and account.interruptions == account.failures + len(shared)
    # One standby per failed node, but each job its own kind when the standby was free.
    assert {"wide": Recovery.STANDBY_CHECKPOINT, "narrow": Recovery.STANDBY_BUDDY} in shared
    assert not any(h.replica for h in account.log if h.job == "wide")
    assert sum(account.recoveries.values()) == account.interruptions
    assert account.unreplicated_job_s == pytest.approx(72 * HOUR)


def test_failure_losses_count_against_the_slo():
    # A job whose SLO leaves no slack misses it once a failure costs it any time.
    tight = Trace((TraceJob(spec("a", slo=1.0), 0, 24 * HOUR),))
    run = simulate(tight, SoloPolicy(), failures=FailureModel(mtbf_hours=5, seed=0))
    assert run.failures.failures > 0
    assert run.jobs["a"].slowdown > 1.0 and not run.jobs["a"].met_slo
    assert run.slo_attainment == 0.0


@pytest.mark.parametrize(
    "fields",
    [
        {"mtbf_hours": 0},
        {"mtbf_hours": -5},
        {"mtbf_hours": 2e6},
        {"mtbf_hours": math.nan},
        {"mtbf_hours": 100, "standby": -1},
        {"mtbf_hours": 100, "standby": 101},
        {"mtbf_hours": 100, "checkpoint_interval_s": 0},
        {"mtbf_hours": 100, "restock_s": -1},
        {"mtbf_hours": 100, "downtimes": RecoveryTimes(cold_s=1e9)},
    ],
)
def test_absurd_models_are_refused(fields):
    with pytest.raises(ValueError, match="must be in"):
        FailureModel(**fields)


job_windows = st.lists(
    st.tuples(
        st.floats(0, 50 * HOUR),
        st.floats(600, 40 * HOUR),
        st.floats(10, 500),
        st.floats(10, 500),
        st.floats(1.0, 2.0),
    ),
    min_size=1,
    max_size=6,
)


@settings(max_examples=40, deadline=None)
@given(
    windows=job_windows,
    mtbf=st.floats(1, 500),
    standby=st.integers(0, 3),
    replicas=st.booleans(),
    checkpoint=st.floats(60, 7200),
    seed=st.integers(0, 10),
)
def test_ettr_is_a_ratio_and_standby_only_adds_cost(windows, mtbf, standby, replicas, checkpoint, seed):
    jobs = sorted(
        (
            TraceJob(spec(f"j{k}", rollout, train, slo), start, start + length)
            for k, (start, length, rollout, train, slo) in enumerate(windows)
        ),
        key=lambda j: j.arrival,
    )
    trace = Trace(tuple(jobs))
    model = FailureModel(mtbf, standby=standby, replicas=replicas, checkpoint_interval_s=checkpoint, seed=seed)
    for policy in (SoloPolicy(), RollMuxPolicy()):
        fault_free = simulate(trace, policy)
        run = simulate(trace, policy, failures=model)
        assert 0.0 <= run.ettr <= 1.0
        for name, job in run.jobs.items():
            assert 0.0 <= job.lost_s <= job.seconds + 1e-6
            # Failures never make a job look faster.
            if job.lost_s > 0:
                assert job.slowdown > fault_free.jobs[name].slowdown
        account = run.failures
        assert account.interruptions == sum(account.recoveries.values())
        assert account.wasted_node_s >= 0 and account.standby_usd >= 0
        # Without regrouping, failures change no placement: the cost is the fault-free
        # cost plus the standby nodes, never less.
        assert run.cost_usd == pytest.approx(fault_free.cost_usd + account.standby_usd)
        assert run.cost_usd >= fault_free.cost_usd
        assert run.work_efficiency <= fault_free.work_efficiency + 1e-12
        # Nothing is redone from a replica; a replica is there only when asked for.
        assert all(h.redo_s == 0 for h in account.log if h.replica)
        assert replicas or not any(h.replica for h in account.log)
        assert all(h.replica == (h.kind is Recovery.STANDBY_BUDDY) for h in account.log if h.kind is not Recovery.COLD)
        if not replicas:
            assert account.unreplicated_job_s == 0


@pytest.fixture(scope="module")
def small_trace(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("traces") / "small.jsonl"
    write_jsonl(generate(TraceShape(jobs=30, mix="production", arrivals="uniform", seed=0)), path)
    return path


def test_compare_reports_failures_next_to_fault_free(small_trace):
    from rollmux.inputs.trace import read_trace, uniform_slo

    trace = read_trace(small_trace, None, uniform_slo(1.2, 1.5, 0))
    model = FailureModel(mtbf_hours=50, standby=1, replicas=True)
    result = compare(trace, ["rollmux", "solo"], failures=model)
    assert set(result.with_failures) == {"rollmux", "solo"}
    report = result.to_json()["failures"]
    assert report["model"]["mtbf_hours"] == 50
    rollmux = report["policies"]["rollmux"]
    assert rollmux["fault_free_cost_usd"] == result.results["rollmux"].cost_usd
    assert rollmux["cost_usd"] > rollmux["fault_free_cost_usd"]
    assert len(rollmux["log"]) == rollmux["interruptions"] == sum(rollmux["recoveries"].values())
    assert 0 <= rollmux["unreplicated_job_hours"] <= sum(j.departure - j.arrival for j in trace.jobs) / HOUR
    assert "failures" not in compare(trace, ["solo"]).to_json()


def test_simulate_command_prints_failure_table_and_json(small_trace, tmp_path):
    out = tmp_path / "res.json"
    args = ["simulate", str(small_trace), "--policies", "rollmux,solo", "--no-regroup", "--json", str(out)]
    result = CliRunner().invoke(app, [*args, "--mtbf-hours", "50", "--standby", "1", "--downtime-cold-s", "400"])
    assert result.exit_code == 0, result.output
    assert "node failures: MTBF 50 h/node, 1 standby/pool, replicas on" in result.output
    assert "ETTR" in result.output and "stby+buddy" in result.output
    assert "jobs without a replica (no room on another training node or a standby): rollmux=" in result.output
    failures = json.loads(out.read_text())["failures"]
    assert failures["model"]["downtimes"]["cold_s"] == 400 and failures["model"]["replicas"] is True
    assert 0 < failures["policies"]["rollmux"]["ettr"] <= 1


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--mtbf-hours", "0"], "--mtbf-hours"),
        (["--mtbf-hours", "-3"], "--mtbf-hours"),
        (["--mtbf-hours", "1e9"], "--mtbf-hours"),
        (["--mtbf-hours", "100", "--standby", "-1"], "--standby"),
        (["--mtbf-hours", "100", "--standby", "5000"], "--standby"),
        (["--mtbf-hours", "100", "--downtime-cold-s", "1e7"], "--downtime-cold-s"),
        (["--standby", "1"], "--standby needs --mtbf-hours"),
        (["--no-replicas"], "--replicas needs --mtbf-hours"),
    ],
)
def test_simulate_command_refuses_bad_failure_options(small_trace, extra, message):
    result = CliRunner().invoke(app, ["simulate", str(small_trace), "--policies", "solo", *extra])
    assert result.exit_code == 2
    assert message in result.output
