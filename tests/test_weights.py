"""Weight sync without pickling: packed weights round-trip exactly, travel through Ray as
raw buffers, are refused when stale, and count in the receiving node's host memory."""

from __future__ import annotations

from functools import partial

import pytest
import ray
import torch
from torch import nn

from rollmux.core.errors import ResidencyExceeded, StaleWeights, WeightsDiscarded
from rollmux.dataplane.workers import PoolWorker
from rollmux.sdk.adapter import ParkedRole
from rollmux.sdk.state import RoleState
from rollmux.sdk.weights import Publisher, load_packed
from tests.local_ray import fresh_local_ray


class Mixed(nn.Module):
    """Tensors of several dtypes and shapes, as a real checkpoint has."""

    def __init__(self, seed: int):
        super().__init__()
        generator = torch.Generator().manual_seed(seed)
        self.linear = nn.Linear(7, 3)
        self.low_precision = nn.Parameter(torch.randn(5, 2, generator=generator).to(torch.bfloat16))
        self.register_buffer("steps", torch.arange(3, dtype=torch.int64) * seed)
        with torch.no_grad():
            self.linear.weight.copy_(torch.randn(3, 7, generator=generator))


def same(a: nn.Module, b: nn.Module) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True))


def test_packed_weights_load_exactly_into_the_receivers_own_tensors():
    source, target = Mixed(1), Mixed(2)
    addresses = [t.data_ptr() for t in target.state_dict().values()]
    assert load_packed(target, Publisher(source).publish(4), holds=3) == 4
    assert same(source, target)
    assert [t.data_ptr() for t in target.state_dict().values()] == addresses


def test_stale_or_foreign_weights_are_refused():
    publisher = Publisher(Mixed(1))
    with pytest.raises(StaleWeights, match="version 2 offered to a role holding version 3"):
        load_packed(Mixed(2), publisher.publish(2), holds=3)
    with pytest.raises(ValueError, match="do not fit this model"):
        load_packed(nn.Linear(7, 3), publisher.publish(5), holds=0)


@pytest.fixture(scope="module")
def local_ray():
    yield from fresh_local_ray(rollout_nodes=1, train_nodes=1)


def test_weights_cross_ray_as_a_raw_buffer(local_ray):
    source, target = Mixed(1), Mixed(2)
    received = ray.get(ray.put(Publisher(source).publish(1)))
    assert not received.buffer.flags.writeable  # mapped from the object store, not unpickled into a copy
    load_packed(target, received, holds=0)
    assert same(source, target)


class Rollout:
    def __init__(self, mib: float):
        self.model = nn.Linear(int(mib * 2**18), 1, bias=False)
        self.state = RoleState(self.model, device="cpu")
        self.version = 0

    def load_weights(self, version, weights):
        self.version = load_packed(self.model, weights, self.version)


def test_delivered_weights_count_in_host_memory_and_stale_ones_are_refused():
    worker = PoolWorker("rollout", host_limit_bytes=int(2.5 * 2**20))
    worker.load("job", "rollout", 1, partial(Rollout, 1.0))
    publisher = Publisher(nn.Linear(2**18, 1, bias=False))
    worker.deliver("job", 1, (2, publisher.publish(2)))
    assert worker.host_bytes() == 2 * 2**20  # the role's host copy and the weights waiting for its wake
    with pytest.raises(StaleWeights, match="weights 1 arrived after version 2"):
        worker.deliver("job", 1, (1, publisher.publish(1)))
    worker.wake("job", "rollout", 1, token=1)
    assert worker.roles[("job", "rollout")].version == 2 and worker.host_bytes() == 2**20


def test_a_wake_over_the_node_limit_is_refused_once_optimizer_state_has_grown():
    class Trainer:
        def __init__(self):
            self.model = nn.Linear(2**18, 1, bias=False)
            self.optimizer = torch.optim.Adam(self.model.parameters())
            self.state = RoleState(self.model, self.optimizer, device="cpu")

        def step(self):
            self.model(torch.ones(1, 2**18)).sum().backward()
            self.optimizer.step()

    worker = PoolWorker("train", host_limit_bytes=int(1.5 * 2**20))
    worker.load("job", "train", 1, Trainer)  # 1 MiB of weights: fits
    worker.wake("job", "train", 1, token=1)
    worker.call("job", "train", 1, 1, "step")  # gradients and Adam's moments appear
    worker.sleep("job", "train", 1, token=1)
    with pytest.raises(ResidencyExceeded, match="would hold 4.0 MiB of host memory, over its 1.5 MiB"):
        worker.wake("job", "train", 1, token=2)


