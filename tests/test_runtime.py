"""The Ray runtime with real Ray and real torch: multiplexing, isolation of failures,
on-policy weight sync, residency and capacity limits."""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass
from functools import partial

import pytest
import ray

from rollmux.core.spec import JobSpec, PhaseTime
from rollmux.core.turns import PhaseRecord
from rollmux.jobs.grpo import GRPOConfig, GRPOJob, GRPORollout, GRPOTrainer
from rollmux.runtime.control import ControlPlane, RuntimeConfig
from rollmux.runtime.launch import run_jobs, start_ray
from rollmux.runtime.session import Session, phase
from rollmux.runtime.workers import PhaseNotGranted, PoolWorker

SMALL = {"prompts_per_iteration": 64, "train_groups": 32}


def spec(name: str, slo: float = 2.0, rollout_width: int = 1) -> JobSpec:
    return JobSpec(name, PhaseTime.fixed(1.0), PhaseTime.fixed(1.0), slo=slo, rollout_width=rollout_width)


def grpo(seed: int, iterations: int = 4) -> GRPOJob:
    return GRPOJob(GRPOConfig(seed=seed, **SMALL), iterations)


@pytest.fixture(scope="module")
def local_ray():
    start_ray(rollout_nodes=2, train_nodes=2)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def alone_and_multiplexed(local_ray):
    alone = run_jobs([(spec("a"), grpo(seed=0))])
    together = run_jobs([(spec("a"), grpo(seed=0)), (spec("b"), grpo(seed=1))])
    return alone, together


def test_multiplexing_does_not_change_what_a_job_computes(alone_and_multiplexed):
    alone, together = alone_and_multiplexed
    assert not alone.errors and not together.errors
    solo = [(m["loss"], m["reward"]) for m in alone.histories["a"]]
    shared = [(m["loss"], m["reward"]) for m in together.histories["a"]]
    assert len(solo) == 4 and solo == shared
    assert together.histories["a"] != together.histories["b"]


def test_the_two_jobs_share_one_group_and_take_turns(alone_and_multiplexed):
    _, together = alone_and_multiplexed
    nodes = {(r.job, r.phase): r.nodes for r in together.records}
    assert nodes[("a", "rollout")] == nodes[("b", "rollout")]
    assert nodes[("a", "train")] == nodes[("b", "train")]
    by_node: dict[int, list] = {}
    for r in together.records:
        for node in r.nodes:
            by_node.setdefault(node, []).append((r.granted, r.released))
    for spans in by_node.values():
        spans.sort()
        assert all(later[0] >= earlier[1] for earlier, later in zip(spans, spans[1:], strict=False))
    for job in ("a", "b"):
        phases = [r.phase for r in sorted(together.records, key=lambda r: r.started) if r.job == job]
        assert phases == ["rollout", "train"] * 4


def test_warm_switches_are_measured(alone_and_multiplexed):
    _, together = alone_and_multiplexed
    assert all(r.wake_s > 0 and r.sleep_s > 0 for r in together.records)


@dataclass(frozen=True)
class ForgetsWeightSync(GRPOJob):
    """A faulty job loop that never sends the trainer's weights to the rollout side."""

    def run(self, session: Session) -> list[dict[str, float]]:
        for iteration in range(self.iterations):
            with phase("rollout"):
                batch = session.call("rollout", "generate", iteration)
            with phase("train"):
                session.fetch(session.call("train", "train", batch))
        return []


def test_rollout_refuses_stale_weights_in_the_runtime(local_ray):
    result = run_jobs([(spec("forgetful"), ForgetsWeightSync(GRPOConfig(**SMALL), 3))])
    assert "StaleWeights" in result.errors["forgetful"]
    assert "needs weights version 1, holds 0" in result.errors["forgetful"]
    assert result.snapshot["nodes"] == {"rollout": 0, "train": 0}


@dataclass(frozen=True)
class TrainsFirst(GRPOJob):
    """A faulty job loop that asks for training before any rollout."""

    def run(self, session: Session) -> list[dict[str, float]]:
        with phase("train"):
            pass
        return []


def test_a_phase_out_of_order_is_refused_at_once(local_ray):
    result = run_jobs([(spec("eager"), TrainsFirst(GRPOConfig(**SMALL), 1))])
    assert "PhaseOrderError" in result.errors["eager"]
    assert "rollout phase comes first" in result.errors["eager"]


