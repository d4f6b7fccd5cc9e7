"""Weight sync from a trainer to a rollout worker on one host, through the real workers.

Two pool workers (Ray actors) hold a job's training role and rollout role, each with a
model of ``--gib`` GiB. One sync is what the job does after every training phase: the
trainer publishes its weights (a worker call), the rollout worker receives them
(``deliver``), and its next wake applies them into the rollout's own tensors. Timed from
the publish call to the end of that wake, for packed weights (one flat buffer that Ray
ships without pickling, ``rollmux.sdk.weights``) and, in the same run, for the old
path (a dict of torch tensors, pickled). Last line: ``gib_per_s=… pickled_gib_per_s=…
speedup=…``; target gib_per_s >= 1.0.
"""

from __future__ import annotations

import argparse
import statistics
import time

import ray
import torch
from torch import nn

from rollmux.dataplane.connect import start_ray
from rollmux.dataplane.workers import PoolWorker
from rollmux.sdk.state import RoleState
from rollmux.sdk.weights import PackedWeights, Publisher, load_packed

CHUNK = 64 * 2**20
JOB, EPOCH = "bench", 1


def big_model(gib: float) -> nn.Module:
    """``gib`` GiB of float32 weights in 64 MiB tensors (a model's layers)."""
    count = max(1, round(gib * 2**30 / CHUNK))
    return nn.ParameterList([nn.Parameter(torch.zeros(CHUNK // 4)) for _ in range(count)])


class TrainRole:
    """A trainer whose switch state is tiny: what is measured is the sync, not the switch."""

    def __init__(self, gib: float):
        self.model = big_model(gib)
        self.publisher = Publisher(self.model)
        self.state = RoleState(nn.Linear(1, 1), device="cpu")

    def weights(self, version: int) -> tuple[int, PackedWeights]:
        return version, self.publisher.publish(version)

    def weights_pickled(self, version: int) -> tuple[int, dict[str, torch.Tensor]]:
        return version, {k: v.detach().clone() for k, v in self.model.state_dict().items()}


class RolloutRole:
    def __init__(self, gib: float):
        self.model = big_model(gib)
        self.version = 0
        self.state = RoleState(nn.Linear(1, 1), device="cpu")

    @torch.no_grad()
    def load_weights(self, version: int, weights: PackedWeights | dict[str, torch.Tensor]) -> None:
        if isinstance(weights, PackedWeights):
            self.version = load_packed(self.model, weights, self.version)
            return
        for name, tensor in self.model.state_dict().items():
            tensor.copy_(weights[name])
        self.version = version


def sync_seconds(trainer, rollout, method: str, version: int, token: int) -> float:
    """One sync through the workers: publish, deliver, and the wake that applies it."""
    start = time.perf_counter()
    published = trainer.call.remote(JOB, "train", EPOCH, 1, method, version)
    ray.get(rollout.deliver.remote(JOB, EPOCH, published))
    ray.get(rollout.wake.remote(JOB, "rollout", EPOCH, token))
    seconds = time.perf_counter() - start
    ray.get(rollout.sleep.remote(JOB, "rollout", EPOCH, token))
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, default=1.0, help="model size in GiB")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    start_ray(rollout_nodes=1, train_nodes=1)
    worker = ray.remote(PoolWorker).options(num_cpus=0, max_concurrency=4)
    limit = int(8 * args.gib * 2**30)
    trainer, rollout = worker.remote("train", limit), worker.remote("rollout", limit)
    ray.get(
        [
            trainer.load.remote(JOB, "train", EPOCH, lambda: TrainRole(args.gib)),
            rollout.load.remote(JOB, "rollout", EPOCH, lambda: RolloutRole(args.gib)),
        ]
    )
    ray.get(trainer.wake.remote(JOB, "train", EPOCH, 1))
    gib = len(big_model(args.gib)) * CHUNK / 2**30
    token = 0
    times: dict[str, list[float]] = {"weights": [], "weights_pickled": []}
    for version in range(1, args.repeats + 1):
        for method, runs in times.items():
            token += 1
            runs.append(sync_seconds(trainer, rollout, method, 2 * version + (method == "weights"), token))
    packed, pickled = (statistics.median(times[m]) for m in ("weights", "weights_pickled"))
    print(f"model {gib:.2f} GiB, median of {args.repeats}: packed {packed:.3f} s, pickled {pickled:.3f} s")
    print(f"gib_per_s={gib / packed:.2f} pickled_gib_per_s={gib / pickled:.2f} speedup={pickled / packed:.1f}")


if __name__ == "__main__":
    main()