class DiscardingRollout(ParkedRole):
    """A rollout role that keeps no host copy between phases: the trainer re-sends its weights."""

    park_mode = "discard"

    def __init__(self, mib: float):
        self.model = nn.Linear(int(mib * 2**18), 1, bias=False)
        self.version = 0
        super().__init__(RoleState(self.model, device="cpu"))

    def load_weights(self, version, weights):
        self.version = self.receive_weights(weights, self.version)

    def first(self) -> float:
        self.require_weights()
        return self.model.weight[0, 0].item()


def test_a_discarding_role_is_parked_without_host_copy_and_runs_only_once_its_weights_are_back():
    worker = PoolWorker("rollout", host_limit_bytes=8 * 2**20)
    worker.load("job", "rollout", 1, partial(DiscardingRollout, 1.0))
    assert worker.host_bytes() == 2**20  # loaded with a host copy: the initial weights are the only ones
    worker.wake("job", "rollout", 1, token=1)
    worker.sleep("job", "rollout", 1, token=1)
    assert worker.host_bytes() == 0  # parked in its own mode: nothing kept
    worker.wake("job", "rollout", 1, token=2)
    with pytest.raises(WeightsDiscarded):
        worker.call("job", "rollout", 1, 2, "first")
    worker.sleep("job", "rollout", 1, token=2)
    trained = nn.Linear(2**18, 1, bias=False)
    with torch.no_grad():
        trained.weight.fill_(0.5)
    worker.deliver("job", 1, (1, Publisher(trained).publish(1)))
    worker.wake("job", "rollout", 1, token=3)
    assert worker.call("job", "rollout", 1, 3, "first") == 0.5


class OffloadingRollout(DiscardingRollout):
    park_mode = "offload"


class Trainer(ParkedRole):
    """A trainer without optimizer state whose update sets every weight to ``value``."""

    def __init__(self, mib: float):
        self.model = nn.Linear(int(mib * 2**18), 1, bias=False)
        self.version = 0
        super().__init__(RoleState(self.model, device="cpu"))

    def update(self, value: float) -> None:
        with torch.no_grad():
            self.model.weight.fill_(value)
        self.version += 1

    def weights(self):
        return self.version, self.publish(self.version)


def test_a_co_located_rollout_keeps_no_copy_of_its_own_and_wakes_with_its_trainers_weights():
    """As the core counts a co-located job (its training state only): 1 MiB of trainer and
    its 1 MiB publication buffer fit in 2.5 MiB beside a 1 MiB rollout that keeps no copy."""
    worker = PoolWorker("train", host_limit_bytes=int(2.5 * 2**20))
    worker.load("job", "rollout", 1, partial(OffloadingRollout, 1.0))
    worker.load("job", "train", 1, partial(Trainer, 1.0))
    assert worker.host_bytes() == 2**20  # the rollout gave its copy up when its trainer landed
    worker.wake("job", "train", 1, token=1)
    worker.call("job", "train", 1, 1, "update", 0.25)
    worker.sleep("job", "train", 1, token=1)
    worker.wake("job", "rollout", 1, token=2)
    assert worker.call("job", "rollout", 1, 2, "first") == 0.25  # the trainer's weights, from this node
    assert worker.roles[("job", "rollout")].version == 1
    worker.sleep("job", "rollout", 1, token=2)
    assert worker.host_bytes() == 2 * 2**20  # trainer and its publication buffer; no rollout copy
    _, carried = worker.export("job", "rollout", 1)
    assert carried[0] == 1  # leaving its trainer, the rollout takes the trainer's weights along


def test_a_rollout_without_its_trainer_keeps_its_copy():
    worker = PoolWorker("rollout", host_limit_bytes=int(2.5 * 2**20))
    worker.load("job", "rollout", 1, partial(OffloadingRollout, 1.0))
    worker.wake("job", "rollout", 1, token=1)
    worker.sleep("job", "rollout", 1, token=1)
    assert worker.host_bytes() == 2**20
    assert worker.roles[("job", "rollout")].state.needs_weights is False
