"""``rollmux run`` end to end on local Ray, and its input validation."""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
import ray
from rich.console import Console
from typer.testing import CliRunner

from rollmux.cli.main import app
from rollmux.cli.run import live_table
from rollmux.core.turns import PhaseRecord
from rollmux.inputs.entrypoints import check_entrypoints
from rollmux.inputs.errors import InputError
from rollmux.inputs.runfile import load_run_file
from rollmux.jobs.grpo import GRPOConfig, run_alone
from rollmux.live.launch import realised_slowdowns
from rollmux.report.timeline import reward_curves, reward_label, reward_limits
from rollmux.service.lock import acquire_writer_lock
from rollmux.service.store import Store, default_url

runner = CliRunner()
TINY = """
cluster: {rollout_nodes: 1, train_nodes: 1}
jobs:
  - name: a
    iterations: 3
    slo: 2.0
    grpo: {prompts_per_iteration: 32, train_groups: 16}
  - name: b
    iterations: 3
    slo: 2.0
    grpo: {seed: 1, prompts_per_iteration: 32, train_groups: 16}
"""


def first_run(tmp_path, text: str) -> tuple[Path, Path]:
    """Write ``text`` as a run file and run it to its end; the file and the output folder."""
    example, out = tmp_path / "run.yaml", tmp_path / "out"
    example.write_text(text)
    result = runner.invoke(app, ["run", str(example), "--out", str(out)])
    assert result.exit_code == 0, result.output
    return example, out


def test_run_writes_trace_gantt_and_reward_curves_and_a_second_run_reports_done(tmp_path):
    try:
        example, out = first_run(tmp_path, TINY)
        trace = json.loads((out / "timeline.json").read_text())
        slices = [e for e in trace["traceEvents"] if e["ph"] == "X" and e["cat"] in ("rollout", "train")]
        assert len(slices) == 2 * 2 * 3  # two jobs, two phases, three iterations, one node each
        first = json.loads((out / "run.json").read_text())
        assert [len(first["histories"][j]) for j in ("a", "b")] == [3, 3]
        assert (out / "state" / "checkpoints" / "a.pt").exists() and (out / "state" / "checkpoints" / "b.pt").exists()
        for picture in ("gantt.png", "rewards.png"):
            assert (out / picture).read_bytes()[:4] == b"\x89PNG"

        again = runner.invoke(app, ["run", str(example), "--out", str(out)])
        assert again.exit_code == 0, again.output
        second = json.loads((out / "run.json").read_text())
        assert second["histories"] == first["histories"] and second["phase_log"] == first["phase_log"]
        assert {j["state"] for j in second["jobs"].values()} == {"done"}

        example.write_text(TINY.replace("iterations: 3", "iterations: 4", 1))
        changed = runner.invoke(app, ["run", str(example), "--out", str(out)])
        assert changed.exit_code == 2 and "already submitted with another spec" in changed.output
    finally:
        ray.shutdown()


CO_LOCATED = """
policy: colocated
cluster: {rollout_nodes: 1, train_nodes: 2}
jobs:
  - name: a
    iterations: 3
    slo: 2.0
    colo_rollout_s: 1.0
    colo_train_s: 1.0
    grpo: {seed: 1, prompts_per_iteration: 32, train_groups: 16}
  - name: b
    iterations: 3
    slo: 2.0
    colo_rollout_s: 1.0
    colo_train_s: 1.0
    grpo: {seed: 2, prompts_per_iteration: 32, train_groups: 16}
"""


def test_jobs_seated_co_located_train_as_they_would_alone(tmp_path):
    """Each job's rollout sits beside its trainer and keeps no copy of its own: parked
    without weights, it gets its trainer's at every wake, and its losses and rewards are
    those of the job trained alone."""
    try:
        _, out = first_run(tmp_path, CO_LOCATED)
        ran = json.loads((out / "run.json").read_text())
        for name, seed in (("a", 1), ("b", 2)):
            job = ran["jobs"][name]
            assert job["rollout_nodes"] == job["train_nodes"], job
            alone = run_alone(GRPOConfig(seed=seed, prompts_per_iteration=32, train_groups=16), 3)
            served = [(m["loss"], m["reward"]) for m in ran["histories"][name]]
            assert served == [(m["loss"], m["reward"]) for m in alone], name
    finally:
        ray.shutdown()


