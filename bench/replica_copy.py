"""What ``replicas: 1`` costs a job: copying its sleeping trainer to the buddy standby.

A job with replicas hands its training phase back only once a copy of its sleeping trainer
has gone from the trainer's worker to the pool's buddy (``PoolWorker.replica`` into
``PoolWorker.keep_replica``, worker to worker through Ray's object store). This times that
copy between two real pool workers (Ray actors) for a trainer of ``--mib`` MiB of weights
and Adam state, the same stack ``context_switch.py --mib`` switches. Last line:
``replica_ms=… gib_per_s=…`` (the time a training phase is held longer per iteration).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import ray

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.context_switch import WIDTH, model_and_adam  # noqa: E402
from rollmux.dataplane.connect import start_ray  # noqa: E402
from rollmux.dataplane.workers import PoolWorker  # noqa: E402
from rollmux.sdk.state import RoleState  # noqa: E402

JOB, EPOCH, TOKEN = "bench", 1, 1


class Trainer:
    """A trainer role: real weights and Adam state behind a RoleState, and its history."""

    def __init__(self, mib: float):
        model, optimizer = model_and_adam(mib, WIDTH, "cpu")
        self.state = RoleState(model, optimizer, device="cpu")
        self.history: list[dict[str, float]] = []


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=float, default=512.0)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    start_ray(rollout_nodes=0, train_nodes=2)
    limit = int(4 * args.mib * 2**20) + 2**30
    trainer, buddy = (ray.remote(PoolWorker).options(max_concurrency=4).remote("train", limit) for _ in range(2))
    ray.get(trainer.load.remote(JOB, "train", EPOCH, lambda: Trainer(args.mib)))
    ray.get(trainer.wake.remote(JOB, "train", EPOCH, TOKEN))
    ray.get(trainer.sleep.remote(JOB, "train", EPOCH, TOKEN))  # asleep, as at the end of a training phase
    copied = ray.get(buddy.keep_replica.remote(JOB, "train", 0, trainer.replica.remote(JOB, "train", EPOCH, TOKEN)))
    times = []
    for completed in range(1, args.repeats + 1):
        start = time.perf_counter()
        copy = trainer.replica.remote(JOB, "train", EPOCH, TOKEN)
        ray.get(buddy.keep_replica.remote(JOB, "train", completed, copy))
        times.append(time.perf_counter() - start)
        del copy
    median = statistics.median(times)
    print(
        f"replica: {copied / 2**20:.0f} MiB of trainer state (weights and Adam) copied worker to worker, "
        f"median of {args.repeats}: {1000 * median:.0f} ms ({copied / median / 2**30:.2f} GiB/s); "
        f"the buddy holds {ray.get(buddy.host_bytes.remote()) / 2**20:.0f} MiB"
    )
    print(f"replica_ms={1000 * median:.0f} gib_per_s={copied / median / 2**30:.2f}")


if __name__ == "__main__":
    main()
