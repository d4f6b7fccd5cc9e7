"""Jobs run by a real ``rollmux serve`` on Ray survive their driver's death and the
control plane's: a killed driver loses its grant within its lease, its partners go on, and
it resumes from its checkpoint; a killed control plane restarts every job from where it
was, charging none of them a restart. Losses and rewards stay those of an undisturbed run."""

from __future__ import annotations

import os
import re
import signal
import time

import pytest

from rollmux.wire.client import Client
from rollmux.wire.failpoints import ONCE_VARIABLE, SKIP_VARIABLE, VARIABLE
from tests.service_process import ServiceProcess

LEASE_S = 3.0
SMALL = {"prompts_per_iteration": 64, "train_groups": 32}
ITERATIONS = 8


@pytest.fixture()
def service(tmp_path):
    extra = ("--rollout-nodes", "1", "--train-nodes", "1", "--lease-s", str(LEASE_S), "--no-regroup", "--no-slo-guard")
    process = ServiceProcess(tmp_path / "state", extra=extra).start(timeout_s=120)
    yield process
    process.stop()


def submit_group(api: Client) -> None:
    """Three jobs on one rollout and one training node; ``ref`` is ``a``'s twin."""
    jobs = [
        {"name": name, "kind": "grpo", "iterations": ITERATIONS, "slo": 3.0, "grpo": {"seed": seed, **SMALL}}
        for name, seed in (("a", 0), ("b", 1), ("ref", 0))
    ]
    api.request("POST", "/v1/plans", json={"jobs": jobs})


def wait_until(condition, timeout_s: float = 240.0, every_s: float = 0.05):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = condition()
        if found:
            return found
        time.sleep(every_s)
    raise TimeoutError("condition not reached")


def all_ended(api: Client) -> dict[str, dict]:
    views = {n: api.request("GET", f"/v1/jobs/{n}") for n in ("a", "b", "ref")}
    return views if all(v["state"] in ("done", "failed", "cancelled") for v in views.values()) else {}


def losses(api: Client, name: str) -> list[tuple[float, float]]:
    return [(m["loss"], m["reward"]) for m in api.request("GET", f"/v1/jobs/{name}/metrics")]


