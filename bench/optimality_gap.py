"""Online placement against the exact optimum, on snapshots of the production trace.

Replays the production trace (SLOs from U(1.2, 1.5)) under RollMux's placement, without
and with regrouping (migration charged), and after every event at which 2 to
``--max-jobs`` jobs run, solves the cheapest placement of exactly those jobs
(rollmux.core.optimum: exact set partitioning, MILP on HiGHS). Prints each snapshot's
costs and gap, then per variant the mean gap and the optimum's solve time.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from rollmux.core.cluster import Cluster
from rollmux.core.optimum import optimum
from rollmux.core.placement import RollMuxPolicy
from rollmux.core.regroup import RegroupConfig
from rollmux.inputs.trace import load_profile, read_trace, uniform_slo
from rollmux.sim.simulator import simulate

DATA = Path(__file__).resolve().parents[1] / "data" / "traces"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-jobs", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quiet", action="store_true", help="only the summary lines")
    args = parser.parse_args()
    trace = read_trace(
        DATA / "production-200jobs.trace",
        load_profile(DATA / "production-profile.json"),
        uniform_slo(1.2, 1.5, args.seed),
    )
    summary = []
    for variant, regroup in (("online", None), ("regroup", RegroupConfig())):
        gaps: list[float] = []
        solve_s: list[float] = []

        def snapshot(cluster: Cluster, variant: str = variant, gaps: list = gaps, solve_s: list = solve_s) -> None:
            running = list(cluster.jobs())
            if not 2 <= len(running) <= args.max_jobs:
                return
            start = time.perf_counter()
            best = optimum(running, cluster.cost, cluster.planning)
            solve_s.append(time.perf_counter() - start)
            gaps.append(cluster.cost_per_hour() / best.cost_per_hour - 1)
            if not args.quiet:
                print(
                    f"{variant} snapshot={len(gaps)} jobs={len(running)} usd_h={cluster.cost_per_hour():.2f} "
                    f"optimum_usd_h={best.cost_per_hour:.2f} gap={100 * gaps[-1]:.2f}%"
                )

        simulate(trace, RollMuxPolicy(), on_event=snapshot, regroup=regroup)
        summary.append(
            f"{variant}: snapshots={len(gaps)} mean_gap={100 * statistics.fmean(gaps):.2f}% "
            f"max_gap={100 * max(gaps):.2f}% optimum_solve_s median={statistics.median(solve_s):.3f} "
            f"max={max(solve_s):.3f}"
        )
    print("\n".join(summary))


if __name__ == "__main__":
    main()
