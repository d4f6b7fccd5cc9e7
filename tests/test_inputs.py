"""Traces, profiles and job files: good input parses, bad input is named precisely."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rollmux.cli.main import app
from rollmux.inputs.errors import InputError
from rollmux.inputs.jobfile import load_job_file
from rollmux.inputs.trace import load_profile, read_trace, uniform_slo

DATA = Path(__file__).resolve().parents[1] / "data" / "traces"
PROFILE = DATA / "production-profile.json"
GOOD_LINES = [
    "job0, 2025-07-30 15:33:33, 1, 14B_8k",
    "job1, 2025-07-30 15:40:14, +1, 32B_8k",
    "job0, 2025-07-30 18:00:00, -1, 14B_8k",
]
runner = CliRunner()


def write(tmp_path: Path, name: str, lines: list[str]) -> Path:
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n")
    return path


def test_production_trace_parses_into_jobs_with_catalogue_widths(tmp_path):
    trace = read_trace(write(tmp_path, "t.trace", GOOD_LINES), load_profile(PROFILE), uniform_slo(1.2, 1.5, 0))
    by_name = {j.spec.name: j for j in trace.jobs}
    assert by_name["job0"].departure - by_name["job0"].arrival == pytest.approx(8787)
    assert by_name["job1"].departure == by_name["job0"].departure  # still running at the end
    assert by_name["job1"].spec.rollout_width == 2 and by_name["job0"].spec.rollout_width == 1
    assert all(1.2 <= j.spec.slo <= 1.5 for j in trace.jobs)


def test_shipped_production_trace_has_200_jobs():
    trace = read_trace(DATA / "production-200jobs.trace", load_profile(PROFILE), uniform_slo(1.2, 1.5, 0))
    assert len(trace.jobs) == 200
    assert all(j.departure >= j.arrival for j in trace.jobs)


BAD_PRODUCTION = [
    (["job0, 2025-07-30 15:33:33, 1"], 1, None, "4 comma-separated"),
    (["job0, 2025-07-30 15:33:33, 1, 99B_8k"], 1, "type", "unknown job type"),
    (["job0, 2025-07-30 15:33:33, -1, 14B_8k"], 1, "event", "without an earlier arrival"),
    ([GOOD_LINES[0], "job1, 2025-07-30 15:00:00, 1, 14B_8k"], 2, "time", "backwards"),
    (["job0, yesterday, 1, 14B_8k"], 1, "time", "YYYY-MM-DD"),
    (["job0, 2025-07-30 15:33:33, 2, 14B_8k"], 1, "event", "+1, 1 or -1"),
]


@pytest.mark.parametrize(("lines", "line", "field", "reason"), BAD_PRODUCTION)
def test_bad_production_lines_are_named(tmp_path, lines, line, field, reason):
    path = write(tmp_path, "bad.trace", lines)
    with pytest.raises(InputError) as caught:
        read_trace(path, load_profile(PROFILE), uniform_slo(1.2, 1.5, 0))
    assert (caught.value.line, caught.value.field) == (line, field)
    assert reason in caught.value.reason


def record(**overrides) -> str:
    base = {"id": "a", "arrival_s": 0, "duration_s": 3600, "rollout_s": 100, "train_s": 80, "slo": 1.3}
    base.update(overrides)
    return json.dumps({k: v for k, v in base.items() if v is not None})


BAD_JSONL = [
    ([record(slo=0.9)], 1, "slo", "greater than or equal to 1"),
    ([record(rollout_s=-5)], 1, "rollout_s", "greater than or equal to 0"),
    ([record(), record(id="b", arrival_s=-1)], 2, "arrival_s", "greater than or equal to 0"),
    ([record(), "{not json"], 2, None, "not valid JSON"),
    ([record(departure_s=10)], 1, None, "exactly one of departure_s and duration_s"),
    ([record(id="../etc")], 1, "id", "pattern"),
    ([record(id="b", arrival_s=50), record(id="c", arrival_s=10)], 2, "arrival_s", "backwards"),
    ([record(gpu_type="h100")], 1, "gpu_type", "Extra inputs"),
]


@pytest.mark.parametrize(("lines", "line", "field", "reason"), BAD_JSONL)
def test_bad_jsonl_records_are_named(tmp_path, lines, line, field, reason):
    with pytest.raises(InputError) as caught:
        read_trace(write(tmp_path, "jobs.jsonl", lines), None, uniform_slo(1.2, 1.5, 0))
    assert (caught.value.line, caught.value.field) == (line, field)
    assert reason in caught.value.reason


def test_csv_trace_with_explicit_times(tmp_path):
    path = write(
        tmp_path,
        "jobs.csv",
        [
            "id,arrival_s,departure_s,rollout_s,train_s,rollout_width,train_width,slo",
            "a,0,100,10,10,1,1,1.5",
            "b,5,50,20,10,2,2,",
        ],
    )
    trace = read_trace(path, None, uniform_slo(1.2, 1.2, 0))
    assert [j.spec.slo for j in trace.jobs] == [1.5, 1.2]
    assert trace.jobs[1].spec.train_width == 2


def test_csv_errors_name_the_row(tmp_path):
    path = write(tmp_path, "jobs.csv", ["id,arrival_s,duration_s,rollout_s,train_s", "a,0,100,10,10", "b,5,100,ten,10"])
    with pytest.raises(InputError) as caught:
        read_trace(path, None, uniform_slo(1.2, 1.5, 0))
    assert (caught.value.line, caught.value.field) == (3, "rollout_s")


def test_job_file_errors_point_at_the_yaml_line(tmp_path):
    path = write(
        tmp_path, "jobs.yaml", ["jobs:", "  - name: a", "    rollout_s: 10", "    train_s: 10", "    slo: 0.5"]
    )
    with pytest.raises(InputError) as caught:
        load_job_file(path)
    assert (caught.value.line, caught.value.field) == (5, "jobs.0.slo")


def test_cli_reports_bad_input_in_one_line_with_exit_code_2(tmp_path):
    path = write(tmp_path, "bad.trace", ["job0, 2025-07-30 15:33:33, -1, 14B_8k"])
    result = runner.invoke(app, ["simulate", str(path), "--profile", str(PROFILE), "--json", str(tmp_path / "o.json")])
    assert result.exit_code == 2
    assert f"{path}:1: field 'event'" in result.output
    assert "Traceback" not in result.output
    assert not (tmp_path / "o.json").exists()


def test_installed_command_exits_2_without_traceback(tmp_path):
    path = write(tmp_path, "jobs.jsonl", [record(slo=0.5)])
    done = subprocess.run(
        [sys.executable, "-m", "rollmux.cli.main", "simulate", str(path)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 2
    assert "field 'slo'" in done.stderr and "Traceback" not in done.stderr


def test_unknown_policy_is_refused(tmp_path):
    result = runner.invoke(
        app,
        ["simulate", str(DATA / "production-200jobs.trace"), "--profile", str(PROFILE), "--policies", "rollmux,magic"],
    )
    assert result.exit_code == 2 and "magic" in result.output
