"""Long-tail rollout migration, live: two jobs share two rollout nodes and one training node,
their rollouts long-tailed; the same jobs and seeds run once with migration (a ``tail`` in
their spec: at 80 % of requests done, the tail moves onto one node and the other goes to the
other job's rollout) and once without, in one run of this script.

The jobs are emulated (:mod:`rollmux.jobs.emulated_tail`): the control plane, the workers,
the elastic grants and the driver's chunk loop are the real ones; the engine waits as a
GPU decodes, one step per token of a chunk's longest request whatever the batch, plus a
prefill per moved request. So the figure measures the mechanism, not this machine's cores.

Measured, per run: the group's period, the mean time between two consecutive training
releases of a job (after the first ``--warmup`` iterations, both jobs running), averaged
over the two jobs; and the rollout nodes' utilisation, the tokens generated per rollout
node-second from the first grant to the last release (the same tokens in both runs: the
lengths are seeded). The last line is ``period_gain=<1 - period with / period without>
utilisation_gain=<utilisation with / utilisation without - 1>``; the target on the shipped
tail distribution (lognormal, shape 1.0) is a period gain of at least 10 %.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

import ray

from rollmux.core.spec import RolloutTail
from rollmux.dataplane.connect import start_ray
from rollmux.inputs.runfile import RunFile
from rollmux.jobs.emulated_tail import TailConfig
from rollmux.live.launch import RunResult, node_records, run_plan
from rollmux.report.timeline import gantt

ENTRYPOINT = "rollmux.jobs.emulated_tail:EmulatedTailJob.from_context"
NAMES = ("job-a", "job-b")


def jobs(config: TailConfig, iterations: int, migrate: bool) -> list[dict[str, Any]]:
    """The two jobs' run-file entries: seeds ``config.seed`` and the next, planned so that the core packs both
    onto the same nodes; with ``migrate`` the tail the lengths imply (its share by
    :meth:`RolloutTail.lognormal_share`, an assumed distribution, which the bench draws)."""
    share = RolloutTail.lognormal_share(config.length_sigma, config.requests)
    specs = []
    for seed, name in enumerate(NAMES):
        args = asdict(config) | {"seed": config.seed + seed}
        job = {"name": name, "iterations": iterations, "slo": 3.0, "rollout_width": 2, "entrypoint": ENTRYPOINT}
        job |= {"rollout_s": 1.0, "train_s": config.train_s, "args": args}
        specs.append(job | ({"tail": {"share": round(share, 3), "nodes": 1}} if migrate else {}))
    return specs


def run(config: TailConfig, iterations: int, migrate: bool) -> RunResult:
    cluster = {"rollout_nodes": 2, "train_nodes": 1, "regroup": False, "slo_guard": False}
    with tempfile.TemporaryDirectory() as folder:
        plan = RunFile.model_validate({"cluster": cluster, "jobs": jobs(config, iterations, migrate)})
        result = run_plan(plan, Path(folder), tick_s=0.2)
    if result.errors:
        raise SystemExit(f"a job failed: {result.errors}")
    return result


def period(result: RunResult, warmup: int) -> float:
    """Mean time between consecutive training releases, per job, averaged over the jobs."""
    periods = []
    for name in NAMES:
        ends = sorted(
            e["ended_at"]
            for e in result.phase_log
            if e["job"] == name and e["phase"] == "train" and e["outcome"] == "released"
        )[warmup:]
        periods.append(statistics.mean(b - a for a, b in zip(ends, ends[1:], strict=False)))
    return statistics.mean(periods)


def utilisation(result: RunResult, nodes: int = 2) -> float:
    """Tokens generated per rollout node-second over the run."""
    rollouts = [e for e in result.phase_log if e["phase"] == "rollout"]
    span = max(e["ended_at"] for e in rollouts) - min(e["granted_at"] for e in rollouts)
    tokens = sum(m["tokens"] for history in result.histories.values() for m in history)
    return tokens / (nodes * span)


def shed_starts(result: RunResult) -> int:
    """Rollouts that started on a node another job's rollout shed while its tail ran."""
    lines = [e for e in result.phase_log if e["phase"] == "rollout"]
    count = 0
    for shed in (e for e in lines if e["outcome"] == "shed"):
        tail_end = max(e["ended_at"] for e in lines if (e["job"], e["iteration"]) == (shed["job"], shed["iteration"]))
        count += any(
            e["job"] != shed["job"]
            and shed["ended_at"] <= e["granted_at"] < tail_end
            and shed["nodes"][0] in e["nodes"]
            for e in lines
        )
    return count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=12, help="iterations per job (default 12)")
    parser.add_argument("--warmup", type=int, default=2, help="iterations left out of the period (default 2)")
    parser.add_argument("--sigma", type=float, default=1.0, help="lognormal shape of the lengths (default 1.0)")
    parser.add_argument("--requests", type=int, default=32, help="requests per rollout (default 32)")
    parser.add_argument("--step-s", type=float, default=0.02, help="seconds per decode step (default 0.02)")
    parser.add_argument("--seed", type=int, default=0, help="the first job's length seed; the second's is the next")
    parser.add_argument("--train-s", type=float, default=0.5, help="seconds of each training phase (default 0.5)")
    parser.add_argument("--gantt", type=Path, help="write each run's phases per node here (long-tail-with/without.png)")
    args = parser.parse_args()
    config = TailConfig(
        seed=args.seed, requests=args.requests, length_sigma=args.sigma, step_s=args.step_s, train_s=args.train_s
    )
    start_ray(rollout_nodes=2, train_nodes=1)
    try:
        results = {}
        for migrate in (True, False):
            print(f"running {'with' if migrate else 'without'} migration ...", flush=True)
            results[migrate] = run(config, args.iterations, migrate)
    finally:
        ray.shutdown()
    if args.gantt:
        args.gantt.mkdir(parents=True, exist_ok=True)
        for migrate, name in ((True, "with"), (False, "without")):
            title = f"two tailed jobs on two rollout nodes, {name} migration (hatched: training)"
            print(
                f"wrote {gantt(node_records(results[migrate].phase_log), args.gantt / f'long-tail-{name}.png', title)}"
            )
    with_p, without_p = period(results[True], args.warmup), period(results[False], args.warmup)
    with_u, without_u = utilisation(results[True]), utilisation(results[False])
    moved = [m["requests_moved"] for h in results[True].histories.values() for m in h]
    print(f"config: {config}")
    print(f"period: {with_p:.3f} s with migration, {without_p:.3f} s without")
    print(f"utilisation (tokens per rollout node-second): {with_u:.1f} with, {without_u:.1f} without")
    print(
        f"requests moved per rollout: {statistics.mean(moved):.1f}; rollouts started on a shed node "
        f"during another's tail: {shed_starts(results[True])}"
    )
    print(f"period_gain={1 - with_p / without_p:.3f} utilisation_gain={with_u / without_u - 1:.3f}")


if __name__ == "__main__":
    main()
