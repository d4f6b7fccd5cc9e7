"""Warm context switch on a GPU: a model and its Adam state of ``--gib`` GiB slept into
pinned host buffers and woken back, through RollMux's ``RoleState``.

Pinned host buffers are allocated at the first sleep and reused after (the first switch
is reported apart); device memory freed at sleep is returned to the device
(``empty_cache``), which the bench checks. Last line: ``switch_gb_per_s=… sleep_ms=…
wake_ms=…`` (bytes moved each way per second, over a sleep and a wake). Needs CUDA; on a
machine without it the bench says so and exits with status 2. Runs in under 5 minutes.
"""

from __future__ import annotations

import argparse
import statistics
import sys

import torch
from context_switch import model_and_adam  # this folder is on the path of a bench run

from rollmux.sdk.state import RoleState

WIDTH = 4096


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, default=4.0)
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("gpu_switch: no CUDA device on this machine; run it where one is", file=sys.stderr)
        sys.exit(2)
    model, optimizer = model_and_adam(args.gib * 1024, WIDTH, "cuda")
    state = RoleState(model, optimizer, device="cuda")
    moved = state.host_bytes()
    first_sleep, first_wake = state.sleep(), state.wake()
    sleeps, wakes, left = [], [], []
    for _ in range(args.repeats):
        sleeps.append(state.sleep())
        left.append(torch.cuda.memory_allocated())
        wakes.append(state.wake())
    sleep_s, wake_s = statistics.median(sleeps), statistics.median(wakes)
    print(f"{moved / 2**30:.2f} GiB of weights and Adam state on {torch.cuda.get_device_name()}")
    print(f"first switch (pins its buffers): sleep {1000 * first_sleep:.0f} ms, wake {1000 * first_wake:.0f} ms")
    print(f"device memory left while asleep: {max(left) / 2**20:.1f} MiB")
    gb_per_s = 2 * moved / (sleep_s + wake_s) / 1e9
    print(f"switch_gb_per_s={gb_per_s:.1f} sleep_ms={1000 * sleep_s:.1f} wake_ms={1000 * wake_s:.1f}")


if __name__ == "__main__":
    main()
