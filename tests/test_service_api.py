"""The HTTP API of a real control-plane process: the guard before the body, validation,
idempotent and transactional submission, paging, the CLI client."""

from __future__ import annotations

import importlib.metadata
import json
import socket
import stat
import time

import httpx
import pytest
import yaml
from typer.testing import CliRunner

import rollmux
from rollmux.cli.main import app
from tests.service_process import ServiceProcess

BALANCED = {"name": "a", "rollout_s": 100, "train_s": 100, "slo": 1.5, "rollout_mem_gb": 200, "train_mem_gb": 250}


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    process = ServiceProcess(tmp_path_factory.mktemp("service") / "state").start()
    yield process
    process.stop()


def post(service: ServiceProcess, body: dict | str, kind: str = "application/json", path: str = "/v1/jobs"):
    content = body if isinstance(body, str) else json.dumps(body)
    return httpx.post(service.url + path, content=content, headers={**service.auth, "Content-Type": kind}, timeout=30)


def get(service: ServiceProcess, path: str, **params):
    return httpx.get(service.url + path, headers=service.auth, params=params, timeout=30)


def names(service: ServiceProcess, **params) -> list[str]:
    return [j["name"] for j in get(service, "/v1/jobs", limit=1000, **params).json()["jobs"]]


def raw_request(service: ServiceProcess, head: str, body: bytes = b"") -> tuple[str, float]:
    """Send a request by hand (a declared body need not arrive); the status line and how
    long the answer took."""
    with socket.create_connection(("127.0.0.1", service.port), timeout=10) as conn:
        start = time.monotonic()
        conn.sendall(head.encode() + body)
        answer = conn.recv(4096).decode(errors="replace")
        return answer.split("\r\n")[0], time.monotonic() - start


def test_the_api_reports_the_installed_packages_version(service):
    """One version everywhere: the API's, the package's and the installed distribution's
    (pyproject.toml), so that a bump of one without the others fails here."""
    info = get(service, "/openapi.json").json()["info"]
    assert info["version"] == rollmux.__version__ == importlib.metadata.version("rollmux")


def test_token_file_is_private(service):
    assert stat.S_IMODE((service.state_dir / "token").stat().st_mode) == 0o600
    assert stat.S_IMODE(service.state_dir.stat().st_mode) == 0o700


@pytest.mark.parametrize("path", ["/v1/jobs", "/v1/groups", "/v1/cluster", "/v1/phases", "/metrics", "/openapi.json"])
def test_every_endpoint_needs_the_token(service, path):
    assert httpx.get(service.url + path).status_code == 401
    wrong = httpx.get(service.url + path, headers={"Authorization": "Bearer not-the-token"})
    assert wrong.status_code == 401 and wrong.headers["www-authenticate"] == "Bearer"


def test_probes_need_no_token(service):
    assert httpx.get(service.url + "/healthz").json() == {"status": "ok"}
    assert httpx.get(service.url + "/readyz").json() == {"status": "ready"}


def test_a_huge_body_is_refused_before_it_is_read(service):
    declared = "POST /v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 50000000\r\n"
    status, seconds = raw_request(service, declared + "\r\n", b"{")
    assert " 401 " in status and seconds < 5  # no token: refused without waiting for 50 MB
    status, seconds = raw_request(service, declared + f"Authorization: Bearer {service.token}\r\n\r\n", b"{")
    assert " 413 " in status and seconds < 5
    streamed = "POST /v1/jobs HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
    chunk = b"%x\r\n%s\r\n" % (2 << 20, b"x" * (2 << 20))
    status, _ = raw_request(service, streamed + f"Authorization: Bearer {service.token}\r\n\r\n", chunk)
    assert " 413 " in status


def test_deep_nesting_is_refused_with_422(service):
    deep = {**BALANCED, "name": "deep", "kind": "program", "entrypoint": "m:f", "iterations": 1}
    body = json.dumps(deep)[:-1] + ', "args": {"x": ' + "[" * 1000 + "]" * 1000 + "}}"
    response = post(service, body)
    assert response.status_code == 422 and "nested deeper" in response.json()["detail"][0]["msg"]
    flow_yaml = "name: deep-yaml\nrollout_s: 1\ntrain_s: 1\nargs: " + "[" * 1000 + "]" * 1000 + "\n"
    assert post(service, flow_yaml, kind="application/yaml").status_code == 422
    assert "deep" not in names(service) and "deep-yaml" not in names(service)


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
    assert a["state"] == "placed" and a["kind"] == "external"
    groups = get(service, "/v1/groups").json()
    assert [j["name"] for j in groups[0]["jobs"]] == ["a", "b"]
    summary = get(service, "/v1/cluster").json()
    assert summary["nodes"] == {"rollout": 1, "train": 1} and summary["jobs"]["placed"] >= 2
    assert 'rollmux_nodes{pool="rollout"} 1.0' in get(service, "/metrics").text


