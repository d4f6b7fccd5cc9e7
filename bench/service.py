"""Sustained submissions against a local ``rollmux serve`` (SQLite, WAL, fsync on commit).

Starts a fresh service process, then ``--clients`` threads submit ``--jobs`` production-
shaped jobs as fast as the service acknowledges them (each acknowledgement means the
placement is committed to disk). The same clients' ``/healthz`` round trip is measured in
the same run, so the cost of a durable placement shows as a ratio to a bare request.
With ``--pollers N``, N more clients then read the regrouping round log
(``GET /v1/regrouping/rounds``, whole pages) all at once, while one client's ``/healthz``
round trip is measured beside them for as long as they read: its ratio to the same
client's round trip alone, just before, shows what the readers cost everyone else.
Last line: ``submit_per_s=… p99_ms=…``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.service_process import ServiceProcess  # noqa: E402
from tests.test_service_crash import spec  # noqa: E402


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def timed_calls(call, count: int, clients: int) -> tuple[list[float], float]:
    """Latencies (ms) of ``count`` calls from ``clients`` threads, and the wall time (s)."""

    def one(i: int) -> float:
        start = time.perf_counter()
        call(i)
        return (time.perf_counter() - start) * 1000

    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=clients) as pool:
        latencies = list(pool.map(one, range(count)))
    return latencies, time.perf_counter() - start


def poll_round_log(service: ServiceProcess, pollers: int) -> None:
    """``pollers`` clients read the whole round log at once, each on its own connection,
    while one more client's ``/healthz`` round trip is timed for as long as they read; the
    same client's round trip alone, just before, is the baseline."""
    limits = httpx.Limits(max_connections=pollers + 1, max_keepalive_connections=pollers + 1)
    with httpx.Client(headers=service.auth, timeout=120, limits=limits) as client:

        def health() -> float:
            start = time.perf_counter()
            client.get(service.url + "/healthz").raise_for_status()
            return (time.perf_counter() - start) * 1000

        def read(_i: int) -> None:
            response = client.get(service.url + "/v1/regrouping/rounds", params={"after": -1, "limit": 10_000})
            response.raise_for_status()

        alone = [health() for _ in range(200)]
        reading = threading.Event()
        reading.set()

        def probe() -> list[float]:
            beside = []
            while reading.is_set():
                beside.append(health())
            return beside

        with ThreadPoolExecutor(max_workers=1) as prober:
            beside = prober.submit(probe)
            read_ms, wall = timed_calls(read, pollers, pollers)
            reading.clear()
            beside_ms = beside.result()
        rounds = len(client.get(service.url + "/v1/regrouping/rounds").json())
    print(
        f"pollers={pollers} rounds_kept={rounds} wall_s={wall:.1f} read_ms p50={statistics.median(read_ms):.1f} "
        f"p99={quantile(read_ms, 0.99):.1f} healthz_alone_p50_ms={statistics.median(alone):.2f} "
        f"healthz_beside_p50_ms={statistics.median(beside_ms):.2f} "
        f"healthz_beside_over_alone={statistics.median(beside_ms) / statistics.median(alone):.1f}x"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--pollers", type=int, default=0, help="clients reading the round log at once afterwards")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        service = ServiceProcess(Path(folder) / "state").start()
        try:
            with httpx.Client(headers=service.auth, timeout=60) as client:

                def health(_i: int) -> None:
                    client.get(service.url + "/healthz").raise_for_status()

                def submit(i: int) -> None:
                    response = client.post(service.url + "/v1/jobs", json=spec(i))
                    if response.status_code != 201:
                        raise RuntimeError(f"submission {i}: {response.status_code} {response.text}")

                health_ms, _ = timed_calls(health, args.jobs, args.clients)
                submit_ms, wall = timed_calls(submit, args.jobs, args.clients)
                groups = len(client.get(service.url + "/v1/groups").json())
            if args.pollers:
                poll_round_log(service, args.pollers)
        finally:
            service.stop()
    p50, p99 = statistics.median(submit_ms), quantile(submit_ms, 0.99)
    print(f"jobs={args.jobs} clients={args.clients} groups={groups} wall_s={wall:.1f}")
    print(f"healthz_ms p50={statistics.median(health_ms):.2f} p99={quantile(health_ms, 0.99):.2f}")
    print(f"submit_ms p50={p50:.2f}; submit_over_healthz_p50={p50 / statistics.median(health_ms):.1f}x")
    print(f"submit_per_s={args.jobs / wall:.1f} p99_ms={p99:.2f}")


if __name__ == "__main__":
    main()
