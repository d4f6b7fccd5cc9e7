"""A client of the control plane: the CLI's requests, and the turn-taking protocol every
job speaks (RollMux's own drivers and jobs that run their own workers alike).

Requests are retried while the control plane is unreachable or restarting (up to
``retry_s``), which is safe because every request is idempotent: a resubmitted identical
job is answered with the job, an acquire returns the grant already held, a release of a
grant already released is answered, a repeated report replaces the same iteration.

The transport is urllib3 (keep-alive connections, no retries of its own): every phase of
every job makes one or two requests, and urllib3 spends about a third of the CPU per
request that httpx does in the driver processes.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urlsplit

import urllib3
import yaml

from rollmux.core.errors import RollMuxError, StaleEpoch

DEFAULT_PORT = 8765
DEFAULT_URL = f"http://127.0.0.1:{DEFAULT_PORT}"
DEFAULT_STATE_DIR = Path.home() / ".rollmux"
ERROR_HEADER = "x-rollmux-error"
TOKEN_FILE = "token"
"""The bearer token's file in the control plane's state folder (written by the service)."""


def read_token(state_dir: Path) -> str:
    path = Path(state_dir) / TOKEN_FILE
    token = path.read_text().strip()
    if not token:
        raise ValueError(f"{path} is empty: delete it to have a new token created")
    return token


class ServiceError(RollMuxError):
    """The control plane refused the request, or could not be reached in time."""

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status


class Client:
    def __init__(
        self, url: str | None = None, token: str | None = None, state_dir: Path | None = None, retry_s: float = 60.0
    ):
        self.url = (url or os.environ.get("ROLLMUX_URL") or DEFAULT_URL).rstrip("/")
        self.token = token or os.environ.get("ROLLMUX_TOKEN") or self._local_token(Path(state_dir or DEFAULT_STATE_DIR))
        self.retry_s = retry_s
        self.headers = {"Authorization": f"Bearer {self.token}"}
        self._prefix = urlsplit(self.url).path
        self._pool = urllib3.connection_from_url(self.url, maxsize=4, block=False, retries=False)

    @staticmethod
    def _local_token(state_dir: Path) -> str:
        """The token a control plane serving from ``state_dir`` on this machine wrote; a
        missing one means no control plane was ever started there, an unreadable one that
        it was started by another user (the file is the owner's only)."""
        try:
            return read_token(state_dir)
        except FileNotFoundError:
            raise ServiceError(
                f"no control plane's token in {state_dir / TOKEN_FILE}: start one with `rollmux serve` (it writes "
                "the token there), pass --state-dir of one that runs, or --token / $ROLLMUX_TOKEN and --url / "
                "$ROLLMUX_URL for one elsewhere; `rollmux run FILE` runs a run file with a control plane of its own"
            ) from None
        except (OSError, ValueError) as unreadable:
            raise ServiceError(
                f"cannot read the control plane's token {state_dir / TOKEN_FILE}: "
                f"{getattr(unreadable, 'strerror', None) or unreadable}; run as the user that started `rollmux serve`, "
                "or pass --token / $ROLLMUX_TOKEN"
            ) from None

    def request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: dict[str, Any] | None = None,
        content: bytes | None = None,
        headers: dict[str, str] | None = None,
        timeout: float = 30.0,
    ) -> Any:
        """One request; retried while the service is unreachable or not ready."""
        target = self._prefix + path
        if params:
            target += "?" + urlencode({k: v for k, v in params.items() if v is not None}, doseq=True)
        sent = {**self.headers, **(headers or {})}
        body = content
        if json is not None:
            body = _dumps(json)
            sent["Content-Type"] = "application/json"
        deadline = time.monotonic() + self.retry_s
        pause = 0.1
        while True:
            try:
                response = self._pool.request(method, target, body=body, headers=sent, timeout=timeout)
            except urllib3.exceptions.HTTPError as error:
                if time.monotonic() + pause > deadline:
                    raise ServiceError(f"cannot reach the RollMux control plane at {self.url}: {error}") from None
            else:
                if response.status != 503 or time.monotonic() + pause > deadline:
                    return _answer(response)
            time.sleep(pause)
            pause = min(2.0, pause * 2)

    def submit(self, spec_file: Path) -> Any:
        """Submit a job spec file (YAML or JSON): one job, or a plan with a ``jobs:`` list."""
        try:
            body = Path(spec_file).read_bytes()
        except FileNotFoundError:
            raise ServiceError(f"{spec_file}: file not found") from None
        kind = "application/json" if Path(spec_file).suffix == ".json" else "application/yaml"
        try:
            data = yaml.safe_load(body)
        except (yaml.YAMLError, RecursionError):
            data = None
        is_plan = isinstance(data, dict) and "jobs" in data
        return self.request(
            "POST", "/v1/plans" if is_plan else "/v1/jobs", content=body, headers={"Content-Type": kind}
        )

    def jobs(self, states: list[str] | None = None) -> list[dict[str, Any]]:
        """Every job (of these states), following the pages."""
        found, cursor = [], -1
        while cursor is not None:
            page = self.request("GET", "/v1/jobs", params={"state": states or [], "limit": 1000, "cursor": cursor})
            found += page["jobs"]
            cursor = page["next_cursor"]
        return found

    def phase_log(self) -> list[dict[str, Any]]:
        """The whole phase log, following the pages."""
        found: list[dict[str, Any]] = []
        while True:
            after = found[-1]["id"] if found else -1
            page = self.request("GET", "/v1/phases", params={"after": after, "limit": 10_000})
            if not page:
                return found
            found += page

    def session(self, job: str) -> TurnSession:
        """Begin a new session (incarnation) of ``job``: a new epoch, heartbeats started."""
        driver = {"pid": os.getpid(), "host": socket.gethostname()}
        return TurnSession(self, job, self.request("POST", f"/v1/jobs/{job}/sessions", json=driver))

    @contextmanager
    def running(self, job: str, iteration: int | None = None) -> Iterator[TurnSession]:
        """A session of a job that runs its own workers: activated on entry; on exit the job
        is complete (done), or failed with the exception that escaped."""
        turns = self.session(job)
        try:
            turns.activate(iteration)
            yield turns
        except StaleEpoch:
            raise
        except BaseException as failure:
            turns.complete(f"{type(failure).__name__}: {failure}")
            raise
        else:
            turns.complete()
        finally:
            turns.close()


