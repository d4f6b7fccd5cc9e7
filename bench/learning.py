"""The shipped GRPO job learns: mean reward over time, run alone through the runtime.

One job on one rollout and one training worker of a local Ray; its roles use one thread
each and never run at the same time, so the job uses one CPU core. Prints the reward of
the first and last iterations (5-iteration means), the seconds until the mean reward
first rose by 0.3 over its start, and writes the reward curve. Target: a rise of 0.3
within 300 s.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from rollmux.dataplane.connect import start_ray
from rollmux.inputs.runfile import RunFile
from rollmux.live.launch import run_plan
from rollmux.report.timeline import reward_curves

WINDOW = 5


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=80)
    parser.add_argument("--picture", type=Path, default=Path("out/learning-rewards.png"))
    args = parser.parse_args()
    start_ray(rollout_nodes=1, train_nodes=1)
    config = {"seed": 0, "prompts_per_iteration": 768, "train_groups": 256, "threads": 1}
    job = {"name": "grpo", "iterations": args.iterations, "rollout_s": 0.3, "train_s": 0.3, "slo": 1.5, "grpo": config}
    with tempfile.TemporaryDirectory() as folder:
        result = run_plan(RunFile.model_validate({"jobs": [job]}), Path(folder))
    history = result.histories["grpo"]
    rewards = [m["reward"] for m in history]
    start = statistics.fmean(rewards[:WINDOW])
    means = [statistics.fmean(rewards[i - WINDOW : i]) for i in range(WINDOW, len(rewards) + 1)]
    reached = next((history[i + WINDOW - 1]["elapsed_s"] for i, m in enumerate(means) if m >= start + 0.3), None)
    reward_curves({"grpo": history}, args.picture, "Shipped GRPO job, alone on one rollout and one training worker")
    print(f"picture: {args.picture}")
    elapsed = history[-1]["elapsed_s"]
    print(f"reward_start={start:.3f} reward_end={means[-1]:.3f} best={max(means):.3f} seconds={elapsed:.1f}")
    print(f"reward_rise={max(means) - start:.3f} rise_0.3_after_s={reached if reached is None else round(reached, 1)}")


if __name__ == "__main__":
    main()
