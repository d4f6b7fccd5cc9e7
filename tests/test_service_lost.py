"""A job nobody runs does not keep its nodes. On a real control-plane process (no Ray,
short lease and grace): an external job whose driver vanished (its lease lost), or whose
driver never came, is unseated after its grace — its nodes released, its cost stopped,
``pending`` with the reason — and admission does not seat it again until its driver opens
a session, which places it. An external job is labelled as such from its submission."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rollmux.cli.main import app
from rollmux.wire.client import Client
from tests.service_process import ServiceProcess
from tests.test_recovery import wait_until

SPEC = {"rollout_s": 1.0, "train_s": 1.0, "slo": 2.0}
LEASE_S = 1.0
GRACE_S = 3.0
EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


@pytest.fixture()
def service(tmp_path):
    extra = ("--no-ray", "--lease-s", str(LEASE_S), "--lost-grace-s", str(GRACE_S), "--no-regroup", "--no-slo-guard")
    process = ServiceProcess(tmp_path / "state", extra=extra).start()
    yield process
    process.stop()


def view(api: Client, name: str) -> dict:
    return api.request("GET", f"/v1/jobs/{name}")


def in_state(api: Client, name: str, state: str) -> dict | None:
    found = view(api, name)
    return found if found["state"] == state else None


def test_a_lost_external_job_frees_its_nodes_after_its_grace_and_its_returning_driver_is_placed_again(service):
    api = Client(service.url, service.token)
    placed = api.request("POST", "/v1/jobs", json={"name": "gone", **SPEC})
    assert placed["state"] == "placed" and placed["lost_grace_s"] == GRACE_S
    epoch = api.request("POST", "/v1/jobs/gone/sessions", json={"pid": 1, "host": "test"})["epoch"]
    api.request("POST", "/v1/jobs/gone/activate", json={"epoch": epoch})
    assert api.request("POST", "/v1/jobs/gone/phases/rollout/acquire", params={"epoch": epoch, "wait_s": 0})["granted"]
    # ... and then its driver vanishes: no heartbeat, no release.
    lost = wait_until(lambda: in_state(api, "gone", "lost"), timeout_s=30)
    assert lost["unseat_at"] is not None and lost["rollout_nodes"]
    held = api.request("GET", "/v1/cluster")
    assert sum(held["nodes"].values()) == 2 and held["cost_usd_per_hour"] > 0

    unseated = wait_until(lambda: in_state(api, "gone", "pending"), timeout_s=30)
    assert unseated["reason"].startswith(f"lost for {GRACE_S:g} s (lease expired")
    assert "unseated, its nodes released" in unseated["reason"] and unseated["parked"]
    assert (unseated["group_id"], unseated["rollout_nodes"], unseated["unseat_at"]) == (None, [], None)
    cluster = api.request("GET", "/v1/cluster")
    assert cluster["nodes"] == {"rollout": 0, "train": 0} and cluster["cost_usd_per_hour"] == 0.0
    assert [n["held"] for n in api.request("GET", "/v1/nodes/log")] == [True, True, False, False]
    kinds = [e["kind"] for e in api.request("GET", "/v1/jobs/gone/events")]
    assert kinds[-2:] == ["lost", "unseated"]

    api.request("POST", "/v1/jobs", json={"name": "other", **SPEC})  # admission runs: it does not seat "gone"
    assert view(api, "gone")["state"] == "pending"
    assert 0 < unseated["cost_usd"] == view(api, "gone")["cost_usd"]  # its cost stopped

    again = api.request("POST", "/v1/jobs/gone/sessions", json={"pid": 2, "host": "test"})  # its driver returns
    assert again["epoch"] == epoch + 1 and again["rollout_nodes"] and again["train_nodes"]
    assert view(api, "gone")["state"] == "starting"
    assert [e["kind"] for e in api.request("GET", "/v1/jobs/gone/events")][-3:] == ["requeued", "placed", "session"]


def test_an_external_job_no_driver_comes_for_is_unseated_after_its_grace(service):
    api = Client(service.url, service.token)
    placed = api.request("POST", "/v1/jobs", json={"name": "idle", **SPEC})
    assert placed["reason"].startswith("waiting for its driver: an external job runs only when its owner opens")
    assert placed["unseat_at"] == pytest.approx(placed["submitted_at"] + GRACE_S, abs=1.0)
    unseated = wait_until(lambda: in_state(api, "idle", "pending"), timeout_s=30)
    assert unseated["reason"].startswith(f"no driver came within {GRACE_S:g} s: unseated")
    assert api.request("GET", "/v1/cluster")["nodes"] == {"rollout": 0, "train": 0}


def test_rollmux_submit_says_an_external_job_waits_for_its_driver(service):
    common = ["--url", service.url, "--state-dir", str(service.state_dir)]
    runner = CliRunner()
    shown = runner.invoke(app, ["submit", str(EXAMPLES / "external-job.yaml"), *common, "--json"])
    assert shown.exit_code == 0, shown.output
    answer = json.loads(shown.output)
    assert answer["state"] == "placed" and answer["reason"].startswith("waiting for its driver")
    table = runner.invoke(app, ["submit", str(EXAMPLES / "external-job.yaml"), *common])  # a retry: answered
    assert table.exit_code == 0 and "waiting for its" in table.output, table.output