@dataclass(frozen=True)
class Grant:
    phase: str
    nodes: tuple[int, ...]
    epoch: int
    token: int
    iteration: int
    rollout_nodes: tuple[int, ...] = ()
    """The job's seat when granted (it changes when the job is moved to another group)."""
    train_nodes: tuple[int, ...] = ()
    granted_perf: float = 0.0
    """When the control plane granted it, on this process's ``time.perf_counter`` clock
    (the answer says how long ago it was granted; its transit is not counted)."""


def _grant(answer: dict[str, Any]) -> Grant:
    return Grant(
        answer["phase"],
        tuple(answer["nodes"]),
        answer["epoch"],
        answer["token"],
        answer["iteration"],
        tuple(answer.get("rollout_nodes", ())),
        tuple(answer.get("train_nodes", ())),
        time.perf_counter() - answer.get("granted_ago_s", 0.0),
    )


class TurnSession:
    """One incarnation of a job talking to the control plane: it heartbeats its lease,
    asks for its phases in turn and hands them back, every call fenced by its epoch."""

    def __init__(self, client: Client, job: str, info: dict[str, Any], poll_s: float = 10.0):
        self.client = client
        self.job = job
        self.info = info
        self.epoch: int = info["epoch"]
        self.iteration: int = info["iteration"]
        self.lease_s: float = info["lease_s"]
        self.poll_s = min(poll_s, self.lease_s / 2)
        self._ahead: Grant | None = None
        self._heartbeat = _Heartbeat(
            Client(client.url, client.token, retry_s=self.lease_s), job, self.epoch, self.lease_s
        )
        self._heartbeat.start()

    def activate(self, iteration: int | None = None, restored: str | None = None) -> dict[str, Any]:
        """Join the group's turns, resuming at ``iteration`` (None: where the control plane
        counts); ``restored`` says where the trainer came from (checkpoint, kept, replica)."""
        body = {"epoch": self.epoch, "iteration": iteration} | ({"restored": restored} if restored else {})
        view = self._post("activate", body)
        self.iteration = view["iterations"]
        return view

    def acquire(self, phase: str) -> Grant:
        """Block until the group grants ``phase`` (long polls; the grant survives a lost reply).
        A grant that came with the last release is returned at once."""
        ahead, self._ahead = self._ahead, None
        if ahead is not None and ahead.phase == phase:
            return ahead
        while True:
            answer = self.client.request(
                "POST",
                f"/v1/jobs/{self.job}/phases/{phase}/acquire",
                params={"epoch": self.epoch, "wait_s": self.poll_s},
                timeout=self.poll_s + 30,
            )
            if answer["granted"]:
                return _grant(answer)

    def release(
        self,
        grant: Grant,
        busy_s: float,
        wake_s: float = 0.0,
        sleep_s: float = 0.0,
        report: tuple[dict[str, float], int | None] | None = None,
    ) -> None:
        """Hand the phase back, with the metrics reported during it (``report``: metrics and
        iteration, default the grant's; recorded as :meth:`report` records them, in the same
        round trip and commit).
        After a rollout (always followed by training) the same call asks for the training
        phase: the job queues for it from this instant, and if its turn is already there,
        the next :meth:`acquire` needs no round trip. After training it does not (the job
        may be over)."""
        body: dict[str, Any] = {
            "epoch": self.epoch,
            "token": grant.token,
            "busy_s": busy_s,
            "wake_s": wake_s,
            "sleep_s": sleep_s,
        }
        if report is not None:
            metrics, iteration = report
            body["progress"] = {"iteration": grant.iteration if iteration is None else iteration, "metrics": metrics}
        params = {"then_wait_s": 0} if grant.phase == "rollout" else None
        answer = self.client.request(
            "POST", f"/v1/jobs/{self.job}/phases/{grant.phase}/release", params=params, json=body
        )
        following = answer.get("next") or {}
        self._ahead = _grant(following) if following.get("granted") else None
        if grant.phase == "train":
            self.iteration = grant.iteration + 1

    def current(self, phase: str) -> Grant:
        """The grant held now for ``phase``, as the control plane has it: an elastic
        rollout's nodes grow as the group's other rollouts free theirs."""
        answer = self.client.request(
            "POST", f"/v1/jobs/{self.job}/phases/{phase}/acquire", params={"epoch": self.epoch, "wait_s": 0}
        )
        if not answer["granted"]:
            raise ServiceError(f"{self.job} holds no {phase} grant any more")
        return _grant(answer)

    def shed(self, grant: Grant, keep: tuple[int, ...]) -> Grant:
        """Give back every node of an elastic rollout but ``keep``; returns the grant now."""
        body = {"epoch": self.epoch, "token": grant.token, "keep": list(keep)}
        return _grant(self.client.request("POST", f"/v1/jobs/{self.job}/phases/{grant.phase}/shed", json=body))

    @contextmanager
    def phase(self, name: str) -> Iterator[Grant]:
        """Hold ``name``: yields the grant (its nodes) and releases it with the measured
        duration when the body ends."""
        grant = self.acquire(name)
        start = time.perf_counter()
        try:
            yield grant
        finally:
            self.release(grant, time.perf_counter() - start)

    def report(self, metrics: dict[str, float], iteration: int | None = None) -> None:
        """Metrics of an iteration (default: the last one trained)."""
        at = max(0, self.iteration - 1) if iteration is None else iteration
        self._post("progress", {"epoch": self.epoch, "iteration": at, "metrics": metrics})

    def complete(self, error: str = "") -> None:
        """The job ended: done, or failed with ``error``."""
        self._post("complete", {"epoch": self.epoch, "error": error[:4000]})

    def close(self) -> None:
        self._heartbeat.stop()

    def _post(self, action: str, body: dict[str, Any]) -> Any:
        return self.client.request("POST", f"/v1/jobs/{self.job}/{action}", json=body)


