"""The vLLM example, checked: ``examples/vllm.yaml``'s two TRL GRPO jobs multiplexed on one
rollout and one training node, then each job alone on the same cluster; their per-iteration
losses and rewards must be identical, and the reward curves show that both learn.

Prints each job's mean reward over its first and last five iterations, how many iterations
are identical to the job alone, the run's wall time multiplexed and alone, and writes the
reward curves of the multiplexed run (the picture in the README and docs/results.md).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import yaml

from rollmux.dataplane.connect import start_ray
from rollmux.inputs.runfile import RunFile
from rollmux.live.launch import run_plan
from rollmux.report.timeline import reward_curves

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "vllm.yaml"
WINDOW = 5


def timed_run(plan: dict, folder: Path) -> tuple[dict[str, list[dict[str, float]]], float]:
    started = time.monotonic()
    result = run_plan(RunFile.model_validate(plan), folder / f"run-{time.monotonic_ns()}")
    if result.errors:
        raise SystemExit(f"the run failed: {result.errors}")
    return result.histories, time.monotonic() - started


def numbers(history: list[dict[str, float]]) -> list[tuple[float, float]]:
    return [(m["loss"], m["reward"]) for m in history]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run-file", type=Path, default=EXAMPLE)
    parser.add_argument("--picture", type=Path, default=Path("out/vllm-rewards.png"))
    args = parser.parse_args()
    plan = yaml.safe_load(args.run_file.read_text())
    cluster = plan.get("cluster", {})
    start_ray(rollout_nodes=cluster.get("rollout_nodes", 1), train_nodes=cluster.get("train_nodes", 1))
    with tempfile.TemporaryDirectory() as folder:
        together, together_s = timed_run(plan, Path(folder))
        print(f"multiplexed: {len(together)} jobs in {together_s:.0f} s", flush=True)
        alone_s = 0.0
        for job in plan["jobs"]:
            alone, seconds = timed_run({**plan, "jobs": [job]}, Path(folder))
            alone_s += seconds
            name = job["name"]
            same = sum(a == b for a, b in zip(numbers(together[name]), numbers(alone[name]), strict=True))
            rewards = [m["reward"] for m in together[name]]
            first, last = statistics.fmean(rewards[:WINDOW]), statistics.fmean(rewards[-WINDOW:])
            print(
                f"{name}: reward {first:.3f} -> {last:.3f} (means of the first and last {WINDOW} iterations); "
                f"identical to alone {same}/{len(rewards)}; alone {seconds:.0f} s",
                flush=True,
            )
    reward_curves(together, args.picture, f"{args.run_file.name}: TRL GRPO jobs on vLLM engines, multiplexed")
    print(f"picture: {args.picture}")
    print(f"multiplexed_s={together_s:.0f} alone_s={alone_s:.0f}")


if __name__ == "__main__":
    main()
