"""Where a live replay departs from the simulation, by trace hours: the nodes held per pool
and the share of running jobs seated co-located, live and simulated.

    python bench/replay_breakdown.py out/replay-72h --time-scale 200 --window 0 72 \\
        --slo-uniform 1.2 1.5 --seed 0

The live figures are read from the store the replay left in its ``--out`` folder: the node
log (when each node was held and given back, and its pool) and the phase log (a job whose
rollout ran on training nodes sat co-located until its next rollout). Trace time is wall
time since the first node was held, times K. The simulated figures come from the
simulator run again on the same trace and options (the replay's own comparison). Last
line: ``train_nodes live=… simulated=… colocated_share live=… simulated=…`` over the window.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from rollmux.core.cluster import Cluster
from rollmux.core.placement import make_policy
from rollmux.core.regroup import RegroupConfig
from rollmux.core.spec import HOUR, Pool
from rollmux.inputs.trace import load_profile, read_trace, uniform_slo
from rollmux.live.replay import window
from rollmux.sim.simulator import simulate


@dataclass
class Buckets:
    """Time integrals per bucket of trace hours: node-seconds per pool, job-seconds, and
    job-seconds seated co-located."""

    width_s: float
    nodes: dict[int, dict[str, float]] = field(default_factory=lambda: defaultdict(lambda: defaultdict(float)))
    jobs: dict[int, float] = field(default_factory=lambda: defaultdict(float))
    colocated: dict[int, float] = field(default_factory=lambda: defaultdict(float))

    def spans(self, start: float, end: float):
        """(bucket, seconds) pieces of [start, end)."""
        first, last = int(start // self.width_s), int(end // self.width_s)
        for bucket in range(first, last + 1):
            seconds = min(end, (bucket + 1) * self.width_s) - max(start, bucket * self.width_s)
            if seconds > 0:
                yield bucket, seconds

    def add_nodes(self, pool: str, count: float, start: float, end: float) -> None:
        for bucket, seconds in self.spans(start, end):
            self.nodes[bucket][pool] += count * seconds

    def add_jobs(self, count: float, colocated: float, start: float, end: float) -> None:
        for bucket, seconds in self.spans(start, end):
            self.jobs[bucket] += count * seconds
            self.colocated[bucket] += colocated * seconds


def live(store: Path, time_scale: float, width_s: float) -> Buckets:
    db = sqlite3.connect(store)
    log = db.execute("select node, pool, at, held from node_log order by at, id").fetchall()
    began = min(at for _, _, at, _ in log)
    out = Buckets(width_s)
    held: dict[int, float] = {}
    for node, pool, at, is_held in log:
        if is_held:
            held[node] = at
        elif node in held:
            out.add_nodes(pool, 1, (held.pop(node) - began) * time_scale, (at - began) * time_scale)
    pools = {node: pool for node, pool, _, _ in log}
    rollouts: dict[str, list[tuple[float, bool]]] = defaultdict(list)
    for job, nodes, granted in db.execute("select job, nodes, granted_at from phases where phase = 'rollout'"):
        on_train = all(pools.get(node) == Pool.TRAIN.value for node in json.loads(nodes))
        rollouts[job].append(((granted - began) * time_scale, on_train))
    for runs in rollouts.values():
        runs.sort()
        for (start, colocated), (end, _) in zip(runs, runs[1:], strict=False):
            out.add_jobs(1, float(colocated), start, end)
    return out


def simulated(args: argparse.Namespace, width_s: float) -> Buckets:
    trace = read_trace(args.trace, load_profile(args.profile), uniform_slo(*args.slo_uniform, args.seed))
    trace = window(trace, *args.window)
    seen: list[tuple[int, int]] = []

    def count(cluster: Cluster) -> None:
        members = [m for group in cluster.groups.values() for m in group.members]
        seen.append((len(members), sum(m.colocated for m in members)))

    result = simulate(trace, make_policy("rollmux"), on_event=count, regroup=RegroupConfig())
    out = Buckets(width_s)
    times = [t for t, *_ in result.nodes_over_time]
    ends = [*times[1:], trace.end]
    for (start, rollout, train), end, (jobs, colocated) in zip(result.nodes_over_time, ends, seen, strict=True):
        out.add_nodes(Pool.ROLLOUT.value, rollout, start, end)
        out.add_nodes(Pool.TRAIN.value, train, start, end)
        out.add_jobs(jobs, colocated, start, end)
    return out


def share(buckets: Buckets, keys) -> float:
    jobs = sum(buckets.jobs[k] for k in keys)
    return sum(buckets.colocated[k] for k in keys) / jobs if jobs else 0.0


def mean_nodes(buckets: Buckets, pool: str, keys, width_s: float) -> float:
    return sum(buckets.nodes[k][pool] for k in keys) / (width_s * len(keys))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="the replay's --out folder (its state/rollmux.db)")
    parser.add_argument("--trace", type=Path, default=Path("data/traces/production-200jobs.trace"))
    parser.add_argument("--profile", type=Path, default=Path("data/traces/production-profile.json"))
    parser.add_argument("--slo-uniform", type=float, nargs=2, default=(1.2, 1.5))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--window", type=float, nargs=2, required=True, metavar=("START_H", "END_H"))
    parser.add_argument("--time-scale", type=float, required=True)
    parser.add_argument("--bucket-hours", type=float, default=6.0)
    args = parser.parse_args()
    store = args.out / "state" / "rollmux.db"
    if not store.exists():
        parser.error(f"{store} does not exist: give the folder a replay wrote with --out")
    width = args.bucket_hours * HOUR
    real, sim = live(store, args.time_scale, width), simulated(args, width)
    buckets = range(int((args.window[1] - args.window[0]) * HOUR // width))
    columns = ("co-located share", "rollout nodes", "training nodes")
    print("| trace hours | " + " | ".join(f"{c}, live | simulated" for c in columns) + " |")
    print("| --- " * (1 + 2 * len(columns)) + "|")
    for k in buckets:
        cells = [share(real, [k]), share(sim, [k])]
        for pool in (Pool.ROLLOUT.value, Pool.TRAIN.value):
            cells += [mean_nodes(real, pool, [k], width), mean_nodes(sim, pool, [k], width)]
        hours = f"{k * args.bucket_hours:g}–{(k + 1) * args.bucket_hours:g}"
        print(f"| {hours} | {cells[0]:.2f} | {cells[1]:.2f} | " + " | ".join(f"{c:.1f}" for c in cells[2:]) + " |")
    train = [mean_nodes(b, Pool.TRAIN.value, buckets, width) for b in (real, sim)]
    print(
        f"train_nodes live={train[0]:.2f} simulated={train[1]:.2f} "
        f"colocated_share live={share(real, buckets):.3f} simulated={share(sim, buckets):.3f}"
    )


if __name__ == "__main__":
    main()
