"""The shipped GRPO job, driven directly: it learns, and it refuses stale weights."""

from __future__ import annotations

import pytest

from rollmux.jobs.grpo import GRPOConfig, GRPORollout, GRPOTrainer, StaleWeights, task_batch

SMALL = GRPOConfig(seed=3, prompts_per_iteration=128, train_groups=64)


def train(config: GRPOConfig, iterations: int) -> list[float]:
    rollout, trainer = GRPORollout(config), GRPOTrainer(config)
    rewards = []
    for it in range(iterations):
        batch = rollout.generate(it)
        rewards.append(trainer.train(batch)["reward"])
        rollout.load_weights(*trainer.weights())
    return rewards


def test_answers_are_the_last_digit_of_the_sum():
    prompts, answers = task_batch(SMALL, 0)
    digits = prompts[:, 1::2]
    assert ((digits.sum(dim=1) % 10) == answers.squeeze(1)).all()


def test_reward_rises_from_the_random_policy():
    rewards = train(SMALL, 60)
    assert sum(rewards[:5]) / 5 < 0.15
    assert sum(rewards[-5:]) / 5 >= sum(rewards[:5]) / 5 + 0.2


def test_rollout_refuses_weights_older_than_its_iteration():
    rollout, trainer = GRPORollout(SMALL), GRPOTrainer(SMALL)
    trainer.train(rollout.generate(0))
    with pytest.raises(StaleWeights, match="needs weights version 1, holds 0"):
        rollout.generate(1)
    rollout.load_weights(*trainer.weights())
    assert rollout.generate(1)["version"] == 1


def test_trainer_refuses_a_batch_from_other_weights():
    rollout, trainer = GRPORollout(SMALL), GRPOTrainer(SMALL)
    batch = rollout.generate(0)
    trainer.train(batch)
    with pytest.raises(StaleWeights):
        trainer.train(batch)
