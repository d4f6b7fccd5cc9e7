"""Two jobs multiplexed on one rollout and one training worker, against the same two jobs
run one after the other on the same logical nodes, in one run.

Two workloads. ``emulated``: emulated jobs whose phases wait as a GPU phase waits (no CPU
spin, real tensors slept and woken), so the figure measures RollMux's mechanism (turns,
grants, switches) and not whether the machine has a spare core; rollout and training are
equally long, so perfect multiplexing doubles the rate (target >= 1.9). ``torch``: the
shipped GRPO job computing on the CPU (target >= 1.6 on two cores, where both workers
compute at once when multiplexed).

Iterations per wall-clock second are measured in the steady state of each run (from the
first training end to the last, and for the multiplexed run only while both jobs run),
so process start-up and cold loading are left out of both sides alike. Each workload
prints ``multiplex_speedup=<multiplexed rate / sequential rate>`` with its name; the last
line is the last workload's (``--workload both``: torch, then emulated).
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import tempfile
from pathlib import Path

from rollmux.core.turns import PhaseRecord
from rollmux.dataplane.connect import start_ray
from rollmux.inputs.runfile import RunFile
from rollmux.jobs.grpo import GRPOConfig
from rollmux.live.launch import RunResult, run_plan
from rollmux.live.replay import EMULATED

NAMES = ("job-a", "job-b")
EMULATED_PHASE_S = 0.5
"""Each emulated phase waits this long from grant to release (rollout and training alike)."""


def jobs(workload: str, iterations: int) -> list[dict]:
    """The two jobs' run-file entries. Equal planning estimates and an SLO of 2 let the core
    pack both into one group."""
    if workload == "torch":
        return [
            {"name": n, "iterations": iterations, "slo": 2.0, "grpo": dataclasses.asdict(GRPOConfig.benchmark(seed))}
            for seed, n in enumerate(NAMES)
        ]
    phase_s = {"rollout_s": EMULATED_PHASE_S, "train_s": EMULATED_PHASE_S}
    return [
        {"name": n, "iterations": iterations, "slo": 2.0, **phase_s, "entrypoint": EMULATED, "args": phase_s}
        for n in NAMES
    ]


def run_jobs(specs: list[dict]) -> RunResult:
    """The jobs on a fresh embedded control plane (its own state folder), kept where they
    are placed: what is measured is two jobs taking turns on one pair of nodes."""
    fixed = {"regroup": False, "slo_guard": False}
    with tempfile.TemporaryDirectory() as folder:
        return run_plan(RunFile.model_validate({"cluster": fixed, "jobs": specs}), Path(folder))


def train_ends(records: list[PhaseRecord], job: str) -> list[float]:
    return sorted(r.ended for r in records if r.job == job and r.phase == "train")


def sequential_rate(workload: str, iterations: int) -> tuple[float, list[PhaseRecord]]:
    done = 0
    span = 0.0
    records: list[PhaseRecord] = []
    for spec in jobs(workload, iterations):
        result = run_jobs([spec])
        ends = train_ends(result.records, spec["name"])
        done += len(ends) - 1
        span += ends[-1] - ends[0]
        records += result.records
    return done / span, records


def multiplexed_rate(workload: str, iterations: int) -> tuple[float, list[PhaseRecord]]:
    result = run_jobs(jobs(workload, iterations))
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
    parser.add_argument("--workload", choices=("emulated", "torch", "both"), default="both")
    args = parser.parse_args()
    start_ray(rollout_nodes=1, train_nodes=1)
    for workload in ("torch", "emulated") if args.workload == "both" else (args.workload,):
        measure(workload, args.iterations)


def measure(workload: str, iterations: int) -> None:
    sequential, seq_records = sequential_rate(workload, iterations)
    multiplexed, mux_records = multiplexed_rate(workload, iterations)
    for name, records in (("sequential", seq_records), ("multiplexed", mux_records)):
        print(
            f"{workload} {name}: rollout_s={mean_phase(records, 'rollout'):.3f} "
            f"train_s={mean_phase(records, 'train'):.3f} "
            f"warm_switch_ms={1000 * statistics.median(r.wake_s + r.sleep_s for r in records):.2f}"
        )
    print(f"{workload} sequential_iter_per_s={sequential:.3f} multiplexed_iter_per_s={multiplexed:.3f}")
    print(f"multiplex_speedup={multiplexed / sequential:.3f} workload={workload}")


if __name__ == "__main__":
    main()
