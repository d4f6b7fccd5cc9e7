"""The trace simulator: exact integrals on hand-made traces, and the production result."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rollmux.cli.main import app, estimated_line
from rollmux.core.placement import RandomPolicy, RollMuxPolicy, SoloPolicy
from rollmux.core.regroup import RegroupConfig
from rollmux.core.spec import CostModel, JobSpec, PhaseTime, Pool
from rollmux.inputs.trace import Trace, TraceJob, load_profile, read_trace, uniform_slo
from rollmux.sim.compare import compare
from rollmux.sim.generate import TraceShape, generate
from rollmux.sim.simulator import fluid_lower_bound_usd, simulate

DATA = Path(__file__).resolve().parents[1] / "data" / "traces"
COST = CostModel()
PAIR = COST.price(Pool.ROLLOUT) + COST.price(Pool.TRAIN)


def spec(name: str, rollout: float, train: float, slo: float = 1.5) -> JobSpec:
    return JobSpec(
        name,
        PhaseTime.fixed(rollout),
        PhaseTime.fixed(train),
        slo,
        colocated=(PhaseTime.fixed(rollout), PhaseTime.fixed(train)),
    )


def two_overlapping_jobs() -> Trace:
    # a: hours 0-2, b: hours 1-3; both balanced, so RollMux packs b next to a.
    return Trace((TraceJob(spec("a", 100, 100), 0, 7200), TraceJob(spec("b", 100, 100), 3600, 10800)))


def test_solo_cost_is_the_nodes_held_times_their_price():
    result = simulate(two_overlapping_jobs(), SoloPolicy())
    assert result.cost_usd == pytest.approx(4 * PAIR)
    assert result.cost_node_hours == pytest.approx(8)
    assert result.pools[Pool.TRAIN].peak_nodes == 2


def test_rollmux_charges_one_pair_while_jobs_share_it():
    result = simulate(two_overlapping_jobs(), RollMuxPolicy())
    # hour 0-1: a alone; 1-2: a and b on one pair; 2-3: b alone on the same pair.
    assert result.cost_usd == pytest.approx(3 * PAIR)
    assert result.slo_attainment == 1.0
    assert result.summary()["mean_slowdown"] == pytest.approx(1.0)


def test_busy_fractions_are_exact():
    result = simulate(two_overlapping_jobs(), SoloPolicy())
    summary = result.summary()
    assert summary["rollout_busy_fraction"] == pytest.approx(0.5)
    assert summary["train_busy_fraction"] == pytest.approx(0.5)


def test_slowdown_outside_the_slo_is_counted_as_a_miss():
    tight = Trace((TraceJob(spec("a", 100, 100, slo=1.0), 0, 3600), TraceJob(spec("b", 150, 50, slo=1.0), 0, 3600)))
    attained = [simulate(tight, RandomPolicy(seed=s)).slo_attainment for s in range(10)]
    # Some seed packs the two on one rollout node: 250 s of rollout per 200 s iteration.
    assert min(attained) == 0.0
    assert simulate(tight, RollMuxPolicy()).slo_attainment == 1.0


def test_fluid_bound_holds_each_job_at_its_average_demand():
    trace = Trace((TraceJob(spec("a", 100, 100, slo=2.0), 0, 3600),))
    assert fluid_lower_bound_usd(trace) == pytest.approx(PAIR / 4)


@pytest.fixture(scope="module")
def production():
    trace = read_trace(
        DATA / "production-200jobs.trace", load_profile(DATA / "production-profile.json"), uniform_slo(1.2, 1.5, 0)
    )
    return compare(trace, ["rollmux", "solo", "colocated", "random"], seed=0)


def test_production_trace_meets_the_online_placement_bar(production):
    assert production.cost_ratio("solo") >= 1.5
    assert production.cost_ratio("colocated") >= 1.13
    assert production.results["rollmux"].slo_attainment == 1.0


def test_production_fluid_bound_is_below_every_slo_keeping_policy(production):
    for name in ("rollmux", "solo", "colocated"):
        assert production.results[name].cost_usd > production.fluid_usd
    assert 2.7 <= production.results["solo"].cost_usd / production.fluid_usd <= 3.0


def simulate_to_json(out: Path):
    """The CLI on the production trace, online placement only (fast), writing ``out``."""
    arguments = ["simulate", str(DATA / "production-200jobs.trace"), "--profile", str(DATA / "production-profile.json")]
    return CliRunner().invoke(app, [*arguments, "--policies", "rollmux,solo", "--no-regroup", "--json", str(out)])


def test_simulate_command_writes_json_and_picture(tmp_path):
    out = tmp_path / "res.json"
    result = simulate_to_json(out)
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    for key in ("cost_node_hours", "cost_usd", "work_efficiency", "slo_attainment", "mean_slowdown", "p99_slowdown"):
        assert key in report["policies"]["rollmux"]
    assert report["ratios"]["solo"]["cost_over_rollmux"] > 1
    picture = tmp_path / "res-cost-rate.png"
    assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plan_command_prints_groups():
    result = CliRunner().invoke(app, ["plan", str(Path(__file__).resolve().parents[1] / "examples" / "jobs.yaml")])
    assert result.exit_code == 0, result.output
    assert "co-execution groups" in result.output and "math-7b" in result.output


def test_regrouping_beats_the_published_ratio_with_migrations_charged():
    trace = read_trace(
        DATA / "production-200jobs.trace", load_profile(DATA / "production-profile.json"), uniform_slo(1.2, 1.5, 0)
    )
    solo = simulate(trace, SoloPolicy())
    regrouped = simulate(trace, RollMuxPolicy(), regroup=RegroupConfig())
    assert regrouped.migrations > 0 and regrouped.migration_usd > 0
    assert solo.cost_usd / regrouped.cost_usd >= 1.84
    assert regrouped.slo_attainment == 1.0


def test_report_renders_every_picture_from_simulate_json(tmp_path):
    results = tmp_path / "res.json"
    runner = CliRunner()
    simulated = simulate_to_json(results)
    assert simulated.exit_code == 0, simulated.output
    rendered = runner.invoke(app, ["report", str(results), "--out", str(tmp_path / "report")])
    assert rendered.exit_code == 0, rendered.output
    page = (tmp_path / "report" / "index.html").read_text()
    for picture in ("cost-rate.png", "nodes.png", "busy.png", "slowdown-cdf.png", "group-gantt.png"):
        assert f"src='{picture}'" in page
        assert (tmp_path / "report" / picture).read_bytes()[:4] == b"\x89PNG"


def test_report_refuses_a_file_that_is_not_a_result(tmp_path):
    bogus = tmp_path / "bogus.json"
    bogus.write_text('{"policies": {}}')
    result = CliRunner().invoke(app, ["report", str(bogus)])
    assert result.exit_code == 2 and "not a `rollmux simulate --json` result" in result.output


def test_jobs_leaving_together_are_not_regrouped_between_their_departures(monkeypatch):
    """A window's jobs all leave at its end: one regrouping after the last of them, none in
    between (re-placing jobs that leave the same instant would charge moves for nothing)."""
    from rollmux.live.replay import window
    from rollmux.sim import simulator

    seen: list[int] = []
    regroup = simulator._regroup
    monkeypatch.setattr(
        simulator, "_regroup", lambda cluster, *args: (seen.append(len(list(cluster.jobs()))), regroup(cluster, *args))
    )
    trace = read_trace(
        DATA / "production-200jobs.trace", load_profile(DATA / "production-profile.json"), uniform_slo(1.2, 1.5, 0)
    )
    three_hours = window(trace, 0, 3)
    leaving_at_end = sum(job.departure == 3 * 3600 for job in three_hours.jobs)
    simulate(three_hours, RollMuxPolicy(), regroup=RegroupConfig())
    assert leaving_at_end > 1 and seen[-1] == 0 and seen[-2] == leaving_at_end


def test_jobs_run_co_located_on_estimated_times_are_named_with_their_hours():
    # Issue 27: without co-located times RollMux co-located jobs on the estimate and said nothing.
    generated = generate(TraceShape(jobs=40, mix="training-heavy", arrivals="uniform", seed=3))
    trace = Trace(tuple(replace(j, spec=replace(j.spec, colocated=None)) for j in generated.jobs))
    result = simulate(trace, RollMuxPolicy(), regroup=RegroupConfig())
    estimated = result.estimated_jobs()
    assert estimated, "the mix should co-locate some jobs (else this test checks nothing)"
    assert set(estimated) == {name for name, a in result.jobs.items() if a.colocated_s > 0}
    summary = result.summary()
    assert summary["estimated_colocated_jobs"] == len(estimated)
    assert summary["estimated_colocated_job_hours"] == pytest.approx(summary["colocated_job_hours"])
    line = estimated_line(result)
    assert f"{len(estimated)} jobs ran co-located on estimated times" in line and "1.98 x rollout" in line


def test_the_move_horizon_option_reaches_regrouping_and_a_zero_horizon_is_refused(monkeypatch):
    seen: list[RegroupConfig | None] = []

    def record(*args, regroup=None, **kwargs):
        seen.append(regroup)
        raise SystemExit(0)

    monkeypatch.setattr("rollmux.sim.compare.compare", record)
    arguments = ["simulate", str(DATA / "production-200jobs.trace"), "--profile", str(DATA / "production-profile.json")]
    assert CliRunner().invoke(app, [*arguments, "--move-horizon-hours", "8"]).exit_code == 0
    assert seen[0] is not None and seen[0].horizon_s == 8 * 3600
    refused = CliRunner().invoke(app, [*arguments, "--move-horizon-hours", "0"])
    assert refused.exit_code == 2 and "--move-horizon-hours" in refused.output