def test_residency_limit_is_enforced_when_a_role_is_loaded(local_ray):
    result = run_jobs([(spec("big"), grpo(seed=0))], RuntimeConfig(host_limit_bytes=10_000))
    assert "ResidencyExceeded" in result.errors["big"]
    assert result.snapshot["nodes"] == {"rollout": 0, "train": 0}


def test_a_placement_ray_cannot_provide_is_rolled_back(local_ray):
    config = RuntimeConfig(ready_timeout_s=2.0)
    result = run_jobs([(spec("wide", rollout_width=3), grpo(seed=0))], config)
    assert "no free rollout node" in result.errors["wide"]
    assert result.snapshot["jobs"] == {} and result.snapshot["nodes"] == {"rollout": 0, "train": 0}


def test_phase_api_outside_a_job_is_refused():
    with pytest.raises(ValueError, match="unknown phase"):
        phase("evaluate")
    with pytest.raises(RuntimeError, match="no session"), phase("rollout"):
        pass


def test_worker_refuses_a_call_outside_the_phase():
    worker = PoolWorker(node_id=0, pool="rollout", host_limit_bytes=2**30)
    worker.load("a", lambda: GRPORollout(GRPOConfig(**SMALL)))
    with pytest.raises(PhaseNotGranted):
        worker.call("a", "generate", 0)
    worker.wake("a")
    assert worker.call("a", "generate", 0)["iteration"] == 0


def test_phase_decorator_form_needs_a_session_too():
    @phase("train")
    def step() -> None:
        raise AssertionError("must not run outside a job")

    with pytest.raises(RuntimeError, match="no session"):
        step()


def test_measured_phases_feed_the_jobs_profile_in_the_core(local_ray):
    control = ControlPlane(RuntimeConfig())

    async def scenario() -> PhaseTime:
        await control.submit(spec("a"))
        await control.activate("a")
        for phase_name, seconds in (("rollout", 0.25), ("train", 0.5)):
            await control.acquire("a", phase_name)
            now = time.time()
            record = PhaseRecord("a", phase_name, 0, (0,), now, now, now, now + seconds, now + seconds, 0.0, 0.0)
            await control.release(record)
        profile = control.cluster.group_of("a").members[0].job
        await control.complete("a")
        await control.shutdown()
        return profile.rollout, profile.train

    rollout, train = asyncio.run(scenario())
    assert rollout.mean == pytest.approx(0.25) and train.mean == pytest.approx(0.5)


class CrashingTrainer(GRPOTrainer):
    """A trainer whose process dies on request: a real crash, not an exception."""

    def crash(self) -> None:
        os._exit(1)


@dataclass(frozen=True)
class CrashesAfterCheckpoints(GRPOJob):
    """Runs ``iterations`` checkpointed iterations, then kills its trainer's process."""

    def role_factory(self, phase_name: str):
        if phase_name == "train":
            return partial(CrashingTrainer, self.config, self.checkpoint)
        return super().role_factory(phase_name)

    def run(self, session: Session) -> list[dict[str, float]]:
        history = super().run(session)
        with phase("rollout"):
            pass
        with phase("train"):
            session.call("train", "crash")
        return history


def losses_and_rewards(history: list[dict[str, float]]) -> list[tuple[float, float]]:
    return [(m["loss"], m["reward"]) for m in history]


def test_completed_steps_survive_a_crash_of_the_trainer_process(local_ray, tmp_path):
    reference = run_jobs([(spec("ref"), grpo(seed=0, iterations=5))])
    checkpoint = str(tmp_path / "job.pt")
    crashed = run_jobs([(spec("job"), CrashesAfterCheckpoints(GRPOConfig(seed=0, **SMALL), 3, checkpoint))])
    assert "job" in crashed.errors  # the trainer's process died
    resumed = run_jobs([(spec("job"), GRPOJob(GRPOConfig(seed=0, **SMALL), 5, checkpoint))])
    assert not resumed.errors
    assert [r.iteration for r in resumed.records if r.phase == "train"] == [3, 4]  # only what was missing ran
    assert losses_and_rewards(resumed.histories["job"]) == losses_and_rewards(reference.histories["ref"])
