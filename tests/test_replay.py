"""A window of the production trace replayed on the live system, regrouping on, agrees
with the simulator's run of the same window: cost, slowdowns, SLOs, the jobs moved (each
move's pause recorded), and no node runs two jobs."""

from __future__ import annotations

import json

import ray
from typer.testing import CliRunner

from rollmux.cli.main import app

runner = CliRunner()
TRACE = ["data/traces/production-200jobs.trace", "--profile", "data/traces/production-profile.json"]


def test_a_window_of_the_trace_replayed_live_costs_what_the_simulator_says(tmp_path):
    out = tmp_path / "replay.json"
    arguments = ["replay", *TRACE, "--time-scale", "150", "--window", "0", "6"]
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
