"""Jobs that run their own workers take leased, fenced turns from the control plane: they
alternate on shared nodes, a client that vanishes loses its turn after the lease, a stale
epoch changes nothing, and SIGKILL of the control plane mid-phase never lets two jobs run
on one node."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from rollmux.core.errors import StaleEpoch
from rollmux.wire.client import Client, ServiceError
from tests.service_process import ServiceProcess

SPEC = {"rollout_s": 1.0, "train_s": 1.0, "slo": 2.0}
LEASE_S = 2.0


@pytest.fixture()
def service(tmp_path):
    process = ServiceProcess(
        tmp_path / "state", extra=("--no-ray", "--lease-s", str(LEASE_S), "--no-regroup", "--no-slo-guard")
    ).start()
    yield process
    process.stop()


def submit(service: ServiceProcess, *names: str) -> Client:
    api = Client(service.url, service.token)
    api.request("POST", "/v1/plans", json={"jobs": [{"name": n, **SPEC} for n in names]})
    return api


def run_job(api: Client, name: str, iterations: int, seconds: float, spans: list) -> None:
    """A job's own loop; ``spans`` gets the intervals it really computed, per node."""
    with api.running(name) as turns:
        for _ in range(iterations):
            for phase in ("rollout", "train"):
                with turns.phase(phase) as grant:
                    start = time.monotonic()
                    time.sleep(seconds)
                    spans.append((name, phase, grant.nodes, start, time.monotonic()))


def never_two_at_once(intervals: list[tuple[float, float, str]]) -> None:
    intervals.sort()
    for earlier, later in zip(intervals, intervals[1:], strict=False):
        assert later[0] >= earlier[1] - 1e-6, f"{earlier[2]} and {later[2]} overlap: {earlier} {later}"


def by_node(entries) -> dict[int, list[tuple[float, float, str]]]:
    nodes: dict[int, list] = {}
    for job, start, end, used in entries:
        for node in used:
            nodes.setdefault(node, []).append((start, end, job))
    return nodes


