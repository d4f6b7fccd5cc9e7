"""A client of ``rollmux serve``: the CLI's requests, and the phase API for jobs that run
their own workers and only ask RollMux for their turns."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

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
            timeout = kwargs.pop("timeout", 30.0)
            response = httpx.request(method, self.url + path, headers=headers, timeout=timeout, **kwargs)
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

    @contextmanager
    def phase(self, job: str, name: str, wait_s: float = 10.0) -> Iterator[list[int]]:
        """Hold ``name`` for ``job``: blocks (long polls) until the group's round-robin grants
        it, yields the phase's nodes, and reports the measured duration when the body ends."""
        while True:
            grant = self.request(
                "POST", f"/v1/jobs/{job}/phases/{name}/acquire", params={"wait_s": wait_s}, timeout=wait_s + 30
            )
            if grant["granted"]:
                break
        start = time.perf_counter()
        try:
            yield grant["nodes"]
        finally:
            busy_s = time.perf_counter() - start
            self.request("POST", f"/v1/jobs/{job}/phases/{name}/release", json={"busy_s": busy_s})


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
