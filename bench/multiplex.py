"""Two shipped GRPO jobs multiplexed on one rollout and one training worker, against the
same two jobs run one after the other on the same logical nodes, in one run.

Iterations per wall-clock second are measured in the steady state of each run (from the
first training end to the last, and for the multiplexed run only while both jobs run),
so process start-up and cold loading are left out of both sides alike. The last line is
``multiplex_speedup=<multiplexed rate / sequential rate>``; target >= 1.6.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import tempfile
from pathlib import Path

from rollmux.core.turns import PhaseRecord
from rollmux.inputs.runfile import RunFile
from rollmux.jobs.grpo import GRPOConfig
from rollmux.runtime.launch import RunResult, run_plan, start_ray


def jobs(iterations: int) -> list[dict]:
    # Equal planning estimates and an SLO of 2 let the core pack both jobs into one group.
    return [
        {"name": name, "iterations": iterations, "slo": 2.0, "grpo": dataclasses.asdict(GRPOConfig.benchmark(seed))}
        for seed, name in enumerate(["job-a", "job-b"])
    ]


def run_jobs(specs: list[dict]) -> RunResult:
    """The jobs on a fresh embedded control plane (its own state folder), kept where they
    are placed: what is measured is two jobs taking turns on one pair of nodes."""
    fixed = {"regroup": False, "slo_guard": False}
    with tempfile.TemporaryDirectory() as folder:
        return run_plan(RunFile.model_validate({"cluster": fixed, "jobs": specs}), Path(folder))


def train_ends(records: list[PhaseRecord], job: str) -> list[float]:
    return sorted(r.ended for r in records if r.job == job and r.phase == "train")


def sequential_rate(iterations: int) -> tuple[float, list[PhaseRecord]]:
    done = 0
    span = 0.0
    records: list[PhaseRecord] = []
    for spec in jobs(iterations):
        result = run_jobs([spec])
        ends = train_ends(result.records, spec["name"])
        done += len(ends) - 1
        span += ends[-1] - ends[0]
        records += result.records
    return done / span, records


def multiplexed_rate(iterations: int) -> tuple[float, list[PhaseRecord]]:
    result = run_jobs(jobs(iterations))
    ends = {name: train_ends(result.records, name) for name in result.histories}
    start = max(e[0] for e in ends.values())
    stop = min(e[-1] for e in ends.values())
    done = sum(sum(1 for t in e if start < t <= stop) for e in ends.values())
    return done / (stop - start), result.records


def mean_phase(records: list[PhaseRecord], phase: str) -> float:
    return statistics.fmean(r.busy_s for r in records if r.phase == phase)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=20, help="iterations per job")
    args = parser.parse_args()
    start_ray(rollout_nodes=1, train_nodes=1)
    sequential, seq_records = sequential_rate(args.iterations)
    multiplexed, mux_records = multiplexed_rate(args.iterations)
    for name, records in (("sequential", seq_records), ("multiplexed", mux_records)):
        print(
            f"{name}: rollout_s={mean_phase(records, 'rollout'):.3f} train_s={mean_phase(records, 'train'):.3f} "
            f"warm_switch_ms={1000 * statistics.median(r.wake_s + r.sleep_s for r in records):.2f}"
        )
    print(f"sequential_iter_per_s={sequential:.3f} multiplexed_iter_per_s={multiplexed:.3f}")
    print(f"multiplex_speedup={multiplexed / sequential:.3f}")


if __name__ == "__main__":
    main()
