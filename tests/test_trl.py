"""TRL's GRPO under RollMux: two TRL jobs multiplexed on one rollout and one training worker
compute bit-identical losses and rewards to each job alone, on real Ray and the real control
plane; driven directly, its roles keep the adapter's promises."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import ray

from rollmux.dataplane.connect import start_ray
from rollmux.inputs.runfile import RunFile
from rollmux.jobs.trl_grpo import (
    RewardFunc,
    TRLRollout,
    TRLTask,
    TRLTrainer,
    grpo_options,
    larger_digit_reward,
    settings,
    settings_text,
)
from rollmux.live.launch import RunResult, run_plan
from rollmux.sdk.adapter import RolloutAdapter, StaleWeights, TrainerAdapter, WeightsDiscarded

ENTRYPOINT = "rollmux.jobs.trl_grpo:TRLJob.from_context"
ITERATIONS = 3


def trl_job(name: str, seed: int) -> dict:
    return {"name": name, "iterations": ITERATIONS, "slo": 3.0, "entrypoint": ENTRYPOINT, "args": {"seed": seed}}


def run(folder: Path, *jobs: dict) -> RunResult:
    """Jobs stay where they are placed, so one group's turns are what is measured."""
    cluster = {"rollout_nodes": 1, "train_nodes": 1, "lease_s": 2.0, "regroup": False, "slo_guard": False}
    plan = RunFile.model_validate({"cluster": cluster, "jobs": list(jobs)})
    return run_plan(plan, folder / f"run-{time.monotonic_ns()}", tick_s=0.2)


def losses_and_rewards(history: list[dict[str, float]]) -> list[tuple[float, float]]:
    return [(m["loss"], m["reward"]) for m in history]


def alone_and_together(folder: Path, a: dict, b: dict) -> Iterator[tuple[RunResult, RunResult, RunResult]]:
    """Each job alone, then both multiplexed, on one rollout and one training node of a fresh Ray."""
    if ray.is_initialized():
        ray.shutdown()
    start_ray(rollout_nodes=1, train_nodes=1)
    try:
        yield run(folder, a), run(folder, b), run(folder, a, b)
    finally:
        ray.shutdown()


@pytest.fixture(scope="module")
def alone_and_multiplexed(tmp_path_factory):
    yield from alone_and_together(tmp_path_factory.mktemp("trl-runs"), trl_job("a", 0), trl_job("b", 1))


@pytest.mark.slow  # a long live scenario: bench/scenarios.py runs it
def test_two_trl_jobs_multiplexed_compute_what_each_computes_alone(alone_and_multiplexed):
    alone_a, alone_b, together = alone_and_multiplexed
    assert not alone_a.errors and not alone_b.errors and not together.errors
    solo_a, solo_b = losses_and_rewards(alone_a.histories["a"]), losses_and_rewards(alone_b.histories["b"])
    assert len(solo_a) == ITERATIONS and solo_a != solo_b
    assert losses_and_rewards(together.histories["a"]) == solo_a
    assert losses_and_rewards(together.histories["b"]) == solo_b


@pytest.mark.slow  # shares the multiplexed run above: bench/scenarios.py runs it
def test_the_trl_jobs_take_turns_on_one_rollout_and_one_training_node(alone_and_multiplexed):
    _, _, together = alone_and_multiplexed
    nodes = {(r.job, r.phase): r.nodes for r in together.records}
    assert nodes[("a", "rollout")] == nodes[("b", "rollout")]
    assert nodes[("a", "train")] == nodes[("b", "train")]
    spans = sorted((r.granted, r.released) for r in together.records if r.phase == "train")
    assert all(later[0] >= earlier[1] for earlier, later in zip(spans, spans[1:], strict=False))
    for name in ("a", "b"):
        assert [r.phase for r in together.records if r.job == name] == ["rollout", "train"] * ITERATIONS
    assert all(r.wake_s > 0 and r.sleep_s > 0 for r in together.records)