def running(pid: int) -> bool:
    """The process exists and is not a zombie waiting to be reaped."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def no_node_runs_two_jobs(log: list[dict]) -> None:
    by_node: dict[int, list] = {}
    for e in log:
        for node in e["nodes"]:
            by_node.setdefault(node, []).append((e["granted_at"], e["ended_at"], e["job"]))
    for spans in by_node.values():
        spans.sort()
        for earlier, later in zip(spans, spans[1:], strict=False):
            assert later[0] >= earlier[1] - 1e-6, (earlier, later)


def frozen_holding(api: Client, driver: int) -> dict | None:
    """Freeze the driver; its job's view if it holds a phase now, else thaw it (None). A
    hand-back the driver sent just before it froze may still be on its way: the view is
    read once the service has had time to take it."""
    os.kill(driver, signal.SIGSTOP)
    time.sleep(0.5)
    view = api.request("GET", "/v1/jobs/a")
    if view["phase"]:
        return view
    os.kill(driver, signal.SIGCONT)
    return None


def test_a_killed_driver_holding_a_grant_loses_it_within_its_lease_and_resumes(service):
    api = Client(service.url, service.token)
    submit_group(api)
    wait_until(lambda: api.request("GET", "/v1/jobs/a")["iterations"] >= 2)
    session = [e for e in api.request("GET", "/v1/jobs/a/events") if e["kind"] == "session"][-1]
    driver = int(re.search(r"pid (\d+)", session["detail"]).group(1))
    held = wait_until(lambda: frozen_holding(api, driver), timeout_s=30)
    killed = time.time()  # read before the kill: the service may revoke and move on before we run again
    os.kill(driver, signal.SIGKILL)  # frozen while holding its phase: it cannot hand it back first

    views = wait_until(lambda: all_ended(api))
    assert {v["state"] for v in views.values()} == {"done"}
    # The kill costs a its restart; on a starved machine its new driver may miss a lease
    # of 3 s once more (seen beside a CPU-bound process), which is a restart, not a loss.
    assert views["a"]["restarts"] >= 1 and views["b"]["restarts"] == 0
    log = api.phase_log()
    revoked = [e for e in log if e["outcome"] == "revoked"]
    assert [e["job"] for e in revoked] == ["a"]
    assert (revoked[0]["phase"], revoked[0]["iteration"]) == (held["phase"], held["iterations"])
    node = revoked[0]["nodes"][0]
    lost = revoked[0]["ended_at"]  # on the service's clock, as the grants are
    partner = min(e["granted_at"] for e in log if e["job"] != "a" and node in e["nodes"] and e["granted_at"] >= lost)
    assert partner - killed <= LEASE_S + 2.0
    resumed = [e for e in api.request("GET", "/v1/jobs/a/events") if e["kind"] == "running"][-1]
    resumed_at = int(re.search(r"from iteration (\d+)", resumed["detail"]).group(1))
    step, phase = revoked[0]["iteration"], revoked[0]["phase"]
    # The step it held is redone, unless it was killed in training after that step's checkpoint.
    assert resumed_at in ({step, step + 1} if phase == "train" else {step})
    assert losses(api, "a") == losses(api, "ref") and len(losses(api, "a")) == ITERATIONS
    no_node_runs_two_jobs(log)


@pytest.mark.slow  # a long live scenario: bench/scenarios.py runs it
def test_a_driver_killed_between_its_checkpoint_and_its_report_still_reports_that_step(tmp_path, monkeypatch):
    # The report of a step goes with the training phase's hand-back, after the checkpoint:
    # the first driver to have checkpointed its third step dies before handing it back.
    monkeypatch.setenv(VARIABLE, "checkpoint:written")
    monkeypatch.setenv(ONCE_VARIABLE, str(tmp_path / "killed"))
    monkeypatch.setenv(SKIP_VARIABLE, "2")
    extra = ("--rollout-nodes", "1", "--train-nodes", "1", "--lease-s", str(LEASE_S), "--no-regroup", "--no-slo-guard")
    service = ServiceProcess(tmp_path / "state", extra=extra).start(timeout_s=120)
    try:
        api = Client(service.url, service.token)
        submit_group(api)
        views = wait_until(lambda: all_ended(api))
        assert {v["state"] for v in views.values()} == {"done"}
        assert sorted(v["restarts"] for v in views.values()) == [0, 0, 1]
        killed = next(name for name, v in views.items() if v["restarts"] == 1)
        resumed = [e for e in api.request("GET", f"/v1/jobs/{killed}/events") if e["kind"] == "running"][-1]
        assert "from iteration 3" in resumed["detail"]  # the step it checkpointed is not redone
        for name in ("a", "b", "ref"):
            reported = [m["iteration"] for m in api.request("GET", f"/v1/jobs/{name}/metrics")]
            assert reported == list(range(ITERATIONS)), name
        assert losses(api, "a") == losses(api, "ref")
    finally:
        service.stop()


@pytest.mark.slow  # a long live scenario: bench/scenarios.py runs it
def test_a_killed_control_plane_restarts_every_job_where_it_was(service):
    api = Client(service.url, service.token)
    submit_group(api)
    wait_until(lambda: (v := api.request("GET", "/v1/jobs/a"))["phase"] and v["iterations"] >= 2)
    service.kill()  # its local Ray, workers and drivers die with it
    service.start(timeout_s=120)

    views = wait_until(lambda: all_ended(api))
    assert {v["state"] for v in views.values()} == {"done"}
    assert {v["restarts"] for v in views.values()} == {0}  # not the jobs' fault
    assert losses(api, "a") == losses(api, "ref") and len(losses(api, "b")) == ITERATIONS
    log = api.phase_log()
    no_node_runs_two_jobs(log)
    for name in ("a", "b", "ref"):
        trained = sorted({e["iteration"] for e in log if e["job"] == name and e["outcome"] == "released"})
        assert trained == list(range(ITERATIONS))


def test_a_cancelled_job_stops_at_once_and_its_partners_go_on(service):
    api = Client(service.url, service.token)
    submit_group(api)
    wait_until(lambda: api.request("GET", "/v1/jobs/b")["iterations"] >= 1)
    session = [e for e in api.request("GET", "/v1/jobs/b/events") if e["kind"] == "session"][-1]
    driver = int(re.search(r"pid (\d+)", session["detail"]).group(1))
    assert api.request("DELETE", "/v1/jobs/b")["state"] == "cancelled"
    wait_until(lambda: not running(driver), timeout_s=30)
    views = wait_until(lambda: all_ended(api))
    assert [views[n]["state"] for n in ("a", "b", "ref")] == ["done", "cancelled", "done"]
    assert views["b"]["iterations"] < ITERATIONS
    assert losses(api, "a") == losses(api, "ref")
    no_node_runs_two_jobs(api.phase_log())
