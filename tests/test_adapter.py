"""The role adapter on the shipped GRPO job's roles: they satisfy the interface, a discarded
rollout generates nothing until its weights are re-sent and then generates what it would
have, and the footprint counts what the residency check needs."""

from __future__ import annotations

import pytest
import torch

from rollmux.jobs.grpo import GRPOConfig, GRPORollout, GRPOTrainer
from rollmux.sdk.adapter import RolloutAdapter, TrainerAdapter, WeightsDiscarded

SMALL = GRPOConfig(seed=5, prompts_per_iteration=16, train_groups=8)


def trained_pair() -> tuple[GRPORollout, GRPOTrainer]:
    rollout, trainer = GRPORollout(SMALL), GRPOTrainer(SMALL)
    trainer.train(rollout.generate(0))
    return rollout, trainer


def test_the_shipped_roles_are_adapters():
    rollout, trainer = GRPORollout(SMALL), GRPOTrainer(SMALL)
    assert isinstance(rollout, RolloutAdapter) and isinstance(trainer, TrainerAdapter)


def test_a_discarded_rollout_waits_for_its_weights_then_generates_as_if_offloaded():
    offloaded, trainer = trained_pair()
    discarded, _ = trained_pair()
    offloaded.sleep("offload")
    discarded.sleep("discard")
    assert discarded.footprint().host_bytes < offloaded.footprint().host_bytes // 100
    assert discarded.footprint().device_bytes == offloaded.footprint().device_bytes
    offloaded.wake()
    discarded.wake({"weights", "kv_cache"})
    with pytest.raises(WeightsDiscarded):
        discarded.generate(0)
    for role in (offloaded, discarded):
        role.load_weights(*trainer.weights())
    expected, got = offloaded.generate(1), discarded.generate(1)
    assert torch.equal(expected["sequences"], got["sequences"])
    assert torch.equal(expected["old_logprobs"], got["old_logprobs"])


def test_a_trainer_keeps_its_only_copy_and_counts_its_optimizer_state():
    _, trainer = trained_pair()
    with pytest.raises(ValueError, match="only copy"):
        trainer.sleep("discard")
    weights = sum(t.numel() * t.element_size() for t in trainer.policy.state_dict().values())
    trainer.sleep("offload")
    assert trainer.footprint().host_bytes >= 3 * weights  # weights and Adam's two moments


def test_unknown_modes_and_tags_are_refused_by_name():
    rollout = GRPORollout(SMALL)
    with pytest.raises(ValueError, match="unknown sleep mode 'evict'"):
        rollout.sleep("evict")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unknown wake tags"):
        rollout.wake({"weights", "optimizer"})  # type: ignore[arg-type]
