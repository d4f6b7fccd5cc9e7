"""The core's steady-state period against an independent event simulation, on random
groups with real-valued phase times (2–6 jobs, 1–3 rollout and training nodes, some
co-located; ``tests/independent_schedule.py``).

Prints the largest relative error of the period and how many periods fell below a job's
own rollout + training time (must be 0). Bar: every error ≤ 1e-9.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

from rich.progress import track

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rollmux.core.roundrobin import components, fcfs_order, steady_state, subgroup  # noqa: E402
from tests.independent_schedule import random_group, simulated_period  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    worst, below, checked = 0.0, 0, 0
    started = time.process_time()
    for _ in track(range(args.groups), description="groups"):
        seats = random_group(rng)
        order, state = fcfs_order(seats), steady_state(seats)
        for members in components(seats):
            sub, sub_order = subgroup(seats, order, members)
            expected = simulated_period(sub, sub_order)
            got = state.periods[members[0]]
            worst = max(worst, abs(got - expected) / expected)
            below += any(got < seat.solo_s * (1 - 1e-12) for seat in sub)
            checked += 1
    print(f"groups={args.groups} components={checked} cpu_s={time.process_time() - started:.1f}")
    print(f"max_relative_error={worst:.3e} below_own_phases={below} ok={worst <= 1e-9 and below == 0}")


if __name__ == "__main__":
    main()
