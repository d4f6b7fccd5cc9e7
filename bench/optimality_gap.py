"""RollMux's placement against a proven lower bound, at every snapshot of two traces.

Replays the production trace (SLOs from U(1.2, 1.5), seed 0) and a seeded rollout-heavy
trace of the shipped generator (``rollmux generate rh.jsonl --jobs 60 --mix
rollout-heavy --arrivals uniform --seed 0``) under RollMux with its default regrouping
(migrations charged). After every event at which a job runs, it bounds the cost of any
placement of exactly the running jobs from below (rollmux.core.bound: the LP relaxation of
the set partitioning by column generation, raised by an exact search over the columns
that could beat the best placement found) and reports RollMux's gap to that bound. Where
at most ``--max-exact-jobs`` jobs run it also solves the exact optimum
(rollmux.core.optimum, every subset, MILP) and reports the exact gap. Per trace one summary
line; the last line is the mean gap to the bound over both traces.
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

from rollmux.core.bound import BoundConfig, lower_bound
from rollmux.core.cluster import Cluster
from rollmux.core.optimum import optimum
from rollmux.core.placement import RollMuxPolicy
from rollmux.core.regroup import RegroupConfig
from rollmux.core.spec import CostModel, JobSpec, Planning
from rollmux.inputs.trace import Trace, load_profile, read_trace, uniform_slo
from rollmux.sim.generate import TraceShape, generate
from rollmux.sim.simulator import simulate

DATA = Path(__file__).resolve().parents[1] / "data" / "traces"


@dataclass(frozen=True)
class Snapshot:
    """The running jobs after one event, RollMux's cost rate and its groups."""

    jobs: tuple[JobSpec, ...]
    usd_h: float
    groups: tuple[frozenset[JobSpec], ...]


@dataclass
class Tally:
    gaps: list[float] = field(default_factory=list)
    exact_gaps: list[float] = field(default_factory=list)
    proven_optimal: int = 0
    bound_over_optimum: int = 0
    seconds: float = 0.0


def snapshots(trace: Trace, planning: Planning) -> tuple[list[Snapshot], CostModel]:
    """Every event's snapshot with at least one running job, under RollMux + regrouping."""
    taken: list[Snapshot] = []
    cost = CostModel()

    def take(cluster: Cluster) -> None:
        jobs = tuple(cluster.jobs())
        if jobs:
            groups = tuple(frozenset(m.job for m in g.members) for g in cluster.groups.values())
            taken.append(Snapshot(jobs, cluster.cost_per_hour(), groups))

    simulate(trace, RollMuxPolicy(), cost=cost, planning=planning, on_event=take, regroup=RegroupConfig())
    return taken, cost


def measure(name: str, trace: Trace, args: argparse.Namespace) -> Tally:
    planning = Planning.P95
    taken, cost = snapshots(trace, planning)
    if args.quick:
        taken = taken[:: args.quick]
    tally = Tally()
    cache: dict = {}
    warm: tuple = ()
    for k, snap in enumerate(taken, 1):
        largest = max(len(g) for g in snap.groups)
        config = BoundConfig(max_group=max(RegroupConfig().max_group, largest))
        start = time.perf_counter()
        bound = lower_bound(snap.jobs, cost, planning, config, cache, (*warm, *snap.groups))
        tally.seconds += time.perf_counter() - start
        warm = bound.columns
        tally.gaps.append(snap.usd_h / bound.value - 1)
        tally.proven_optimal += bound.optimal
        line = (
            f"trace={name} snapshot={k} jobs={len(snap.jobs)} usd_h={snap.usd_h:.2f} bound_usd_h={bound.value:.2f} "
            f"gap={100 * tally.gaps[-1]:.2f}% lp_usd_h={bound.lp:.2f} best_found_usd_h={bound.upper:.2f}"
        )
        if len(snap.jobs) <= args.max_exact_jobs:
            best = optimum(list(snap.jobs), cost, planning, colocate=True).cost_per_hour
            tally.exact_gaps.append(snap.usd_h / best - 1)
            tally.bound_over_optimum += bound.value > best + 1e-6
            line += f" optimum_usd_h={best:.2f} exact_gap={100 * tally.exact_gaps[-1]:.2f}%"
        if not args.quiet:
            print(line, flush=True)
    return tally


def summary(name: str, tally: Tally) -> str:
    exact = (
        f"exact_snapshots={len(tally.exact_gaps)} mean_exact_gap={100 * statistics.fmean(tally.exact_gaps):.2f}% "
        f"bound_above_optimum={tally.bound_over_optimum}"
        if tally.exact_gaps
        else "exact_snapshots=0"
    )
    return (
        f"trace={name} snapshots={len(tally.gaps)} mean_gap_to_bound={100 * statistics.fmean(tally.gaps):.2f}% "
        f"max_gap={100 * max(tally.gaps):.2f}% min_gap={100 * min(tally.gaps):.2f}% "
        f"proven_optimal={tally.proven_optimal} {exact} bound_s={tally.seconds:.1f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-exact-jobs", type=int, default=8, help="solve the exact optimum up to this many jobs")
    parser.add_argument("--seed", type=int, default=0, help="seed of the SLO draw and of the generated trace")
    parser.add_argument("--rollout-heavy-jobs", type=int, default=60)
    parser.add_argument("--quick", type=int, default=0, metavar="K", help="only every K-th snapshot")
    parser.add_argument("--quiet", action="store_true", help="only the summary lines")
    args = parser.parse_args()
    production = read_trace(
        DATA / "production-200jobs.trace",
        load_profile(DATA / "production-profile.json"),
        uniform_slo(1.2, 1.5, args.seed),
    )
    shape = TraceShape(jobs=args.rollout_heavy_jobs, mix="rollout-heavy", arrivals="uniform", seed=args.seed)
    tallies = {"production": measure("production", production, args)}
    tallies["rollout-heavy"] = measure("rollout-heavy", generate(shape), args)
    for name, tally in tallies.items():
        print(summary(name, tally))
    gaps = [g for tally in tallies.values() for g in tally.gaps]
    print(f"mean_gap_to_bound={100 * statistics.fmean(gaps):.2f}% snapshots={len(gaps)}")


if __name__ == "__main__":
    main()
