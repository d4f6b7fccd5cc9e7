"""Warm context switch against cold start, for the shipped GRPO job's roles.

Warm: the role's tensors go device -> host buffers (sleep) and back (wake), the switch a
job pays at every phase. Cold: the role is rebuilt and its state restored from a
checkpoint on disk (process start not included, so the ratio is conservative). The
job's own phase times are measured in the same run, so the warm switch is also reported
as a share of a phase. Last line: ``warm_ms=… cold_ms=… ratio=…``.

``--mib N`` adds a large case: a transformer-like stack of linear layers trained one Adam
step, so its state is real weights plus every optimizer tensor (about N MiB in all); its
switch is timed the same way and reported with the bytes moved per second (each switch
moves the state out and back in). On a CPU-only machine "device" and host are both RAM.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from rollmux.jobs.grpo import GRPOConfig, GRPORollout, GRPOTrainer
from rollmux.sdk.state import RoleState

BENCH_CONFIG = GRPOConfig.benchmark()
WIDTH = 2048
"""Width of the large case's layers: each holds 16 MiB of float32 weights."""


def timed(action) -> float:
    start = time.perf_counter()
    action()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--mib", type=float, default=0.0, help="also switch a model + Adam state of this size")
    args = parser.parse_args()
    if args.mib:
        large_case(args.mib, max(3, args.repeats // 4))
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


def model_and_adam(mib: float, width: int, device: str) -> tuple[torch.nn.Sequential, torch.optim.Optimizer]:
    """A stack of linear layers and its Adam state, about ``mib`` MiB in all, after one step:
    weights are a third of it (Adam keeps two moments per weight; gradients are dropped
    after the step, as training loops do). Shared with ``gpu_switch.py``."""
    layers = max(1, round(mib * 2**20 / 3 / (width * width * 4)))
    model = torch.nn.Sequential(*(torch.nn.Linear(width, width, bias=False) for _ in range(layers))).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    model(torch.randn(4, width, device=device)).square().mean().backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return model, optimizer


def large_case(mib: float, repeats: int) -> None:
    model, optimizer = model_and_adam(mib, WIDTH, "cpu")
    layers = len(model)
    state = RoleState(model, optimizer, device="cpu")
    moved = state.host_bytes()
    sleeps, wakes = [], []
    for _ in range(repeats):
        sleeps.append(state.sleep())
        wakes.append(state.wake())
    sleep_s, wake_s = statistics.median(sleeps), statistics.median(wakes)
    print(
        f"large: {moved / 2**20:.0f} MiB of weights and Adam state ({layers} layers of {WIDTH}x{WIDTH}), "
        f"median of {repeats}: sleep {1000 * sleep_s:.1f} ms, wake {1000 * wake_s:.1f} ms, "
        f"switch {1000 * (sleep_s + wake_s):.1f} ms, {2 * moved / (sleep_s + wake_s) / 1e9:.2f} GB/s"
    )


if __name__ == "__main__":
    main()
