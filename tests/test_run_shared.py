"""Several ``rollmux run`` on one Ray cluster that a user started with ``ray start --head``.

The cluster is started as a user's shell would: a token at hand (as ``~/.ray/auth_token``
is wherever Ray ran before, here through ``RAY_AUTH_TOKEN_PATH``) and ``RAY_AUTH_MODE``
unset, so Ray turns token authentication on; the runs are CLI processes with that same
environment. The second run joins the first's control plane; whichever exits first,
both finish; a run whose control plane was killed takes it over; a re-run redoes
nothing that finished.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from rollmux.inputs.runfile import RunFile
from rollmux.live.launch import JobsElsewhere, PlanRun
from rollmux.sdk.jobcode import JOB_CODE
from rollmux.service.server import ServeOptions, Service
from tests.local_ray import fresh_local_ray
from tests.service_process import free_port

RUN = """
cluster: {{ray_address: "{address}"}}
jobs:
  - name: {name}
    iterations: {iterations}
    slo: 2.0
    grpo: {{seed: {seed}, prompts_per_iteration: 32, train_groups: 16}}
"""
RUN_S = 240.0
"""Deadline of one run's process: a few tens of seconds on an idle two-core machine."""
POOLS = '{"rollmux_rollout_node": 1, "rollmux_train_node": 1}'


@dataclass(frozen=True)
class Head:
    address: str
    env: dict[str, str]
    """The environment of a user's shell on this cluster."""


def user_env(**settings: str) -> dict[str, str]:
    """This process's environment without Ray's authentication settings (Ray's own
    ``ray.init`` in an earlier test sets ``RAY_AUTH_MODE`` here), plus ``settings``."""
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")}
    return {**env, **settings}


@contextmanager
def ray_head(env: dict[str, str]) -> Iterator[str]:
    """``ray start --head --block`` in a session of its own, on free ports and a temporary
    folder of its own; stopped by signalling that session only (``ray stop`` would stop
    every Ray on the machine), its folder removed. Yields its address."""
    port = free_port()
    temp = tempfile.mkdtemp(prefix="rollmux-ray-", dir="/tmp")  # short: Ray's socket paths have a length limit
    log = Path(temp) / "head.log"
    ray = Path(sys.executable).parent / "ray"
    command = [str(ray), "start", "--head", "--block", f"--port={port}", f"--temp-dir={temp}"]
    command += [f"--dashboard-agent-listen-port={free_port()}", "--include-dashboard=false", "--num-cpus=4"]
    command += [f"--resources={POOLS}", "--disable-usage-stats"]
    with open(log, "wb") as sink:
        head = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        wait_until(lambda: b"Ray runtime started" in log.read_bytes() or head.poll() is not None, 120, "ray start")
        assert head.poll() is None, log.read_text(errors="replace")
        yield f"127.0.0.1:{port}"
    finally:
        os.kill(head.pid, signal.SIGTERM)
        with suppress(subprocess.TimeoutExpired):
            head.wait(timeout=15)
        with suppress(ProcessLookupError):  # what did not stop in time, the raylet's workers among them
            os.killpg(head.pid, signal.SIGKILL)
        head.wait()
        shutil.rmtree(temp, ignore_errors=True)


@pytest.fixture(scope="module")
def head(tmp_path_factory) -> Iterator[Head]:
    token = tmp_path_factory.mktemp("ray-auth") / "auth_token"
    token.write_text(secrets.token_hex(32))
    env = user_env(RAY_AUTH_TOKEN_PATH=str(token))
    with ray_head(env) as address:
        yield Head(address, env)


@dataclass
class Run:
    """A ``rollmux run`` process of one job, its output folder and its log."""

    out: Path
    process: subprocess.Popen

    def finish(self) -> tuple[int, str]:
        try:
            self.process.wait(timeout=RUN_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        return self.process.returncode, self.log()

    def log(self) -> str:
        return (self.out.parent / f"{self.out.name}.log").read_text(errors="replace")

    def result(self) -> dict[str, Any]:
        return json.loads((self.out / "run.json").read_text())

    def plane(self) -> dict[str, Any]:
        """The control plane this run's jobs are in, as it noted it."""
        return json.loads((self.out / "control-plane.json").read_text())


@pytest.fixture
def start(tmp_path: Path, head: Head) -> Iterator[Callable[..., Run]]:
    """Starts a run of a one-job file (written on first use); a run a failed test left is killed."""
    runs: list[Run] = []

    def run(name: str, iterations: int, seed: int = 0) -> Run:
        spec, out = tmp_path / f"{name}.yaml", tmp_path / f"out-{name}"
        if not spec.exists():
            spec.write_text(RUN.format(address=head.address, name=name, iterations=iterations, seed=seed))
        command = [sys.executable, "-m", "rollmux.cli.main", "run", str(spec), "--out", str(out)]
        with open(tmp_path / f"out-{name}.log", "wb") as log:
            runs.append(Run(out, subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=head.env)))
        return runs[-1]

    yield run
    for left in runs:
        if left.process.poll() is None:
            left.process.kill()
            left.process.wait()


