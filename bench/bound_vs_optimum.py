"""The lower bound against the exact optimum, both with their defaults (the same space:
co-located seats allowed, groups up to MAX_GROUP_JOBS), on random snapshots of 2–8 jobs.

Prints how many snapshots had a bound above the optimum (must be 0), how many claimed
``optimal`` without equalling it (must be 0), how often the bound was tight, and the mean
gap. Job times, SLOs and state sizes are drawn around the published mixes (rollout-heavy
to training-heavy, SLO 1.2–2.0, 10–700 GB of resident state).
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from rich.progress import track

from rollmux.core.bound import BoundConfig, lower_bound
from rollmux.core.optimum import optimum
from rollmux.core.spec import CostModel, JobSpec, PhaseTime, Planning

TOLERANCE = 1e-6


def snapshot(rng: random.Random) -> list[JobSpec]:
    jobs = []
    for i in range(rng.randint(2, 8)):
        rollout, train = rng.uniform(20, 400), rng.uniform(5, 400)
        memory = rng.choice([10.0, 100.0, 300.0, 700.0])
        jobs.append(
            JobSpec(
                f"j{i}",
                PhaseTime.fixed(rollout),
                PhaseTime.fixed(train),
                rng.uniform(1.2, 2.0),
                rollout_mem_gb=memory,
                train_mem_gb=memory,
            )
        )
    return jobs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--snapshots", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--depth-first-jobs",
        type=int,
        default=BoundConfig().depth_first_jobs,
        help="price parts of more jobs by MILP over the floor (1: every part of two or more)",
    )
    args = parser.parse_args()
    config = BoundConfig(depth_first_jobs=args.depth_first_jobs)
    rng, cost = random.Random(args.seed), CostModel()
    above = false_optimal = tight = 0
    gaps = []
    started = time.process_time()
    for _ in track(range(args.snapshots), description="snapshots"):
        jobs = snapshot(rng)
        best = optimum(jobs, cost, Planning.P95).cost_per_hour
        bound = lower_bound(jobs, cost, Planning.P95, config)
        above += bound.value > best + TOLERANCE * max(1.0, best)
        false_optimal += bound.optimal and abs(bound.upper - best) > TOLERANCE * max(1.0, best)
        tight += abs(bound.value - best) <= TOLERANCE * max(1.0, best)
        gaps.append((best - bound.value) / best)
    print(
        f"snapshots={args.snapshots} depth_first_jobs={args.depth_first_jobs} cpu_s={time.process_time() - started:.0f}"
    )
    print(
        f"bound_above_optimum={above} optimal_claimed_wrongly={false_optimal} tight={tight} "
        f"mean_gap={statistics.fmean(gaps):.4f} max_gap={max(gaps):.4f} ok={above == 0 and false_optimal == 0}"
    )


if __name__ == "__main__":
    main()