def test_two_jobs_alternate_on_their_shared_nodes(service):
    api = submit(service, "a", "b")
    spans: list = []
    threads = [threading.Thread(target=run_job, args=(api, n, 3, 0.05, spans)) for n in ("a", "b")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert len(spans) == 2 * 2 * 3
    for intervals in by_node((job, s, e, nodes) for job, _, nodes, s, e in spans).values():
        never_two_at_once(intervals)
        served = [job for _, _, job in intervals]
        # Round-robin: each job once per cycle (the order within the first cycle follows
        # which job joined first: b's thread may activate before a's).
        assert [sorted(served[i : i + 2]) for i in range(0, 6, 2)] == [["a", "b"]] * 3, served
    log = api.phase_log()
    assert [(e["phase"], e["iteration"]) for e in log if e["job"] == "a"] == [
        (p, i) for i in range(3) for p in ("rollout", "train")
    ]
    assert {e["outcome"] for e in log} == {"released"}
    assert [api.request("GET", f"/v1/jobs/{n}")["state"] for n in "ab"] == ["done", "done"]


def test_metrics_reported_in_a_phase_are_recorded_with_its_release(service):
    api = submit(service, "a")
    with api.running("a") as turns:
        for iteration in range(2):
            turns.release(turns.acquire("rollout"), 0.01)
            turns.release(turns.acquire("train"), 0.01, report=({"loss": 1.0 / (iteration + 1)}, None))
        refused = {"epoch": turns.epoch, "token": 999, "busy_s": 0, "progress": {"iteration": 5, "metrics": {"x": 9}}}
        with pytest.raises(ServiceError, match="without holding it"):  # no grant held: nothing recorded
            api.request("POST", "/v1/jobs/a/phases/train/release", json=refused)
    assert api.request("GET", "/v1/jobs/a/metrics") == [{"loss": 1.0}, {"loss": 0.5}]
    with pytest.raises(ServiceError, match="progress"):
        api.request(
            "POST",
            "/v1/jobs/a/phases/train/release",
            json={"epoch": 1, "token": 1, "busy_s": 0, "progress": {"iteration": -1, "metrics": {}}},
        )


def test_a_stale_epoch_is_refused_and_nothing_changes(service):
    api = submit(service, "a")
    old = api.session("a")
    old.activate()
    grant = old.acquire("rollout")
    new = api.session("a")  # a newer incarnation: the old one's grant is revoked

    def snapshot() -> tuple[dict, list]:
        view = api.request("GET", "/v1/jobs/a")
        del view["cost_usd"]  # grows with time
        return view, api.phase_log()

    before = snapshot()
    with pytest.raises(StaleEpoch, match="epoch 1 is stale, the job is at epoch 2"):
        old.release(grant, busy_s=1.0)
    with pytest.raises(StaleEpoch):
        old.acquire("rollout")
    after = snapshot()
    assert before == after and after[0]["epoch"] == 2
    assert [e["outcome"] for e in after[1]] == ["revoked"]
    old.close()
    new.close()


def test_a_client_that_vanishes_holding_a_grant_loses_it_after_its_lease(service):
    api = submit(service, "gone", "partner")
    for name in ("gone", "partner"):
        epoch = api.request("POST", f"/v1/jobs/{name}/sessions", json={"pid": 1, "host": "test"})["epoch"]
        api.request("POST", f"/v1/jobs/{name}/activate", json={"epoch": epoch})
    held = api.request("POST", "/v1/jobs/gone/phases/rollout/acquire", params={"epoch": 1, "wait_s": 0})
    assert held["granted"]  # and then the client vanishes: no heartbeat, no release
    partner = api.session("partner")  # the partner's driver (re)starts and waits for its turn
    partner.activate()
    asked = time.monotonic()
    grant = partner.acquire("rollout")
    assert time.monotonic() - asked <= LEASE_S + 2.0
    assert grant.nodes == tuple(held["nodes"])
    lost = api.request("GET", "/v1/jobs/gone")
    assert lost["state"] == "lost" and "lease expired" in lost["reason"]
    late = {"epoch": 1, "token": held["token"], "busy_s": 1.0}
    with pytest.raises(StaleEpoch, match="session 1 is over"):
        api.request("POST", "/v1/jobs/gone/phases/rollout/release", json=late)
    revoked = [e for e in api.phase_log() if e["job"] == "gone"]
    assert [e["outcome"] for e in revoked] == ["revoked"] and revoked[0]["ended_at"] <= time.time()
    partner.close()


def test_a_long_poll_given_up_keeps_the_grant_made_meanwhile(service):
    api = submit(service, "a", "b")
    turns = {n: api.session(n) for n in ("a", "b")}
    for t in turns.values():
        t.activate()
    first = turns["a"].acquire("rollout")
    waiting = api.request(
        "POST", "/v1/jobs/b/phases/rollout/acquire", params={"epoch": turns["b"].epoch, "wait_s": 0.2}
    )
    assert not waiting["granted"]  # b gives up on its long poll
    turns["a"].release(first, busy_s=0.1)
    assert api.request("GET", "/v1/jobs/b")["phase"] == "rollout"  # granted while b was not asking
    again = turns["b"].acquire("rollout")
    assert again.nodes == first.nodes and again.token > first.token
    for t in turns.values():
        t.close()


def test_phases_out_of_order_are_refused(service):
    api = submit(service, "eager")
    with pytest.raises(ServiceError, match="409: .*not active"):
        api.request("POST", "/v1/jobs/eager/phases/rollout/acquire", params={"epoch": 0, "wait_s": 0})
    turns = api.session("eager")
    turns.activate()
    with pytest.raises(ServiceError, match="409: .*rollout phase comes first"):
        api.request("POST", "/v1/jobs/eager/phases/train/acquire", params={"epoch": turns.epoch, "wait_s": 0})
    with pytest.raises(ServiceError, match="409"):
        api.request(
            "POST", "/v1/jobs/eager/phases/rollout/release", json={"epoch": turns.epoch, "token": 99, "busy_s": 1}
        )
    bad = httpx.post(service.url + "/v1/jobs/eager/phases/evaluate/acquire?epoch=1", headers=service.auth)
    assert bad.status_code == 422
    turns.close()


def test_sigkill_of_the_control_plane_mid_phase_never_puts_two_jobs_on_a_node(service):
    """The jobs keep computing while the control plane is down and come back to it; the
    grant held across the crash stays held, so the partner waits for it."""
    api = submit(service, "a", "b")
    iterations, phase_s = 4, 0.6
    spans: list = []
    threads = [threading.Thread(target=run_job, args=(api, n, iterations, phase_s, spans)) for n in ("a", "b")]
    for thread in threads:
        thread.start()
    while not any(j["phase"] for j in api.jobs()) or len(spans) < 3:
        time.sleep(0.02)
    time.sleep(phase_s / 3)  # mid-phase
    service.kill()
    time.sleep(1.0)
    service.start()
    for thread in threads:
        thread.join(timeout=180)
    assert not any(t.is_alive() for t in threads)
    assert len(spans) == 2 * 2 * iterations
    for intervals in by_node((job, s, e, nodes) for job, _, nodes, s, e in spans).values():
        never_two_at_once(intervals)  # what really ran
    log = api.phase_log()
    for intervals in by_node((e["job"], e["granted_at"], e["ended_at"], e["nodes"]) for e in log).values():
        never_two_at_once(intervals)  # what the persisted phase log says
    for name in ("a", "b"):
        mine = [(e["phase"], e["iteration"]) for e in log if e["job"] == name]
        assert mine == [(p, i) for i in range(iterations) for p in ("rollout", "train")]
        view = api.request("GET", f"/v1/jobs/{name}")
        assert (view["state"], view["iterations"], view["epoch"]) == ("done", iterations, 1)
