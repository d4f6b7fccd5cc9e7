"""The HTTP API of a real service process: auth, validation, placement views, CLI client."""

from __future__ import annotations

import json
import stat

import httpx
import pytest
from typer.testing import CliRunner

from rollmux.cli.main import app
from tests.service_process import ServiceProcess

BALANCED = {"name": "a", "rollout_s": 100, "train_s": 100, "slo": 1.5, "rollout_mem_gb": 200, "train_mem_gb": 250}


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    process = ServiceProcess(tmp_path_factory.mktemp("service")).start()
    yield process
    process.stop()


def post(service: ServiceProcess, body: dict | str, kind: str = "application/json", **kwargs) -> httpx.Response:
    content = body if isinstance(body, str) else json.dumps(body)
    headers = {**service.auth, "Content-Type": kind, **kwargs.pop("headers", {})}
    return httpx.post(service.url + "/v1/jobs", content=content, headers=headers, timeout=30)


def test_token_file_is_private(service):
    assert stat.S_IMODE((service.state_dir / "token").stat().st_mode) == 0o600
    assert stat.S_IMODE(service.state_dir.stat().st_mode) == 0o700


@pytest.mark.parametrize("path", ["/v1/jobs", "/v1/groups", "/v1/cluster", "/metrics", "/healthz", "/openapi.json"])
def test_every_endpoint_needs_the_token(service, path):
    assert httpx.get(service.url + path).status_code == 401
    wrong = httpx.get(service.url + path, headers={"Authorization": "Bearer not-the-token"})
    assert wrong.status_code == 401 and wrong.headers["www-authenticate"] == "Bearer"


def test_submission_is_placed_and_visible_everywhere(service):
    first = post(service, BALANCED)
    second = post(service, "name: b\nrollout_s: 100\ntrain_s: 100\nslo: 1.5\n", kind="application/yaml")
    assert first.status_code == 201 and second.status_code == 201
    a, b = first.json(), second.json()
    assert (a["group_id"], a["rollout_nodes"], a["train_nodes"]) == (
        b["group_id"],
        b["rollout_nodes"],
        b["train_nodes"],
    )
    groups = httpx.get(service.url + "/v1/groups", headers=service.auth).json()
    assert [j["name"] for j in groups[0]["jobs"]] == ["a", "b"]
    summary = httpx.get(service.url + "/v1/cluster", headers=service.auth).json()
    assert summary["nodes"] == {"rollout": 1, "train": 1}
    assert summary["bubble_fraction"] == pytest.approx(0.0)
    metrics = httpx.get(service.url + "/metrics", headers=service.auth).text
    assert 'rollmux_nodes{pool="rollout"} 1.0' in metrics


def test_invalid_specs_get_422_with_field_and_nothing_is_stored(service):
    def names() -> list[str]:
        return [j["name"] for j in httpx.get(service.url + "/v1/jobs", headers=service.auth).json()]

    before = names()
    cases = [
        ({**BALANCED, "name": "bad-slo", "slo": 0.5}, ["slo"]),
        ({**BALANCED, "name": "bad-time", "rollout_s": -3}, ["rollout_s"]),
        ({**BALANCED, "name": "../../etc/passwd"}, ["name"]),
        ({**BALANCED, "name": "x; DROP TABLE jobs"}, ["name"]),
        ({**BALANCED, "name": "extra", "gpu": "h100"}, ["gpu"]),
    ]
    for body, loc in cases:
        response = post(service, body)
        assert response.status_code == 422, body
        assert response.json()["detail"][0]["loc"] == ["body", *loc]
    assert post(service, "{not json").status_code == 422
    assert post(service, "- a\n- b\n", kind="application/yaml").status_code == 422
    assert post(service, BALANCED, kind="text/csv").status_code == 415
    assert names() == before


def test_duplicates_unknown_jobs_and_double_cancel(service):
    post(service, {**BALANCED, "name": "dup"})
    assert post(service, {**BALANCED, "name": "dup"}).status_code == 409
    assert httpx.get(service.url + "/v1/jobs/nobody", headers=service.auth).status_code == 404
    assert httpx.delete(service.url + "/v1/jobs/dup", headers=service.auth).json()["state"] == "cancelled"
    assert httpx.delete(service.url + "/v1/jobs/dup", headers=service.auth).status_code == 409


def test_cli_client_submit_status_groups_cancel(service, tmp_path):
    spec = tmp_path / "job.yaml"
    spec.write_text("name: cli-job\nrollout_s: 300\ntrain_s: 100\nslo: 1.2\n")
    common = ["--url", service.url, "--state-dir", str(service.state_dir), "--json"]
    runner = CliRunner()
    submitted = runner.invoke(app, ["submit", str(spec), *common])
    assert submitted.exit_code == 0, submitted.output
    assert json.loads(submitted.output)["state"] == "placed"
    shown = json.loads(runner.invoke(app, ["status", "cli-job", *common]).output)
    assert shown["name"] == "cli-job"
    groups = json.loads(runner.invoke(app, ["groups", *common]).output)
    assert any(j["name"] == "cli-job" for g in groups for j in g["jobs"])
    assert json.loads(runner.invoke(app, ["cancel", "cli-job", *common]).output)["state"] == "cancelled"
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nrollout_s: 1\ntrain_s: 1\nslo: 0\n")
    refused = runner.invoke(app, ["submit", str(bad), *common])
    assert refused.exit_code == 2 and "422" in refused.output and "field 'slo'" in refused.output


def test_service_on_ray_takes_its_pool_capacity_from_the_ray_cluster(tmp_path):
    service = ServiceProcess(tmp_path, extra=("--rollout-nodes", "1", "--train-nodes", "1")).start(timeout_s=120)
    try:
        assert post(service, {**BALANCED, "name": "first"}).status_code == 201
        assert post(service, {**BALANCED, "name": "mate"}).status_code == 201  # packs: no new node
        loner = post(service, {**BALANCED, "name": "loner", "rollout_s": 900, "slo": 1.0})
        assert loner.status_code == 409 and "no free rollout node" in loner.json()["detail"]
        names = [j["name"] for j in httpx.get(service.url + "/v1/jobs", headers=service.auth).json()]
        assert names == ["first", "mate"]
    finally:
        service.stop()
