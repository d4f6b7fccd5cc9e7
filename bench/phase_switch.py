"""CPU per phase switch of the live system, with phases of three worker calls and of one.

A trace replay at time scale K makes the live system switch phases K times faster than the
trace does, so what one switch costs in CPU — the control plane's grant and release, the
driver's requests and Ray calls, the workers' wake and sleep, Ray's own threads — decides
the largest K two cores can replay. Here ``--jobs`` emulated jobs (phases that wait, no
CPU spin, real tensors slept and woken) share nodes through the one control plane, every
phase a real grant, wake, wait, sleep and release, and the CPU of every process of the
live system (this one with the control plane, Ray, its workers and driver processes) is
divided by the phases switched. Two variants, alternated ``--rounds`` times:

- ``three_calls``: the worker is called three times per phase (wake, the work, sleep), as
  any job program written with ``with phase(...)`` and ``call_all`` is;
- ``one_call``: the emulated job's phases are ``phase(..., one_call=True)``: one call per
  node wakes the role, runs the work and puts it back to sleep.

Only the steady state counts (the middle of each run: process start-ups and the first
loads are left out). Last line: ``cpu_ms_per_phase three_calls=… one_call=… ratio=…``.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from rollmux.dataplane.connect import start_ray
from rollmux.inputs.runfile import RunFile
from rollmux.live.launch import run_plan
from rollmux.live.replay import EMULATED, system_cpu_s


def jobs(count: int, phase_s: float, iterations: int, one_call: bool) -> list[dict]:
    """Emulated jobs an SLO of 4 lets the core pack several to a group."""
    times = {"rollout_s": phase_s, "train_s": phase_s}
    args = {**times, "one_call_phases": one_call, "rollout_mib": 1.0, "train_mib": 1.0}
    return [
        {"name": f"job-{i}", "iterations": iterations, "slo": 4.0, **times, "entrypoint": EMULATED, "args": args}
        for i in range(count)
    ]


def measure(specs: list[dict]) -> float:
    """CPU milliseconds per phase over the middle half of the run (by phases done)."""
    samples: list[tuple[float, int]] = []
    total = 2 * sum(spec["iterations"] for spec in specs)

    def tick(views: dict[str, dict[str, Any]], _: dict[str, Any]) -> None:
        samples.append((system_cpu_s(), 2 * sum(view.get("iterations", 0) for view in views.values())))

    fixed = {"regroup": False, "slo_guard": False}
    with tempfile.TemporaryDirectory() as folder:
        result = run_plan(RunFile.model_validate({"cluster": fixed, "jobs": specs}), Path(folder), on_tick=tick)
    if result.errors:
        raise SystemExit(f"jobs failed: {result.errors}")
    steady = [(cpu, phases) for cpu, phases in samples if total / 4 <= phases <= 3 * total / 4]
    if len(steady) < 2 or steady[-1][1] == steady[0][1]:
        raise SystemExit("too few samples in the steady state: raise --iterations")
    return 1000 * (steady[-1][0] - steady[0][0]) / (steady[-1][1] - steady[0][1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=8)
    parser.add_argument("--phase-ms", type=float, default=40.0, help="each emulated phase waits this long")
    parser.add_argument("--iterations", type=int, default=150)
    parser.add_argument("--rounds", type=int, default=2, help="runs of each variant, alternated")
    args = parser.parse_args()
    start_ray(rollout_nodes=args.jobs, train_nodes=args.jobs)
    measured: dict[str, list[float]] = {"three_calls": [], "one_call": []}
    for round_ in range(args.rounds):
        for variant in measured:
            started = time.perf_counter()
            specs = jobs(args.jobs, args.phase_ms / 1000, args.iterations, variant == "one_call")
            measured[variant].append(measure(specs))
            print(
                f"round {round_ + 1} {variant}: {measured[variant][-1]:.2f} ms of CPU per phase "
                f"({time.perf_counter() - started:.0f} s)",
                flush=True,
            )
    three, one = (statistics.median(measured[v]) for v in ("three_calls", "one_call"))
    print(f"cpu_ms_per_phase three_calls={three:.2f} one_call={one:.2f} ratio={one / three:.2f}")


if __name__ == "__main__":
    main()
