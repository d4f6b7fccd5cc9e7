"""The slowest regrouping round over random plans the API accepts.

Each plan (1 to 200 jobs; SLOs tight, loose, mixed or all 1,000; phase times over six
orders of magnitude; wide jobs; states from nothing to a full node; some with p99 and
co-located times) is admitted as the control plane admits it, then regrouped round
after round (at most five) as the live plane does. Prints the slowest round's CPU
seconds and its work (searches, exact checks, enumeration steps against the event's
budget), the slowest admission, the largest group and the peak RSS, and the slowest
round over ``tests/test_bounded.py``'s ``ROUND_CPU_S``. CPU time: a busy machine barely
moves it.
"""

from __future__ import annotations

import argparse
import random
import resource
import sys
import time
from pathlib import Path

from rollmux.core.cluster import MAX_GROUP_JOBS, Cluster
from rollmux.core.control import ControlState
from rollmux.core.placement import make_policy
from rollmux.core.regroup import RegroupConfig, RegroupState, plan_regroup
from rollmux.inputs.runfile import JobSubmission

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.test_bounded import ROUND_CPU_S  # noqa: E402

SLOS = {
    "tight": lambda rng: rng.uniform(1.0, 1.5),
    "loose": lambda rng: rng.uniform(10.0, 100.0),
    "mixed": lambda rng: rng.choice([1.1, 2.0, 60.0, 1000.0]),
    "all-1000": lambda rng: 1000.0,
}


def random_plan(rng: random.Random) -> list[JobSubmission]:
    count = rng.choice([1, 8, 30, 46, 100, 200])
    slo = SLOS[rng.choice(sorted(SLOS))]
    jobs = []
    for i in range(count):
        scale = rng.choice([0.01, 1.0, 100.0, 1e4])
        rollout, train = rng.uniform(0, 2) * scale, rng.uniform(0.01, 2) * scale
        fields = {
            "name": f"j{i}",
            "rollout_s": rollout,
            "train_s": train,
            "slo": slo(rng),
            "rollout_width": rng.choice([1, 1, 1, 2, 4]),
            "train_width": rng.choice([1, 1, 1, 2, 3]),
            "rollout_mem_gb": rng.choice([0, 0.01, 10, 300, 900, 1600]),
            "train_mem_gb": rng.choice([0, 0.01, 10, 300, 900, 1600]),
        }
        if rng.random() < 0.3:
            fields["rollout_p99_s"] = rollout * rng.uniform(1, 3)
        if rng.random() < 0.3:
            fields["colo_rollout_s"] = rollout * rng.uniform(0.5, 2)
            fields["colo_train_s"] = train * rng.uniform(0.8, 1.2)
        jobs.append(JobSubmission(**fields))
    return jobs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plans", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    config = RegroupConfig()
    worst_round, worst_admit, largest, worst = 0.0, 0.0, 0, None
    for index in range(args.plans):
        plan = random_plan(random.Random(args.seed * 1_000_003 + index))
        state, cache = ControlState(Cluster(), make_policy("rollmux")), RegroupState()
        started = time.process_time()
        for job in plan:
            state.submit(job.spec(), job.program(), 0.0)
        worst_admit = max(worst_admit, time.process_time() - started)
        for _ in range(5):
            view = state.movable_view()
            started = time.process_time()
            found = plan_regroup(view, config, cache, state.progress(view, 1.0))
            spent = time.process_time() - started
            if spent > worst_round:
                worst_round, worst = spent, (index, len(plan), cache.last_round)
            if found is None:
                break
            state.start_regroup(found, 1.0)
        largest = max(largest, *(len(g.members) for g in state.cluster.groups.values()))
    assert worst is not None
    index, jobs, work = worst
    print(f"plans={args.plans} seed={args.seed} largest_group={largest} (limit {MAX_GROUP_JOBS})")
    print(f"admission_cpu_s max={worst_admit:.3f}")
    print(
        f"round_cpu_s max={worst_round:.3f} (plan {index}, {jobs} jobs: searches={work.searches} "
        f"checks={work.checks}/{config.checks_per_event} steps={work.steps}/{config.steps_per_event} "
        f"exhausted={work.exhausted})"
    )
    print(f"round_cpu_over_test_bound={worst_round / ROUND_CPU_S:.3f}")
    print(f"peak_rss_mb={resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f}")


if __name__ == "__main__":
    main()
