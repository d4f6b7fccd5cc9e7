"""A window of the production trace replayed on the live system, regrouping on, agrees
with the simulator's run of the same window: cost, slowdowns, SLOs, the jobs moved (each
move's pause recorded), and no node runs two jobs; and the virtual-clock host, fed the
live run's measured times, makes the very same placements, re-seats and moves."""

from __future__ import annotations

import json

import pytest
import ray
from typer.testing import CliRunner

from rollmux.cli.main import app
from rollmux.inputs.trace import Trace
from rollmux.live import replay

runner = CliRunner()
TRACE = ["data/traces/production-200jobs.trace", "--profile", "data/traces/production-profile.json"]


@pytest.mark.slow  # 2 minutes alone, and its SLO figure needs the cores: bench/scenarios.py runs it
def test_a_window_of_the_trace_replayed_live_costs_what_the_simulator_says_and_decides_as_the_virtual_clock(tmp_path):
    out = tmp_path / "replay.json"
    arguments = ["replay", *TRACE, "--time-scale", "150", "--window", "0", "3"]
    try:
        result = runner.invoke(app, [*arguments, "--mib-per-gb", "0.05", "--json", str(out), "--out", str(tmp_path)])
    finally:
        ray.shutdown()
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    realised, simulated = report["realised"], report["simulated"]
    assert abs(realised["cost_usd"] / simulated["cost_usd"] - 1) <= 0.05
    assert realised["slo_attainment"] >= 0.99 and report["overlaps"] == []
    assert abs(realised["mean_slowdown"] / simulated["mean_slowdown"] - 1) <= 0.05
    assert realised["migrations"] >= 1 and simulated["migrations"] >= 1
    assert all(m["outcome"] == "moved" and m["pause_s"] > 0 for m in realised["moves"])
    assert realised["driver_processes"] < report["jobs"]  # emulated jobs' drivers share warm processes
    assert (tmp_path / "timeline.json").exists() and (tmp_path / "cost-rate.png").exists()
    decided = report["decisions"]
    assert decided["same"], decided["first_divergence"]
    assert abs(realised["cost_usd"] / decided["virtual_clock"]["cost_usd"] - 1) <= 0.03
    assert decided["live_by_kind"]["moving"] == realised["migrations"] >= 1 and decided["live_by_kind"]["placed"] >= 8
    assert "decisions: live" in result.output and "the same sequence" in result.output


def test_a_kill_is_charged_to_each_job_it_interrupted_from_the_logs():
    """The kill at t=10 on node 3 (group of a and b): a notices at once and works again at
    12, resuming at iteration 4 after 5 trained (one lost); b trains a step elsewhere, notices
    at 11, resumes at 5 having trained 5 (none lost); c was not on the node."""

    def train(job: str, iteration: int, ended: float) -> dict:
        return {"job": job, "phase": "train", "iteration": iteration, "outcome": "released", "ended_at": ended,
                "granted_at": ended - 0.5, "nodes": [3]}  # fmt: skip

    def lost_at(at: float) -> dict:
        return {"kind": "lost", "at": at, "detail": ""}

    log = replay.ReplayLog(began=0.0, ended=30.0)
    log.kills = [replay.Kill(at=10.0, node=3, pool="train", pid=1, jobs=("a", "b", "c"))]
    log.phase_log = [
        *(train("a", i, 1.0 + i) for i in range(5)),
        *(train("b", i, 1.5 + i) for i in range(4)),
        train("b", 4, 10.5),
        {**train("a", 4, 13.0), "phase": "rollout", "granted_at": 12.0},
        {**train("b", 5, 14.0), "phase": "rollout", "granted_at": 13.5},
    ]
    log.events = {
        "a": [
            {"kind": "lost", "at": 10.0, "detail": ""},
            {"kind": "running", "at": 11.5, "detail": "from iteration 4"},
        ],
        "b": [
            {"kind": "lost", "at": 11.0, "detail": ""},
            {"kind": "running", "at": 13.0, "detail": "from iteration 5"},
        ],
        "c": [],
    }
    found = replay.realised(Trace(()), log, replay.ReplayOptions(time_scale=100.0))
    by_job = {r["job"]: r for r in found["recoveries"]}
    assert set(by_job) == {"a", "b"} and found["kills"] == 1
    assert (by_job["a"]["steps_lost"], by_job["a"]["downtime_s"], by_job["a"]["recovery_s"]) == (1, 2.0, 2.0)
    assert (by_job["b"]["steps_lost"], by_job["b"]["detected_s"], by_job["b"]["downtime_s"]) == (0, 1.0, 3.5)
    assert by_job["a"]["downtime_trace_s"] == 200.0 and found["recovery_steps_lost"] == 1


def test_a_second_replay_into_the_same_folder_is_refused_before_it_touches_anything(tmp_path):
    from rollmux.cli.replay import sole_writer

    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "rollmux.db").write_text("the first replay's control plane")
    with sole_writer(tmp_path):
        result = runner.invoke(
            app, ["replay", *TRACE, "--time-scale", "150", "--window", "0", "1", "--out", str(tmp_path)]
        )
    assert result.exit_code == 2
    assert "another replay (pid " in result.output and "pass another --out" in result.output
    assert (tmp_path / "state" / "rollmux.db").read_text() == "the first replay's control plane"
