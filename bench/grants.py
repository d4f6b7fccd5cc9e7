"""Many emulated jobs alternate through one control plane: grant throughput and latency,
probe latency under load, and no overlap, no lost grant.

Starts ``rollmux serve --no-ray`` (SQLite, every grant committed before it is returned),
submits ``--jobs`` jobs that run their own (emulated) workers, and drives them all from
this process for ``--seconds``: each job takes its turns (acquire → wait ``--phase-ms``,
as a GPU phase waits, no CPU spin → release) through the HTTP API. The jobs' SLO packs
``--group`` of them per group, so most of them wait in long polls while each node serves
one job at a time. Measured in the same run:

- grant latency: from the moment a job's turn could start (its request, or the release of
  the node's previous holder, whichever is later) to the grant arriving at the job, all on
  this process's clock; it is what the control plane adds to every phase switch;
- ``/healthz`` and ``GET /v1/jobs`` round trips probed during the load;
- overlaps: instants with two jobs on one node, in what the jobs really did and in the
  persisted phase log; lost grants: grants revoked or never seen by their job.

Last line: ``grants_per_s=… grant_p99_ms=… healthz_p99_ms=… overlaps=… lost_grants=…``.
Targets (issue 8): overlaps 0, lost 0, healthz_p99_ms ≤ 100, grant_p99_ms ≤ 200.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
WAIT_S = 10.0
from tests.service_process import ServiceProcess  # noqa: E402


@dataclass
class Node:
    """What the bench saw of one node: when its last holder released it."""

    released_at: float = 0.0


@dataclass
class Tally:
    latencies_ms: list[float] = field(default_factory=list)
    spans: dict[int, list[tuple[float, float, str]]] = field(default_factory=dict)
    tokens: set[int] = field(default_factory=set)
    nodes: dict[int, Node] = field(default_factory=dict)
    grants_in_window: int = 0


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


class Connection:
    """One job's keep-alive HTTP/1.1 connection, written by hand: a full HTTP client costs
    more CPU per request than the control plane does, and on a 2-core machine the emulated
    jobs would then measure themselves instead of the control plane."""

    def __init__(self, service: ServiceProcess):
        self.port = service.port
        self.head = f"Host: bench\r\nAuthorization: Bearer {service.token}\r\nContent-Type: application/json\r\n"
        self.streams: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None

    async def call(self, method: str, path: str, body: dict | None = None) -> dict:
        """One request, retried on a dropped connection as the real client does (every
        request of the protocol is idempotent)."""
        payload = json.dumps(body).encode() if body is not None else b""
        request = f"{method} {path} HTTP/1.1\r\n{self.head}Content-Length: {len(payload)}\r\n\r\n".encode()
        for attempt in range(5):
            try:
                if self.streams is None:
                    self.streams = await asyncio.open_connection("127.0.0.1", self.port)
                reader, writer = self.streams
                writer.write(request + payload)
                status = int((await reader.readline()).split()[1])
                length = 0
                while (line := await reader.readline()) not in (b"\r\n", b""):
                    name, _, value = line.partition(b":")
                    if name.lower() == b"content-length":
                        length = int(value)
                answer = json.loads(await reader.readexactly(length))
            except (OSError, IndexError, asyncio.IncompleteReadError):
                self.streams = None
                await asyncio.sleep(0.05 * (attempt + 1))
                continue
            assert status < 300, f"{path}: {status} {answer}"
            return answer
        raise RuntimeError(f"{path}: connection kept failing")

    def close(self) -> None:
        if self.streams is not None:
            self.streams[1].close()


async def run_job(service: ServiceProcess, name: str, phase_s: float, window: tuple[float, float], tally: Tally):
    """One job with its own connection, as a job's driver process would have: it holds each
    phase for ``phase_s`` and hands it back asking for its next one in the same call."""
    api = Connection(service)
    base = f"/v1/jobs/{name}"
    epoch = (await api.call("POST", f"{base}/sessions", {"pid": 0, "host": "bench"}))["epoch"]
    await api.call("POST", f"{base}/activate", {"epoch": epoch})
    phase, asked = "rollout", time.monotonic()
    grant = await api.call("POST", f"{base}/phases/rollout/acquire?epoch={epoch}&wait_s={WAIT_S}")
    while time.monotonic() < window[1]:
        while not grant["granted"]:
            grant = await api.call("POST", f"{base}/phases/{phase}/acquire?epoch={epoch}&wait_s={WAIT_S}")
        received = time.monotonic()
        ready = max([asked] + [tally.nodes.setdefault(n, Node()).released_at for n in grant["nodes"]])
        if window[0] <= received <= window[1]:
            tally.latencies_ms.append(1000 * (received - ready))
            tally.grants_in_window += 1
        tally.tokens.add(grant["token"])
        await asyncio.sleep(phase_s)
        asked = time.monotonic()
        for node in grant["nodes"]:
            tally.spans.setdefault(node, []).append((received, asked, name))
            tally.nodes[node].released_at = asked
        body = {"epoch": epoch, "token": grant["token"], "busy_s": phase_s}
        released = await api.call("POST", f"{base}/phases/{phase}/release?then_wait_s={WAIT_S}", body)
        phase, grant = ("train" if phase == "rollout" else "rollout"), released["next"]
    if grant["granted"]:
        tally.tokens.add(grant["token"])
        body = {"epoch": epoch, "token": grant["token"], "busy_s": 0.0}
        await api.call("POST", f"{base}/phases/{phase}/release", body)
    await api.call("POST", f"{base}/complete", {"epoch": epoch})
    api.close()


async def probe(api: httpx.AsyncClient, path: str, until: float, every_s: float) -> list[float]:
    latencies = []
    while time.monotonic() < until:
        start = time.monotonic()
        (await api.get(path)).raise_for_status()
        latencies.append(1000 * (time.monotonic() - start))
        await asyncio.sleep(every_s)
    return latencies


def overlaps(spans: dict[int, list[tuple[float, float, str]]]) -> int:
    count = 0
    for intervals in spans.values():
        intervals.sort()
        count += sum(1 for a, b in zip(intervals, intervals[1:], strict=False) if b[0] < a[1] - 1e-6)
    return count


async def bench(service: ServiceProcess, args: argparse.Namespace) -> None:
    names = [f"job-{i}" for i in range(args.jobs)]
    phase_s = args.phase_ms / 1000
    spec = {"rollout_s": phase_s, "train_s": phase_s, "slo": args.group / 2}
    async with httpx.AsyncClient(base_url=service.url, headers=service.auth, timeout=60) as api:
        for start in range(0, args.jobs, 1000):
            plan = {"jobs": [{"name": n, **spec} for n in names[start : start + 1000]]}
            (await api.post("/v1/plans", json=plan)).raise_for_status()
        groups = len((await api.get("/v1/groups")).json())
        tally = Tally()
        begin = time.monotonic() + args.warmup
        window = (begin, begin + args.seconds)
        jobs = [asyncio.create_task(run_job(service, n, phase_s, window, tally)) for n in names]
        async with httpx.AsyncClient(base_url=service.url, headers=service.auth, timeout=60) as prober:
            health = asyncio.create_task(probe(prober, "/healthz", window[1], 0.05))
            listing = asyncio.create_task(probe(prober, "/v1/jobs?limit=100", window[1], 0.2))
            await asyncio.gather(*jobs)
            health_ms, list_ms = await health, await listing
        log, after = [], -1
        while True:
            page = (await api.get("/v1/phases", params={"after": after, "limit": 10_000})).json()
            if not page:
                break
            log += page
            after = page[-1]["id"]
        summary = (await api.get("/v1/cluster")).json()
    logged: dict[int, list[tuple[float, float, str]]] = {}
    for entry in log:
        for node in entry["nodes"]:
            logged.setdefault(node, []).append((entry["granted_at"], entry["ended_at"], entry["job"]))
    revoked = sum(1 for e in log if e["outcome"] != "released")
    unseen = len({e["token"] for e in log} - tally.tokens)
    overlap = overlaps(tally.spans) + overlaps(logged)
    grants_per_s = tally.grants_in_window / args.seconds
    print(
        f"jobs={args.jobs} groups={groups} phase_ms={args.phase_ms} seconds={args.seconds} "
        f"commits={summary['commits_since_start']} phases_logged={len(log)}"
    )
    print(f"grant_ms p50={statistics.median(tally.latencies_ms):.1f} p99={quantile(tally.latencies_ms, 0.99):.1f}")
    print(f"healthz_ms p50={statistics.median(health_ms):.1f} p99={quantile(health_ms, 0.99):.1f}")
    print(f"list_jobs_ms p50={statistics.median(list_ms):.1f} p99={quantile(list_ms, 0.99):.1f}")
    print(
        f"grants_per_s={grants_per_s:.0f} grant_p99_ms={quantile(tally.latencies_ms, 0.99):.1f} "
        f"healthz_p99_ms={quantile(health_ms, 0.99):.1f} overlaps={overlap} lost_grants={revoked + unseen}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=30.0, help="measured window")
    parser.add_argument("--warmup", type=float, default=5.0, help="seconds before the window opens")
    parser.add_argument("--phase-ms", type=float, default=40.0, help="each emulated phase waits this long")
    parser.add_argument("--group", type=int, default=40, help="jobs per group (sets their SLO)")
    args = parser.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 4 * args.jobs + 256)), hard))
    with tempfile.TemporaryDirectory() as folder:
        service = ServiceProcess(
            Path(folder) / "state", extra=("--no-ray", "--lease-s", "30", "--no-regroup", "--no-slo-guard")
        ).start()
        try:
            asyncio.run(bench(service, args))
        finally:
            service.stop()


if __name__ == "__main__":
    main()
