"""Regrouping time per event with a large running cluster.

Fills a cluster with ``--jobs`` running jobs of the production job types (SLOs from
U(1.2, 1.5)) by online placement, regrouping once to settle it, then measures
``--samples`` events: an arrival (placed, then regrouped) and a departure of a random
running job (then regrouped), timing each ``plan_regroup`` + ``apply_regroup``. Prints
p50/p99 milliseconds per event and the work done (exact searches, columns of the
neighbourhood). Target: p99 <= 1,000 ms at 400 jobs, <= 5,000 ms at 1,000.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from pathlib import Path

from rollmux.core.cluster import Cluster
from rollmux.core.placement import RollMuxPolicy, place
from rollmux.core.regroup import RegroupConfig, RegroupState, apply_regroup, plan_regroup
from rollmux.inputs.trace import job_from_profile, load_profile

PROFILE = Path(__file__).resolve().parents[1] / "data" / "traces" / "production-profile.json"


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def regroup(cluster: Cluster, config: RegroupConfig, state: RegroupState) -> tuple[float, int]:
    """Milliseconds to plan and apply one regrouping, and the jobs it moved."""
    start = time.perf_counter()
    plan = plan_regroup(cluster, config, state)
    if plan is not None:
        apply_regroup(cluster, plan)
    return (time.perf_counter() - start) * 1000, len(plan.moved) if plan else 0


def measure(running: int, samples: int, seed: int) -> tuple[list[float], int, float, float]:
    profile = load_profile(PROFILE)
    types = sorted(profile.disagg)
    rng = random.Random(seed)
    cluster, policy, config, state = Cluster(), RollMuxPolicy(), RegroupConfig(), RegroupState()
    names: list[str] = []

    def arrive(i: int) -> None:
        place(cluster, policy, job_from_profile(f"j{i}", rng.choice(types), profile, rng.uniform(1.2, 1.5)))
        names.append(f"j{i}")

    for i in range(running):
        arrive(i)
    online = cluster.cost_per_hour()
    regroup(cluster, config, state)
    times: list[float] = []
    moved = 0
    for k in range(samples):
        arrive(running + k)
        ms, n = regroup(cluster, config, state)
        times.append(ms)
        cluster.remove(names.pop(rng.randrange(len(names) - 1)))
        ms, m = regroup(cluster, config, state)
        times.append(ms)
        moved += n + m
    return times, moved, online, cluster.cost_per_hour()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=400, help="running jobs")
    parser.add_argument("--samples", type=int, default=50, help="arrival/departure pairs measured")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    times, moved, online, final = measure(args.jobs, args.samples, args.seed)
    print(f"events={len(times)} running_jobs={args.jobs} jobs_moved={moved}")
    print(f"cost_usd_per_hour online_only={online:.1f} after_regrouping={final:.1f} ratio={online / final:.3f}")
    print(f"regroup_ms mean={statistics.fmean(times):.1f} max={max(times):.1f}")
    print(f"regroup_ms p50={statistics.median(times):.1f} p99={quantile(times, 0.99):.1f}")


if __name__ == "__main__":
    main()
