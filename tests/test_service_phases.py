"""Jobs that run their own workers take their turns from the service's round-robin."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from rollmux.service.client import Client, ServiceError
from tests.service_process import ServiceProcess

SPEC = {"rollout_s": 1.0, "train_s": 1.0, "slo": 2.0}
ITERATIONS = 3


@pytest.fixture()
def service(tmp_path):
    process = ServiceProcess(tmp_path / "state").start()
    yield process
    process.stop()


def client(service: ServiceProcess) -> Client:
    return Client(service.url, service.token)


def run_job(service: ServiceProcess, name: str, spans: list) -> None:
    api = client(service)
    for _ in range(ITERATIONS):
        for phase in ("rollout", "train"):
            with api.phase(name, phase) as nodes:
                start = time.monotonic()
                time.sleep(0.05)
                spans.append((name, phase, tuple(nodes), start, time.monotonic()))


def test_two_jobs_alternate_on_their_shared_nodes_and_phases_persist(service):
    api = client(service)
    for name in ("a", "b"):
        api.request("POST", "/v1/jobs", json={"name": name, **SPEC})
        api.request("POST", f"/v1/jobs/{name}/activate")
    spans: list = []
    threads = [threading.Thread(target=run_job, args=(service, name, spans)) for name in ("a", "b")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert len(spans) == 2 * 2 * ITERATIONS
    by_node: dict[int, list] = {}
    for job, _, nodes, start, end in spans:
        for node in nodes:
            by_node.setdefault(node, []).append((start, end, job))
    for intervals in by_node.values():
        intervals.sort()
        assert all(later[0] >= earlier[1] for earlier, later in zip(intervals, intervals[1:], strict=False))
        assert [job for _, _, job in intervals] == ["a", "b"] * ITERATIONS  # round-robin turns

    service.kill()
    restarted = ServiceProcess(service.state_dir).start()
    try:
        after = client(restarted)
        events = after.request("GET", "/v1/jobs/a/phases")
        assert [e["phase"] for e in events] == ["rollout", "train"] * ITERATIONS
        assert [e["iteration"] for e in events] == [0, 0, 1, 1, 2, 2]
        with pytest.raises(ServiceError, match="409: .*not active"):
            after.request("POST", "/v1/jobs/a/phases/rollout/acquire", params={"wait_s": 0})
        done = after.request("POST", "/v1/jobs/a/complete")
        assert done["state"] == "done"
    finally:
        restarted.stop()


def test_phases_out_of_order_are_refused(service):
    api = client(service)
    api.request("POST", "/v1/jobs", json={"name": "eager", **SPEC})
    with pytest.raises(ServiceError, match="409: .*not active"):
        api.request("POST", "/v1/jobs/eager/phases/rollout/acquire", params={"wait_s": 0})
    api.request("POST", "/v1/jobs/eager/activate")
    with pytest.raises(ServiceError, match="409: .*rollout phase comes first"):
        api.request("POST", "/v1/jobs/eager/phases/train/acquire", params={"wait_s": 0})
    with pytest.raises(ServiceError, match="409"):
        api.request("POST", "/v1/jobs/eager/phases/rollout/release", json={"busy_s": 1.0})
    bad = httpx.post(service.url + "/v1/jobs/eager/phases/evaluate/acquire", headers=service.auth)
    assert bad.status_code == 422
