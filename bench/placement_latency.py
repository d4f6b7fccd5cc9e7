"""Placement latency with a large running cluster.

Fills a cluster with ``--jobs`` running jobs drawn from the production job types (SLOs
from U(1.2, 1.5)), then places ``--samples`` more one by one, removing a random running
job after each so the cluster stays at its size. Reports p50/p99 milliseconds per
placement, and the same with a single running job, measured in this run, so the growth
is a ratio rather than an absolute time on a noisy machine.

Published prototype: 1.5 ms with 1 running job, 320 ms with 1,000. Target: p50 <= 10 ms.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from pathlib import Path

from rollmux.core.cluster import Cluster
from rollmux.core.placement import RollMuxPolicy, place
from rollmux.inputs.trace import job_from_profile, load_profile

PROFILE = Path(__file__).resolve().parents[1] / "data" / "traces" / "production-profile.json"


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def measure(running: int, samples: int, seed: int) -> list[float]:
    profile = load_profile(PROFILE)
    types = sorted(profile.disagg)
    rng = random.Random(seed)
    cluster, policy = Cluster(), RollMuxPolicy()
    names: list[str] = []

    def new_job(i: int):
        return job_from_profile(f"j{i}", rng.choice(types), profile, rng.uniform(1.2, 1.5))

    for i in range(running):
        place(cluster, policy, new_job(i))
        names.append(f"j{i}")
    times = []
    for k in range(samples):
        spec = new_job(running + k)
        start = time.perf_counter()
        place(cluster, policy, spec)
        times.append((time.perf_counter() - start) * 1000)
        names.append(spec.name)
        cluster.remove(names.pop(rng.randrange(len(names) - 1)))
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1000, help="running jobs before measuring")
    parser.add_argument("--samples", type=int, default=300, help="placements measured")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    small = measure(1, args.samples, args.seed)
    large = measure(args.jobs, args.samples, args.seed)
    p50_small, p50_large = statistics.median(small), statistics.median(large)
    print(f"placement_ms_at_1_job p50={p50_small:.3f} p99={quantile(small, 0.99):.3f}")
    print(f"growth_1_to_{args.jobs} p50_ratio={p50_large / p50_small:.1f}x (published prototype: 320/1.5 = 213x)")
    print(f"placement_ms p50={p50_large:.3f} p99={quantile(large, 0.99):.3f}")


if __name__ == "__main__":
    main()