def test_the_shipped_reward_scores_the_first_character():
    rewards = larger_digit_reward(["3,7="] * 4, ["7", "71", "3", ","], answer=["7", "7", "7", "7"])
    assert rewards == [1.0, 1.0, 0.1, 0.0]


def test_trl_roles_keep_the_adapters_promises(tmp_path):
    config = TRLTask(seed=2)
    rollout, trainer = TRLRollout(config), TRLTrainer(config)
    assert isinstance(rollout, RolloutAdapter) and isinstance(trainer, TrainerAdapter)
    batch = rollout.generate(0)
    trainer.train(batch)
    with pytest.raises(StaleWeights, match="needs weights version 1, holds 0"):
        rollout.generate(1)
    with pytest.raises(StaleWeights):
        trainer.train(batch)
    rollout.sleep("discard")
    assert rollout.footprint().host_bytes < rollout.footprint().device_bytes // 100
    rollout.wake({"weights", "kv_cache"})
    with pytest.raises(WeightsDiscarded):
        rollout.generate(0)
    rollout.load_weights(*trainer.weights())
    assert rollout.generate(1)["version"] == 1
    with pytest.raises(ValueError, match="only copy"):
        trainer.sleep("discard")
    saved = str(tmp_path / "trainer.pt")
    assert trainer.checkpoint(saved) == 1
    assert TRLRollout(config, saved).version == 1
    assert TRLTrainer(config, saved).history == trainer.history


def short_answer_reward(prompts: list[str], completions: list[str], **_: Any) -> list[float]:
    return [0.5 if len(c) <= 1 else 0.0 for c in completions]


@dataclass(frozen=True)
class TwoRewardTask(TRLTask):
    """A user's task: another model width, a second reward function, TRL's DR-GRPO loss."""

    hidden_size: int = 16

    def reward_funcs(self) -> list[RewardFunc]:
        return [larger_digit_reward, short_answer_reward]

    def trl_options(self) -> dict[str, Any]:
        return {**super().trl_options(), "loss_type": "dr_grpo"}


def test_a_users_task_runs_with_its_own_model_rewards_and_trl_options():
    task = TwoRewardTask(seed=4, prompts_per_iteration=4)
    rollout, trainer = TRLRollout(task), TRLTrainer(task)
    assert trainer.trainer.loss_type == "dr_grpo"
    assert rollout.model.config.hidden_size == 16
    batch = rollout.generate(0)
    assert len(batch["rewards"]) == 4 * task.num_generations
    assert batch["rewards"].max() <= 1.5
    metrics = trainer.train(batch)
    assert metrics["version"] == 1
    parts = metrics["reward/larger_digit_reward"] + metrics["reward/short_answer_reward"]
    assert parts == pytest.approx(metrics["reward"])  # each reward function's mean, as the plot labels it


@dataclass(frozen=True)
class HiddenTermTask(TRLTask):
    def trl_options(self) -> dict[str, Any]:
        return {"entropy_coef": 0.0}


def test_every_option_the_job_passes_trl_is_listed_with_where_it_comes_from():
    task = TwoRewardTask(seed=4)
    rows = {row.name: row for row in settings(task)}
    assert set(grpo_options(task)) <= set(rows)
    assert (rows["entropy_coef"].value, rows["entropy_coef"].source) == (0.01, "default")
    assert (rows["seed"].source, rows["hidden_size"].source) == ("set", "default")  # the subclass's default
    assert (rows["loss_type"].value, rows["loss_type"].source) == ("dr_grpo", "trl_options()")
    assert rows["beta"].source == "TRL default" and rows["max_grad_norm"].source == "not applied"
    assert "entropy_coef" in settings_text(task) and "GRPOConfig.entropy_coef" in rows["entropy_coef"].meaning
    with pytest.raises(ValueError, match="'entropy_coef', a field of the task: set it in the job's args"):
        grpo_options(HiddenTermTask())
