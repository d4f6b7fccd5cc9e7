"""Failures of the platform are retried, not blamed on the job. Ray's errors for a lost
process, node or object — and for a process its memory monitor killed — are told apart
from the job's own exceptions; the control plane's tasks never fail unobserved; and on a
real ``rollmux serve`` with Ray, a worker SIGKILLed as the memory monitor would, followed
by Ray's OutOfMemoryError when the job's driver is started again, costs the job two
counted restarts (the second after its back-off), not its run: it ends ``done`` with the
losses of a run alone. A job whose restarts run out ends ``failed`` naming the platform's
failure. The README's ``rollmux submit examples/job.yaml`` runs to ``done`` there too."""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import os
import re
import signal
import warnings
from pathlib import Path

import ray.exceptions as rex
from typer.testing import CliRunner

from rollmux.cli.main import app
from rollmux.dataplane.platform import platform_failure
from rollmux.jobs.grpo import GRPOConfig, run_alone
from rollmux.wire.client import Client
from rollmux.wire.failpoints import ONCE_VARIABLE, RAISE_VARIABLE, VARIABLE
from rollmux.wire.tasks import abandon, spawn
from tests.service_process import ServiceProcess
from tests.test_recovery import wait_until

SMALL = {"prompts_per_iteration": 64, "train_groups": 32}
ITERATIONS = 6
EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def test_rays_errors_for_lost_processes_are_the_platforms_and_the_jobs_own_errors_are_not():
    oom = rex.OutOfMemoryError("Task was killed due to the node running low on memory.")
    assert platform_failure(oom) is oom
    assert isinstance(platform_failure(rex.ActorDiedError()), rex.RayActorError)
    assert platform_failure(rex.NodeDiedError("node gone")) is not None
    assert platform_failure(rex.ObjectLostError("ab" * 14, "owner", "call site")) is not None
    crossed = rex.RayTaskError("call", "traceback", oom).as_instanceof_cause()  # a worker's call that hit it
    assert platform_failure(crossed) is not None
    own = rex.RayTaskError("train", "traceback", ValueError("bad batch")).as_instanceof_cause()
    assert platform_failure(own) is None
    assert platform_failure(ValueError("bad batch")) is None
    assert platform_failure(TimeoutError("the job's own timeout")) is None


def test_a_task_that_fails_is_logged_with_what_it_did_and_handled(caplog):
    handled: list[BaseException] = []

    async def launch() -> None:
        raise rex.OutOfMemoryError("killed")

    async def on_error(error: BaseException) -> None:
        handled.append(error)

    async def main() -> None:
        task = spawn(launch(), "launching job a (incarnation 1)", on_error)
        await asyncio.wait({task})
        for _ in range(3):
            await asyncio.sleep(0)  # the handler runs in a task of its own

        helper = asyncio.ensure_future(launch())
        await asyncio.sleep(0)
        abandon(helper)  # failed, and nobody awaits it: its exception is taken here

    caplog.set_level(logging.ERROR, logger="rollmux.tasks")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        asyncio.run(main())
        gc.collect()
    assert [type(e) for e in handled] == [rex.OutOfMemoryError]
    assert "launching job a (incarnation 1) failed: OutOfMemoryError: killed" in caplog.text
    assert "never retrieved" not in caplog.text


def descendants(root: int) -> list[int]:
    """Every process below ``root`` (this test's service, its local Ray, Ray's workers)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(parent, []).append(int(entry.name))
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def pool_workers(service: ServiceProcess) -> list[int]:
    """The service's RollMux workers (Ray names their processes ``ray::PoolWorker...``)."""
    assert service.process is not None
    named = []
    for pid in descendants(service.process.pid):
        try:
            if Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"ray::PoolWorker"):
                named.append(pid)
        except OSError:
            continue
    return named


def events(api: Client, name: str) -> list[dict]:
    return api.request("GET", f"/v1/jobs/{name}/events")