@pytest.mark.parametrize(
    ("text", "line", "field"),
    [
        ("jobs:\n  - name: a\n    iterations: 3\n    kind: ppo\n", 4, "jobs.0.kind"),
        ("jobs:\n  - name: a\n    iterations: 0\n", 3, "jobs.0.iterations"),
        ("jobs:\n  - name: a\n    iterations: 3\n    grpo: {d_model: 30, heads: 4}\n", 4, "jobs.0.grpo"),
        ("policy: fastest\njobs:\n  - name: a\n    iterations: 3\n", 1, "policy"),
        ("jobs:\n  - name: a b\n    iterations: 3\n", 2, "jobs.0.name"),
    ],
)
def test_bad_run_files_are_named(tmp_path, text, line, field):
    path = tmp_path / "run.yaml"
    path.write_text(text)
    with pytest.raises(InputError) as caught:
        load_run_file(path)
    assert (caught.value.line, caught.value.field) == (line, field)


def test_run_command_refuses_bad_files_with_exit_code_2(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("jobs: []\n")
    result = runner.invoke(app, ["run", str(path), "--out", str(tmp_path / "out")])
    assert result.exit_code == 2 and "field 'jobs'" in result.output
    assert not (tmp_path / "out").exists()


def test_a_file_nested_too_deeply_is_refused_with_exit_code_2(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("jobs:\n  - name: a\n    iterations: 1\n    args: " + "[" * 3000 + "]" * 3000 + "\n")
    result = runner.invoke(app, ["run", str(path), "--out", str(tmp_path / "out")])
    assert result.exit_code == 2 and "nested too deeply" in result.output


def test_fresh_refuses_a_state_that_a_control_plane_serves(tmp_path):
    """Another run may have taken this folder's state over: --fresh must not delete its store."""
    out, spec = tmp_path / "out", tmp_path / "run.yaml"
    (out / "state").mkdir(parents=True)
    spec.write_text(TINY)
    lock = acquire_writer_lock(Store(default_url(out / "state")).engine, "http://127.0.0.1:9")
    try:
        result = runner.invoke(app, ["run", str(spec), "--out", str(out), "--fresh"])
    finally:
        lock.release()
    assert result.exit_code == 2 and "in use by another rollmux control plane" in result.output, result.output
    assert (out / "state" / "rollmux.db").exists()


@pytest.mark.slow  # a long live scenario: bench/scenarios.py runs it
def test_an_interrupted_run_stops_cleanly_and_the_next_one_resumes(tmp_path):
    example = tmp_path / "run.yaml"
    example.write_text(TINY.replace("iterations: 3", "iterations: 20"))
    out = tmp_path / "out"
    command = [sys.executable, "-m", "rollmux.cli.main", "run", str(example), "--out", str(out)]

    # Ctrl-C as at a terminal: a SIGINT ignored by this test process (as Ray may leave it)
    # would be inherited, and Python then never raises KeyboardInterrupt in the run.
    def interruptible() -> None:
        signal.signal(signal.SIGINT, signal.SIG_DFL)

    run = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, preexec_fn=interruptible)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and iterations(out) < 2:
        time.sleep(0.05)
    run.send_signal(signal.SIGINT)
    _, errors = run.communicate(timeout=120)
    told = f"exit {run.returncode} at iteration {iterations(out)}: {errors.decode(errors='replace')[-2000:]}"
    assert run.returncode == 130 and b"run the same command again" in errors and b"Traceback" not in errors, told
    assert 2 <= iterations(out) < 20

    again = runner.invoke(app, ["run", str(example), "--out", str(out)])
    ray.shutdown()
    assert again.exit_code == 0, again.output
    jobs = json.loads((out / "run.json").read_text())["jobs"]
    assert {(j["state"], j["iterations"], j["restarts"]) for j in jobs.values()} == {("done", 20, 0)}


def iterations(out) -> int:
    """Iterations the interrupted run's control plane has committed, for its least advanced job."""
    database = out / "state" / "rollmux.db"
    if not database.exists():
        return 0
    try:
        with sqlite3.connect(database) as connection:
            rows = connection.execute("SELECT iteration FROM jobs").fetchall()
    except sqlite3.OperationalError:  # the control plane is still creating its tables
        return 0
    return min((r[0] for r in rows), default=0) if len(rows) == 2 else 0


def write_job_package(folder: Path) -> None:
    """A user's package ``myjobs`` with one job module, as the TRL tutorial writes it."""
    (folder / "myjobs").mkdir(parents=True)
    (folder / "myjobs" / "__init__.py").write_text("")
    module = "from rollmux.jobs.trl_grpo import TRLJob\n\n\nclass MyJob(TRLJob):\n    pass\n"
    (folder / "myjobs" / "grpo_job.py").write_text(module)


USERS_JOB = "jobs:\n  - name: mine\n    iterations: 2\n    slo: 2.0\n    entrypoint: myjobs.grpo_job:{}.from_context\n"


def test_an_entrypoint_the_run_cannot_import_is_refused_before_any_job_starts(tmp_path, monkeypatch):
    code, elsewhere = tmp_path / "code", tmp_path / "elsewhere"
    write_job_package(code)
    elsewhere.mkdir()
    spec = code / "run.yaml"
    spec.write_text(USERS_JOB.format("MyJob"))
    monkeypatch.delenv("PYTHONPATH", raising=False)
    monkeypatch.chdir(elsewhere)
    refused = runner.invoke(app, ["run", str(spec), "--out", str(tmp_path / "out")])
    assert refused.exit_code == 2, refused.output
    said = " ".join(refused.output.split())
    assert f"{spec}:5: field 'jobs.0.entrypoint': job 'mine': cannot import 'myjobs.grpo_job'" in said
    assert "run from the directory that holds 'myjobs', or add that directory to PYTHONPATH" in said
    assert not (tmp_path / "out").exists()  # nothing started

    monkeypatch.chdir(code)
    check_entrypoints(spec, load_run_file(spec).plan())  # from the package's directory it is found
    monkeypatch.chdir(elsewhere)
    check_entrypoints(spec, load_run_file(spec).plan(), folder=code)
    spec.write_text(USERS_JOB.format("TheirJob"))
    with pytest.raises(InputError, match="'myjobs.grpo_job' .* defines no 'TheirJob'") as caught:
        check_entrypoints(spec, load_run_file(spec).plan(), folder=code)
    assert caught.value.field == "jobs.0.entrypoint"
    assert "myjobs.grpo_job" not in sys.modules  # looked up, never run


@pytest.mark.parametrize(
    ("job", "said"),
    [
        ("slo: 2.0", "job 'x' (kind grpo, as it names no 'entrypoint'): field 'iterations' is required for a grpo job"),
        ("entrypoint: a.b:c", "job 'x' (kind program): field 'iterations' is required for a program job"),
    ],
)
def test_a_missing_field_is_named_for_the_kind_of_job(tmp_path, job, said):
    path = tmp_path / "run.yaml"
    path.write_text(f"jobs:\n  - name: x\n    {job}\n")
    with pytest.raises(InputError) as caught:
        load_run_file(path)
    assert (caught.value.field, caught.value.reason, caught.value.line) == ("jobs.0.iterations", said, 2)


def record(job: str, phase: str, granted: float, busy: float, released: float) -> PhaseRecord:
    return PhaseRecord(job, phase, 0, (0,), granted, granted, granted, granted + busy, released, 0.0, 0.0)


def test_the_final_table_shows_the_slowdown_each_finished_job_ran_at():
    records = [record("a", "rollout", 0, 1, 1), record("b", "rollout", 1, 1, 2), record("a", "train", 2, 1, 3)]
    assert realised_slowdowns(records) == {"a": 1.5, "b": 1.0}
    view = {"state": "done", "reason": "", "iterations": 1, "phase": None, "slowdown": None, "restarts": 0}
    views = {"a": {**view, "realised_slowdown": 1.5}, "b": {**view, "state": "running", "slowdown": 1.25}}
    console = Console(record=True, width=200)
    console.print(live_table(views, {}, {"a": 1, "b": 1}))
    shown = console.export_text()
    rows = {line.split()[1]: line for line in shown.splitlines() if line.startswith("│ ")}
    assert "1.500*" in rows["a"] and "1.250" in rows["b"] and "slowdown as run" in shown


def test_the_reward_plot_is_labelled_and_scaled_from_the_jobs_rewards(tmp_path):
    history = [
        {"iteration": i, "elapsed_s": float(i), "reward": r, "reward/format_bonus": r} for i, r in enumerate((0.4, 1.2))
    ]
    low, high = reward_limits({"a": history})
    assert low < 0.4 and high > 1.2
    assert reward_label({"a": history}) == "mean reward (format_bonus)"
    assert reward_label({"a": [{"reward": 0.5}]}) == "mean reward"
    picture = reward_curves({"a": history, "no-reward": [{"iteration": 0, "loss": 1.0}]}, tmp_path / "r.png", "t")
    assert picture.read_bytes()[:4] == b"\x89PNG"