class _Heartbeat(threading.Thread):
    """Renews the session's lease every quarter lease until stopped or fenced out."""

    def __init__(self, client: Client, job: str, epoch: int, lease_s: float):
        super().__init__(name=f"rollmux-heartbeat-{job}", daemon=True)
        self.client, self.job, self.epoch, self.period = client, job, epoch, lease_s / 4
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.wait(self.period):
            try:
                self.client.request("POST", f"/v1/jobs/{self.job}/heartbeat", json={"epoch": self.epoch})
            except StaleEpoch:
                return
            except ServiceError as error:
                if error.status is not None:
                    return

    def stop(self) -> None:
        self.halt.set()


def _dumps(value: Any) -> bytes:
    return json.dumps(value, allow_nan=False).encode()


def _answer(response: urllib3.BaseHTTPResponse) -> Any:
    if response.status < 400:
        return json.loads(response.data)
    detail = _problem(response)
    if response.headers.get(ERROR_HEADER) == "StaleEpoch":
        raise StaleEpoch(detail)
    raise ServiceError(f"{response.status}: {detail}", response.status)


def _problem(response: urllib3.BaseHTTPResponse) -> str:
    try:
        detail = json.loads(response.data).get("detail")
    except (ValueError, AttributeError):
        return response.data.decode(errors="replace")
    if isinstance(detail, list):
        return "; ".join(
            f"field '{'.'.join(map(str, d.get('loc', [])[1:]) or 'body')}': {d.get('msg')}" for d in detail
        )
    return str(detail)