def started(run: Run, name: str) -> Run:
    """Once the run's embedded control plane accepted its job (its store in ``out/state`` has it)."""
    wait_until(lambda: job_row(run.out / "state", name) or run.process.poll() is not None, 120, "the first job")
    assert run.process.poll() is None, run.log()
    return run


def wait_until(condition: Callable[[], Any], timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if found := condition():
            return found
        time.sleep(0.1)
    raise TimeoutError(f"{what}: not reached in {timeout_s:g} s")


def job_row(state: Path, name: str) -> tuple[str, int] | None:
    """The job's state and committed iterations in a control plane's store."""
    try:
        with sqlite3.connect(f"file:{state / 'rollmux.db'}?mode=ro", uri=True) as connection:
            return connection.execute("SELECT state, iteration FROM jobs WHERE name = ?", (name,)).fetchone()
    except sqlite3.OperationalError:  # not there yet, or its tables not yet created
        return None


def test_the_run_that_started_the_control_plane_keeps_it_until_the_other_run_is_done_and_a_rerun_redoes_nothing(
    start,
):
    first = started(start("first", iterations=20), "first")
    second = start("second", iterations=80, seed=1)
    (code, told), (code2, told2) = first.finish(), second.finish()
    assert code == 0, told
    assert code2 == 0, told2
    assert "waiting for 1 job(s) (second)" in told
    assert second.plane()["state"] == str((first.out / "state").resolve())  # joined, never took over
    assert "stopped answering" not in told2
    done = second.result()
    assert (done["jobs"]["second"]["state"], done["jobs"]["second"]["iterations"]) == ("done", 80)

    again = start("second", iterations=80)
    code, told = again.finish()
    assert code == 0, told
    assert f"hosting it here on {(first.out / 'state').resolve()}" in told  # where the job ran, not a fresh plane
    rerun = again.result()
    assert rerun["phase_log"] == done["phase_log"] and rerun["histories"] == done["histories"]
    assert rerun["jobs"]["second"]["restarts"] == 0


def test_a_run_that_joined_may_end_first(start):
    first = started(start("first", iterations=40), "first")
    second = start("second", iterations=2, seed=1)
    code2, told2 = second.finish()
    assert code2 == 0, told2
    assert first.process.poll() is None  # the run that started the control plane outlives the one that joined it
    code, told = first.finish()
    assert code == 0, told
    assert {name: view["state"] for name, view in first.result()["jobs"].items()} == {"first": "done"}
    assert "waiting for" not in told


@pytest.mark.slow  # a long live scenario: bench/scenarios.py runs it
def test_a_run_whose_control_plane_was_killed_takes_it_over_and_resumes_from_checkpoints(start):
    first = started(start("first", iterations=60), "first")
    second = start("second", iterations=40, seed=1)
    state = first.out / "state"
    wait_until(lambda: (job_row(state, "second") or ("", 0))[1] >= 3, 180, "the second run's job at iteration 3")
    first.process.kill()  # SIGKILL: the control plane's process dies; the job drivers on the cluster do not
    first.process.wait()

    code, told = second.finish()
    assert code == 0, told
    assert f"hosting it here on {state.resolve()}" in told
    with sqlite3.connect(state / "rollmux.db") as connection:
        jobs = set(connection.execute("SELECT name, state, iteration, restarts FROM jobs").fetchall())
        resumed = connection.execute("SELECT detail FROM events WHERE job = 'second' AND kind = 'running'").fetchall()
    # the killed run's job was resumed too, and neither was charged a restart: their old drivers were stopped
    assert jobs == {("first", "done", 60, 0), ("second", "done", 40, 0)}
    starts = [int(re.search(r"from iteration (\d+)", detail).group(1)) for (detail,) in resumed]
    assert starts[-1] >= 3 and 0 not in starts[1:], starts  # resumed from its checkpoint, never from 0
    done = second.result()
    assert len(done["histories"]["second"]) == 40  # every iteration's metrics, none twice
    assert [e["iteration"] for e in done["phase_log"] if e["phase"] == "train"].count(0) == 1


@pytest.fixture
def local_ray() -> Iterator[None]:
    yield from fresh_local_ray(rollout_nodes=1, train_nodes=1)


def test_a_run_that_finds_another_taking_the_state_over_joins_it_once_it_answers(local_ray, tmp_path):
    """The writer lock decides between two runs taking one state over: the loser waits
    and joins the winner's control plane, never a second one on the same store."""
    state = tmp_path / "first" / "state"
    options = ServeOptions(port=0, state_dir=state, job_code=JOB_CODE, embedded=True)
    winner = Service(options)  # locked and registered, not yet serving
    try:
        out = tmp_path / "second"
        out.mkdir()
        gone = {"url": "http://127.0.0.1:9", "state": str(state.resolve()), "embedded": True, "pid": 1, "host": "h"}
        (out / "control-plane.json").write_text(json.dumps(gone))
        notes: list[str] = []
        plan = PlanRun(RunFile.model_validate({"jobs": [{"name": "a", "iterations": 1}]}), out, on_note=notes.append)
        attaching = threading.Thread(target=plan.__enter__, daemon=True)
        attaching.start()
        wait_until(lambda: any("another run is starting the control plane" in note for note in notes), 120, "a wait")
        winner.start()
        attaching.join(timeout=60)
        assert not attaching.is_alive() and plan.plane is not None
        assert plan.plane.service is None and plan.plane.client.url == winner.url
    finally:
        winner.stop()


def test_a_folder_whose_jobs_are_held_elsewhere_is_refused_naming_where(local_ray, tmp_path):
    """A re-run never submits its jobs to a control plane that does not hold them (they
    would start over from iteration 0), nor hosts one on a state that is not there."""
    out, elsewhere = tmp_path / "second", tmp_path / "first" / "state"
    out.mkdir()
    (out / "control-plane.json").write_text(json.dumps({"url": "http://127.0.0.1:9", "state": str(elsewhere)}))
    plan = PlanRun(RunFile.model_validate({"jobs": [{"name": "a", "iterations": 1}]}), out)
    cluster = Service(
        ServeOptions(port=0, state_dir=tmp_path / "other" / "state", job_code=JOB_CODE, embedded=True)
    ).start()
    try:
        with pytest.raises(JobsElsewhere, match=f"state in {elsewhere}, but this Ray cluster's control plane"):
            plan.__enter__()
    finally:
        cluster.stop()
    with pytest.raises(JobsElsewhere, match=f"state in {elsewhere} .*not there to host"):
        plan.__enter__()
    assert not elsewhere.exists()


def test_a_cluster_that_wants_a_token_is_refused_naming_what_to_set_when_none_is_here(tmp_path, head):
    home = tmp_path / "home"  # no ~/.ray/auth_token there
    home.mkdir()
    spec = tmp_path / "run.yaml"
    spec.write_text(RUN.format(address=head.address, name="a", iterations=1, seed=0))
    command = [sys.executable, "-m", "rollmux.cli.main", "run", str(spec), "--out", str(tmp_path / "out")]
    ran = subprocess.run(command, capture_output=True, text=True, env=user_env(HOME=str(home)), timeout=120)
    assert ran.returncode == 2, ran.stdout + ran.stderr
    assert "wants a token and none is here" in ran.stderr and "RAY_AUTH_TOKEN" in ran.stderr, ran.stderr


CHECK_ACTORS = """
import sys, ray
from rollmux.dataplane.connect import start_ray
start_ray(sys.argv[1])
echo = ray.remote(type("Echo", (), {"ping": lambda self: "pong"})).remote()
print(ray.get(echo.ping.remote(), timeout=60))
"""


def test_a_cluster_without_token_auth_is_joined_even_where_a_token_is_at_hand(tmp_path):
    """Token mode turned on from the token alone would connect, and then see its actors die."""
    token = tmp_path / "auth_token"
    token.write_text(secrets.token_hex(32))
    with ray_head(user_env(RAY_AUTH_MODE="disabled")) as address:
        env = user_env(RAY_AUTH_TOKEN_PATH=str(token))
        ran = subprocess.run(
            [sys.executable, "-c", CHECK_ACTORS, address], capture_output=True, text=True, env=env, timeout=180
        )
    assert ran.returncode == 0 and ran.stdout.strip() == "pong", ran.stderr[-3000:]