def test_invalid_specs_get_422_with_field_and_nothing_is_stored(service):
    before = names(service)
    cases = [
        ({**BALANCED, "name": "bad-slo", "slo": 0.5}, ["slo"]),
        ({**BALANCED, "name": "bad-time", "rollout_s": -3}, ["rollout_s"]),
        ({**BALANCED, "name": "../../etc/passwd"}, ["name"]),
        ({**BALANCED, "name": "x; DROP TABLE jobs"}, ["name"]),
        ({**BALANCED, "name": "extra", "gpu": "h100"}, ["gpu"]),
        ({**BALANCED, "name": "bad-entry", "entrypoint": "os.system('x')", "iterations": 1}, ["entrypoint"]),
    ]
    for body, loc in cases:
        response = post(service, body)
        assert response.status_code == 422, body
        assert response.json()["detail"][0]["loc"] == ["body", *loc]
    no_ray = post(service, {**BALANCED, "name": "grpo", "kind": "grpo", "iterations": 2})
    assert no_ray.status_code == 422 and "without Ray" in no_ray.text
    assert post(service, "{not json").status_code == 422
    assert post(service, "- a\n- b\n", kind="application/yaml").status_code == 422
    assert post(service, BALANCED, kind="text/csv").status_code == 415
    assert names(service) == before


def test_resubmission_is_answered_a_different_spec_is_refused(service):
    assert post(service, {**BALANCED, "name": "dup"}).status_code == 201
    again = post(service, {**BALANCED, "name": "dup"})
    assert again.status_code == 200 and again.json()["name"] == "dup"
    other = post(service, {**BALANCED, "name": "dup", "slo": 1.4})
    assert other.status_code == 409 and "another spec" in other.json()["detail"]
    assert get(service, "/v1/jobs/nobody").status_code == 404
    assert httpx.delete(service.url + "/v1/jobs/dup", headers=service.auth).json()["state"] == "cancelled"
    assert httpx.delete(service.url + "/v1/jobs/dup", headers=service.auth).status_code == 409
    assert post(service, {**BALANCED, "name": "dup"}).json()["state"] == "cancelled"


def test_a_plan_is_one_transaction(service):
    good = [{**BALANCED, "name": f"plan-{i}"} for i in range(3)]
    too_big = {**BALANCED, "name": "plan-big", "train_mem_gb": 5000}
    refused = post(service, {"jobs": [*good, too_big]}, path="/v1/plans")
    assert refused.status_code == 409 and "plan-big" in refused.json()["detail"]
    assert not [n for n in names(service) if n.startswith("plan-")]
    accepted = post(service, {"jobs": good}, path="/v1/plans")
    assert accepted.status_code == 201 and [j["name"] for j in accepted.json()] == ["plan-0", "plan-1", "plan-2"]
    twice = post(service, {"jobs": [{**BALANCED, "name": "plan-x"}, {**BALANCED, "name": "plan-x"}]}, path="/v1/plans")
    assert twice.status_code == 422 and "appears twice" in twice.text


def test_lists_filter_by_state_and_page_with_a_cursor(service):
    for i in range(5):
        post(service, {**BALANCED, "name": f"page-{i}"})
        if i % 2:
            httpx.delete(service.url + f"/v1/jobs/page-{i}", headers=service.auth)
    cancelled = names(service, state="cancelled")
    assert {"page-1", "page-3"} <= set(cancelled) and "page-0" not in cancelled
    everything, cursor = [], -1
    while cursor is not None:
        page = get(service, "/v1/jobs", limit=2, cursor=cursor).json()
        assert len(page["jobs"]) <= 2
        everything += [j["name"] for j in page["jobs"]]
        cursor = page["next_cursor"]
    assert everything == names(service)
    assert get(service, "/v1/jobs", state="sleeping").status_code == 422
    assert get(service, "/v1/jobs", limit=0).status_code == 422


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
    listed = json.loads(runner.invoke(app, ["status", *common]).output)
    assert "cli-job" in [j["name"] for j in listed]
    groups = json.loads(runner.invoke(app, ["groups", *common]).output)
    assert any(j["name"] == "cli-job" for g in groups for j in g["jobs"])
    assert json.loads(runner.invoke(app, ["cancel", "cli-job", *common]).output)["state"] == "cancelled"
    plan = tmp_path / "plan.yaml"
    plan.write_text(
        "jobs:\n  - {name: cli-p1, rollout_s: 10, train_s: 10}\n  - {name: cli-p2, rollout_s: 10, train_s: 10}\n"
    )
    planned = runner.invoke(app, ["submit", str(plan), *common])
    assert planned.exit_code == 0 and [j["name"] for j in json.loads(planned.output)] == ["cli-p1", "cli-p2"]
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nrollout_s: 1\ntrain_s: 1\nslo: 0\n")
    refused = runner.invoke(app, ["submit", str(bad), *common])
    assert refused.exit_code == 2 and "422" in refused.output and "field 'slo'" in refused.output


