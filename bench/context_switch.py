"""Warm context switch against cold start, for the shipped GRPO job's roles.

Warm: the role's tensors go device -> host buffers (sleep) and back (wake), the switch a
job pays at every phase. Cold: the role is rebuilt and its state restored from a
checkpoint on disk (process start not included, so the ratio is conservative). The
job's own phase times are measured in the same run, so the warm switch is also reported
as a share of a phase. Last line: ``warm_ms=… cold_ms=… ratio=…``.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from rollmux.jobs.grpo import GRPOConfig, GRPORollout, GRPOTrainer

BENCH_CONFIG = GRPOConfig.benchmark()


def timed(action) -> float:
    start = time.perf_counter()
    action()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    torch.set_num_threads(1)
    rollout, trainer = GRPORollout(BENCH_CONFIG), GRPOTrainer(BENCH_CONFIG)
    rollout_s, train_s = [], []
    for iteration in range(4):
        start = time.perf_counter()
        batch = rollout.generate(iteration)
        rollout_s.append(time.perf_counter() - start)
        train_s.append(timed(lambda b=batch: trainer.train(b)))
        rollout.load_weights(*trainer.weights())
    phase_ms = 1000 * statistics.median(rollout_s + train_s)

    warm = []
    for _ in range(args.repeats):
        for role in (rollout, trainer):
            warm.append(role.state.sleep() + role.state.wake())
    cold = []
    with tempfile.TemporaryDirectory() as folder:
        for role, factory in ((rollout, GRPORollout), (trainer, GRPOTrainer)):
            path = Path(folder) / f"{factory.__name__}.pt"
            role.state.save(path)
            for _ in range(max(3, args.repeats // 4)):
                cold.append(timed(lambda f=factory, p=path: f(BENCH_CONFIG).state.restore(p)))
    warm_ms, cold_ms = 1000 * statistics.median(warm), 1000 * statistics.median(cold)
    host_mib = (rollout.state.host_bytes() + trainer.state.host_bytes()) / 2**20
    print(
        f"phase_ms median={phase_ms:.1f} (rollout {1000 * statistics.median(rollout_s):.1f}, "
        f"train {1000 * statistics.median(train_s):.1f}); resident state {host_mib:.2f} MiB"
    )
    print(f"warm_share_of_phase={warm_ms / phase_ms:.4f} (target <= 0.05)")
    print(f"warm_ms={warm_ms:.3f} cold_ms={cold_ms:.3f} ratio={cold_ms / warm_ms:.1f}")


if __name__ == "__main__":
    main()
