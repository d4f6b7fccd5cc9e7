"""CLI commands that talk to a running ``rollmux serve``: submit, status, cancel, groups."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.table import Table

from rollmux.core.errors import RollMuxError
from rollmux.service.auth import read_token
from rollmux.service.server import DEFAULT_PORT, DEFAULT_STATE_DIR

DEFAULT_URL = f"http://127.0.0.1:{DEFAULT_PORT}"


class ServiceError(RollMuxError):
    """The service refused the request or could not be reached."""


class Client:
    def __init__(self, url: str | None, token: str | None, state_dir: Path | None = None):
        self.url = (url or os.environ.get("ROLLMUX_URL") or DEFAULT_URL).rstrip("/")
        self.token = token or os.environ.get("ROLLMUX_TOKEN") or read_token(state_dir or DEFAULT_STATE_DIR)

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        headers = {"Authorization": f"Bearer {self.token}", **kwargs.pop("headers", {})}
        try:
            response = httpx.request(method, self.url + path, headers=headers, timeout=30, **kwargs)
        except httpx.HTTPError as error:
            raise ServiceError(f"cannot reach the RollMux service at {self.url}: {error}") from None
        if response.status_code >= 400:
            raise ServiceError(f"{response.status_code}: {_problem(response)}")
        return response.json()

    def submit(self, spec_file: Path) -> Any:
        try:
            body = Path(spec_file).read_bytes()
        except FileNotFoundError:
            raise ServiceError(f"{spec_file}: file not found") from None
        kind = "application/json" if Path(spec_file).suffix == ".json" else "application/yaml"
        return self.request("POST", "/v1/jobs", content=body, headers={"Content-Type": kind})


def _problem(response: httpx.Response) -> str:
    try:
        detail = response.json().get("detail")
    except ValueError:
        return response.text
    if isinstance(detail, list):
        return "; ".join(
            f"field '{'.'.join(map(str, d.get('loc', [])[1:]) or 'body')}': {d.get('msg')}" for d in detail
        )
    return str(detail)


def jobs_table(jobs: list[dict[str, Any]]) -> Table:
    table = Table(title="jobs")
    for column in ("name", "state", "group", "rollout nodes", "train nodes", "slowdown", "SLO", "iterations", "cost $"):
        table.add_column(column, justify="left" if column in ("name", "state") else "right")
    for job in jobs:
        table.add_row(
            job["name"],
            job["state"],
            "-" if job["group_id"] is None else str(job["group_id"]),
            " ".join(map(str, job["rollout_nodes"])),
            " ".join(map(str, job["train_nodes"])),
            "-" if job["slowdown"] is None else f"{job['slowdown']:.3f}",
            f"{job['slo']:.2f}",
            str(job["iterations"]),
            f"{job['cost_usd']:.2f}",
        )
    return table


def groups_table(groups: list[dict[str, Any]]) -> Table:
    table = Table(title="co-execution groups")
    for column in ("group", "rollout nodes", "train nodes", "cycle s", "jobs (slowdown / SLO)"):
        table.add_column(column, justify="right" if column == "cycle s" else "left")
    for g in groups:
        jobs = ", ".join(f"{j['name']} {j['slowdown']:.3f}/{j['slo']:.2f}" for j in g["jobs"])
        table.add_row(
            str(g["id"]),
            " ".join(map(str, g["rollout_nodes"])),
            " ".join(map(str, g["train_nodes"])),
            f"{g['cycle_s']:.1f}",
            jobs,
        )
    return table


def emit(console: Console, data: Any, as_json: bool, table: Table | None = None) -> None:
    if as_json:
        console.print_json(json.dumps(data))
    elif table is not None:
        console.print(table)