def ended(api: Client, name: str) -> dict | None:
    view = api.request("GET", f"/v1/jobs/{name}")
    return view if view["state"] in ("done", "failed", "cancelled") else None


def grpo(name: str, max_restarts: int) -> dict:
    return {
        "name": name,
        "kind": "grpo",
        "iterations": ITERATIONS,
        "slo": 3.0,
        "max_restarts": max_restarts,
        "grpo": {"seed": 0, **SMALL},
    }


def test_platform_failures_restart_a_job_with_back_off_until_its_restarts_run_out(tmp_path, monkeypatch):
    # The failpoint raises Ray's OutOfMemoryError from the executor's start of a driver, once
    # each time the test removes its marker (created now: disarmed until then).
    marker = tmp_path / "oom-fired"
    marker.touch()
    monkeypatch.setenv(VARIABLE, "executor:start-driver")
    monkeypatch.setenv(RAISE_VARIABLE, "OutOfMemoryError")
    monkeypatch.setenv(ONCE_VARIABLE, str(marker))
    extra = ("--rollout-nodes", "1", "--train-nodes", "1", "--lease-s", "3", "--no-regroup", "--no-slo-guard")
    # A grace no busy test machine outlasts: a launch slowed by the load is not the failure tested here.
    extra += ("--lost-grace-s", "600")
    service = ServiceProcess(tmp_path / "state", extra=extra).start(timeout_s=120)
    try:
        api = Client(service.url, service.token)
        common = ["--url", service.url, "--state-dir", str(service.state_dir), "--json"]
        submitted = CliRunner().invoke(app, ["submit", str(EXAMPLES / "job.yaml"), *common])
        assert submitted.exit_code == 0, submitted.output
        example = json.loads(submitted.output)["name"]
        assert wait_until(lambda: ended(api, example), timeout_s=300)["state"] == "done"

        api.request("POST", "/v1/jobs", json=grpo("a", max_restarts=3))
        try:
            wait_until(lambda: api.request("GET", "/v1/jobs/a")["iterations"] >= 2, timeout_s=120)
        except TimeoutError:
            raise AssertionError(f"{api.request('GET', '/v1/jobs/a')}\n{service.stacks()}") from None
        (worker, *_) = pool_workers(service)
        marker.unlink()  # the next driver start meets Ray's OutOfMemoryError
        os.kill(worker, signal.SIGKILL)  # as Ray's memory monitor kills a worker
        view = wait_until(lambda: ended(api, "a"), timeout_s=300)
        assert (view["state"], view["restarts"]) == ("done", 2), json.dumps(events(api, "a"), indent=1)
        restarts = [e for e in events(api, "a") if e["kind"] == "restart"]
        assert [e["detail"].split(" after: ")[0] for e in restarts] == ["restart 1/3", "restart 2/3 in 1 s"]
        assert re.search(r"its driver ended: lost: \w+Error", restarts[0]["detail"]), restarts
        assert "its driver did not start: OutOfMemoryError: simulated" in restarts[1]["detail"]
        session = next(e for e in events(api, "a") if e["kind"] == "session" and e["at"] > restarts[1]["at"])
        assert session["at"] >= restarts[1]["at"] + 1.0  # its back-off was waited out
        metrics = api.request("GET", "/v1/jobs/a/metrics")
        alone = run_alone(GRPOConfig(seed=0, **SMALL), ITERATIONS)
        assert [(m["loss"], m["reward"]) for m in metrics] == [(m["loss"], m["reward"]) for m in alone]

        marker.unlink()
        api.request("POST", "/v1/jobs", json=grpo("b", max_restarts=0))
        view = wait_until(lambda: ended(api, "b"), timeout_s=120)
        assert view["state"] == "failed" and view["restarts"] == 1
        assert view["reason"].startswith("lost 1 times (max_restarts 0): its driver did not start: OutOfMemoryError")
    finally:
        service.stop()