def test_a_job_that_does_not_fit_the_ray_cluster_waits_and_is_placed_when_nodes_free(tmp_path):
    service = ServiceProcess(tmp_path / "state", extra=("--rollout-nodes", "1", "--train-nodes", "1")).start(120)
    try:
        assert post(service, {**BALANCED, "name": "first"}).json()["state"] == "placed"
        assert post(service, {**BALANCED, "name": "mate"}).json()["state"] == "placed"  # packs: no new node
        loner = post(service, {**BALANCED, "name": "loner", "rollout_s": 900, "slo": 1.0})
        assert loner.status_code == 201 and loner.json()["state"] == "pending"
        assert "waiting for 1 free rollout node(s): 1 of 1 are in use" in loner.json()["reason"]
        wide = post(service, {**BALANCED, "name": "wide", "rollout_width": 2})
        assert wide.status_code == 409 and "needs 2 rollout node(s) at once; the cluster offers 1" in wide.text
        for name in ("first", "mate"):
            httpx.delete(service.url + f"/v1/jobs/{name}", headers=service.auth)
        placed = get(service, "/v1/jobs/loner").json()
        assert placed["state"] == "placed" and placed["reason"].startswith("waiting for its driver")
        kinds = [e["kind"] for e in get(service, "/v1/jobs/loner/events").json()]
        assert kinds == ["submitted", "placed"]
        history = [(n["pool"], n["held"]) for n in get(service, "/v1/nodes/log").json()]
        taken, given_back = [("rollout", True), ("train", True)], [("rollout", False), ("train", False)]
        assert history == taken + given_back + taken
    finally:
        service.stop()


def test_submit_takes_a_run_file_and_submits_its_jobs(service, tmp_path):
    """A run file is not a plan (its jobs are RollMux's to run, its cluster the embedded
    control plane's): `rollmux submit` sends its jobs as a plan, which this control plane
    without Ray refuses by their kind; the API names what it got."""
    run_file = tmp_path / "run.yaml"
    run_file.write_text(
        "policy: rollmux\ncluster: {rollout_nodes: 1, train_nodes: 1}\njobs:\n"
        "  - {name: run-a, iterations: 3, slo: 2.0}\n  - {name: run-b, iterations: 3, slo: 2.0, grpo: {seed: 1}}\n"
    )
    common = ["--url", service.url, "--state-dir", str(service.state_dir)]
    submitted = CliRunner().invoke(app, ["submit", str(run_file), *common])
    said = " ".join(submitted.output.split())
    assert submitted.exit_code == 2, said
    assert "job run-a: this control plane runs without Ray and cannot run a grpo job" in said
    assert "Extra inputs" not in said
    refused = post(service, yaml.safe_load(run_file.read_text()), path="/v1/plans")
    assert refused.status_code == 422 and "this is a run file" in refused.json()["detail"][0]["msg"]
    assert "rollmux submit FILE" in refused.json()["detail"][0]["msg"]


def test_a_client_with_no_control_plane_to_find_says_how_to_start_or_reach_one(tmp_path, monkeypatch):
    """No token in the state folder (no control plane ever served from it), none given:
    the client names the file it looked for and the ways out, and exits 2."""
    monkeypatch.delenv("ROLLMUX_TOKEN", raising=False)
    spec = tmp_path / "job.yaml"
    spec.write_text(yaml.safe_dump(BALANCED))
    told = CliRunner().invoke(app, ["submit", str(spec), "--state-dir", str(tmp_path / "nowhere")])
    said = " ".join(told.output.split())
    assert told.exit_code == 2, said
    assert f"no control plane's token in {tmp_path / 'nowhere' / 'token'}" in said
    assert "rollmux serve" in said and "--url" in said and "Errno" not in said


def test_a_token_the_client_cannot_read_is_named_with_the_reason(tmp_path, monkeypatch):
    """A token path the client cannot read (here a folder in its place; another user's
    mode-600 file fails the same way): the client names the file and the reason, not a raw
    OSError, and exits 2."""
    monkeypatch.delenv("ROLLMUX_TOKEN", raising=False)
    spec = tmp_path / "job.yaml"
    spec.write_text(yaml.safe_dump(BALANCED))
    token = tmp_path / "state" / "token"
    token.mkdir(parents=True)
    told = CliRunner().invoke(app, ["submit", str(spec), "--state-dir", str(tmp_path / "state")])
    said = " ".join(told.output.split())
    assert told.exit_code == 2, said
    assert f"cannot read the control plane's token {token}: Is a directory" in said
    assert "--token" in said and "Traceback" not in said and "Errno" not in said
