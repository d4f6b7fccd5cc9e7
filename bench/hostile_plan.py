"""A plan of many small jobs with loose SLOs against a default ``rollmux serve --no-ray``.

Loose SLOs make nearly every grouping feasible; before the planner's bounds one such plan
of 46 jobs took the control plane past 23 GB. This starts a real service process, samples
``/healthz`` every ``--interval-s`` over one keep-alive connection for ``--idle-s`` (the
baseline), submits each plan in turn and keeps sampling for ``--seconds`` after it,
while reading the server's resident memory. Prints, per plan: peak RSS, /healthz p50/p99
and max (and p99 over the idle p99 of the same run), jobs placed, largest group, and the
regrouping rounds and those stopped on their work budget. Targets: peak RSS <= 1 GB,
/healthz p99 <= 100 ms, every job placed.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.service_process import ServiceProcess  # noqa: E402

PLANS = {"46x-slo60": (46, 60.0), "200x-slo100": (200, 100.0)}


def plan_body(prefix: str, count: int, slo: float) -> dict:
    jobs = [
        {
            "name": f"{prefix}-{i}",
            "rollout_s": 1,
            "train_s": 1,
            "slo": slo,
            "rollout_mem_gb": 0.01,
            "train_mem_gb": 0.01,
        }
        for i in range(count)
    ]
    return {"jobs": jobs}


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class Sampler:
    """/healthz latency and the server's RSS, sampled on a thread until stopped."""

    def __init__(self, service: ServiceProcess, interval_s: float):
        self.service, self.interval_s = service, interval_s
        self.latencies_ms: list[float] = []
        self.peak_rss = 0
        self.failures = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        process = psutil.Process(self.service.process.pid)
        with httpx.Client(timeout=5) as client:
            while not self._stop.is_set():
                self.peak_rss = max(self.peak_rss, process.memory_info().rss)
                started = time.perf_counter()
                try:
                    client.get(self.service.url + "/healthz").raise_for_status()
                    self.latencies_ms.append((time.perf_counter() - started) * 1000)
                except httpx.HTTPError:
                    self.failures += 1
                self._stop.wait(self.interval_s)


def jobs_of(service: ServiceProcess, prefix: str) -> list[dict]:
    found, cursor = [], -1
    while cursor is not None:
        page = httpx.get(service.url + "/v1/jobs", headers=service.auth, params={"cursor": cursor, "limit": 1000})
        body = page.raise_for_status().json()
        found += [j for j in body["jobs"] if j["name"].startswith(prefix + "-")]
        cursor = body["next_cursor"]
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0, help="sampling after each plan is submitted")
    parser.add_argument("--idle-s", type=float, default=5.0, help="sampling before any plan (the baseline)")
    parser.add_argument("--interval-s", type=float, default=0.05)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        service = ServiceProcess(Path(folder) / "state").start()
        try:
            with Sampler(service, args.interval_s) as idle:
                time.sleep(args.idle_s)
            idle_p99 = quantile(idle.latencies_ms, 0.99)
            print(f"idle healthz_ms p50={statistics.median(idle.latencies_ms):.1f} p99={idle_p99:.1f}")
            for name, (count, slo) in PLANS.items():
                with Sampler(service, args.interval_s) as busy:
                    answer = httpx.post(
                        service.url + "/v1/plans", json=plan_body(name, count, slo), headers=service.auth, timeout=120
                    )
                    answer.raise_for_status()
                    time.sleep(args.seconds)
                jobs = jobs_of(service, name)
                placed = sum(j["state"] == "placed" for j in jobs)
                groups: dict[int, int] = {}
                for job in jobs:
                    groups[job["group_id"]] = groups.get(job["group_id"], 0) + 1
                regrouping = httpx.get(service.url + "/v1/cluster", headers=service.auth).json()["regrouping"]
                p50, p99 = statistics.median(busy.latencies_ms), quantile(busy.latencies_ms, 0.99)
                print(
                    f"{name} peak_rss_mb={busy.peak_rss / 2**20:.0f} healthz_ms p50={p50:.1f} p99={p99:.1f} "
                    f"max={max(busy.latencies_ms):.1f} p99_over_idle={p99 / idle_p99:.2f} "
                    f"unanswered={busy.failures} placed={placed}/{count} largest_group={max(groups.values())} "
                    f"regroup_rounds={regrouping['rounds']} exhausted={regrouping['rounds_exhausted']} "
                    f"cached_sets={regrouping['cached_sets']}"
                )
        finally:
            service.stop()


if __name__ == "__main__":
    main()
