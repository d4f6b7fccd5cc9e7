"""Multi-rank roles: a phase two nodes wide runs one rank on each node, joined by a gloo
process group, and data-parallel training over the two ranks computes what one rank
computes on the whole batch — for a plain model and for the shipped GRPO job, whose wide
rollout samples a share of the prompts on each rank."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import pytest
import ray
import torch
from torch import nn

from rollmux.dataplane import ranks
from rollmux.inputs.runfile import RunFile
from rollmux.jobs.grpo import GRPOConfig, GRPORollout, GRPOTrainer, merge
from rollmux.live.launch import run_plan
from rollmux.sdk.program import JobContext
from rollmux.sdk.session import Session, phase
from rollmux.sdk.state import RoleState
from tests.local_ray import fresh_local_ray

FEATURES, BATCH, STEPS = 6, 32, 4


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(step)
    x = torch.randn(BATCH, FEATURES, generator=generator)
    return x, x @ torch.arange(1.0, FEATURES + 1) + 0.1 * torch.randn(BATCH, generator=generator)


def model() -> nn.Linear:
    torch.manual_seed(0)
    return nn.Linear(FEATURES, 1)


class Sampler:
    def __init__(self):
        self.state = RoleState(nn.Linear(1, 1), device="cpu")

    def sample(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        return batch(step)


class DataParallelTrainer:
    """Each rank takes its shard of the batch; gradients are summed over the ranks."""

    def __init__(self):
        self.model = model()
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.05)
        self.state = RoleState(self.model, self.optimizer, device="cpu")

    def train(self, data: tuple[torch.Tensor, torch.Tensor]) -> dict:
        place = ranks.current()
        x, y = data
        shard = place.shard(len(x))
        loss = ((self.model(x[shard]).squeeze(1) - y[shard]) ** 2).sum() / len(x)
        loss.backward()
        for parameter in self.model.parameters():
            place.all_reduce(parameter.grad)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        total = place.all_reduce(loss.detach().clone())
        weights = torch.cat([p.detach().flatten() for p in self.model.parameters()]).tolist()
        return {
            "rank": place.rank,
            "world": place.world,
            "pid": os.getpid(),
            "loss": total.item(),
            **{f"w{i}": w for i, w in enumerate(weights)},
        }


@dataclass(frozen=True)
class DataParallelJob:
    iterations: int

    @classmethod
    def from_context(cls, context: JobContext) -> DataParallelJob:
        return cls(context.iterations)

    def role_factory(self, phase_name: str):
        return partial(Sampler) if phase_name == "rollout" else partial(DataParallelTrainer)

    def run(self, session: Session) -> list[dict]:
        """Reports each rank's figures of every step, keyed ``<figure>_<rank>``."""
        history = []
        for step in range(self.iterations):
            with phase("rollout"):
                data = session.call("rollout", "sample", step)
            with phase("train"):
                results = ray.get(session.call_all("train", "train", data))
                figures = {f"{k}_{r['rank']}": float(v) for r in results for k, v in r.items()}
                history.append(session.report(figures, step))
        return history


def alone() -> list[dict]:
    """The same training on one rank and the whole batch, in this process."""
    trainer = DataParallelTrainer()
    return [trainer.train(batch(step)) for step in range(STEPS)]


@pytest.fixture(scope="module")
def local_ray():
    yield from fresh_local_ray(rollout_nodes=2, train_nodes=2)


@pytest.mark.slow  # a long live scenario: bench/scenarios.py runs it
def test_a_two_node_training_phase_runs_a_rank_on_each_node_and_matches_one_rank(local_ray, tmp_path: Path):
    spec = {
        "name": "wide",
        "iterations": STEPS,
        "train_width": 2,
        "entrypoint": "tests.test_ranks:DataParallelJob.from_context",
    }
    plan = RunFile.model_validate({"cluster": {"regroup": False, "slo_guard": False}, "jobs": [spec]})
    result = run_plan(plan, tmp_path / f"run-{time.monotonic_ns()}", tick_s=0.2)
    assert not result.errors, result.errors
    history = result.histories["wide"]
    assert len(history) == STEPS
    weights = [f"w{i}" for i in range(FEATURES + 1)]
    for step, expected in zip(history, alone(), strict=True):
        assert (step["rank_0"], step["rank_1"], step["world_0"], step["world_1"]) == (0, 1, 2, 2)
        assert step["pid_0"] != step["pid_1"], "each rank ran on its own node's worker"
        for rank in (0, 1):
            assert step[f"loss_{rank}"] == pytest.approx(expected["loss"], rel=1e-5)
            assert [step[f"{w}_{rank}"] for w in weights] == pytest.approx([expected[w] for w in weights], abs=1e-6)


GRPO_SMALL = GRPOConfig(seed=3, prompts_per_iteration=32, train_groups=16)
GRPO_ITERATIONS = 3


def grpo_in_one_process() -> list[dict]:
    """The two rollout ranks sampled one after the other here, and one trainer on the whole batch."""
    rollout, trainer = GRPORollout(GRPO_SMALL), GRPOTrainer(GRPO_SMALL)
    history = []
    for iteration in range(GRPO_ITERATIONS):
        parts = []
        for rank in (0, 1):
            with ranks.serving(ranks.Ranks(rank, 2)):
                parts.append(rollout.generate(iteration))
        history.append(trainer.train(merge(parts)))
        rollout.load_weights(*trainer.weights())
    return history


def test_the_shipped_job_uses_every_node_of_its_wide_phases(local_ray, tmp_path: Path):
    fields = {key: getattr(GRPO_SMALL, key) for key in ("seed", "prompts_per_iteration", "train_groups")}
    spec = {"name": "wide-grpo", "iterations": GRPO_ITERATIONS, "rollout_width": 2, "train_width": 2, "grpo": fields}
    plan = RunFile.model_validate({"cluster": {"regroup": False, "slo_guard": False}, "jobs": [spec]})
    result = run_plan(plan, tmp_path / f"run-{time.monotonic_ns()}", tick_s=0.2)
    assert not result.errors, result.errors
    live = result.histories["wide-grpo"]
    assert [len(e["nodes"]) for e in result.phase_log if e["outcome"] == "released"] == [2] * 2 * GRPO_ITERATIONS
    for got, expected in zip(live, grpo_in_one_process(), strict=True):
        assert got["reward"] == expected["reward"]
        assert got["loss"] == pytest.approx(expected["loss"], rel=1e-5)
