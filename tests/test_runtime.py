"""Real jobs on the one control plane, real Ray and real torch: multiplexing keeps results
bit-identical, turns alternate, failures are reported with their cause, a crashed worker
costs no completed step, and the workers fence out whoever no longer holds their node."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import ray

from rollmux.core.errors import StaleEpoch
from rollmux.core.spec import Pool
from rollmux.dataplane.executor import RayExecutor
from rollmux.dataplane.nodes import NodeProvisioner, standby_worker, worker_of
from rollmux.dataplane.warm import WarmOptions
from rollmux.dataplane.workers import PhaseNotGranted, PoolWorker
from rollmux.inputs.runfile import RunFile
from rollmux.jobs.grpo import GRPOConfig, GRPOJob, GRPORollout, GRPOTrainer
from rollmux.live.launch import RunResult, run_plan
from rollmux.sdk.jobcode import JOB_CODE
from rollmux.sdk.session import Session, phase
from rollmux.wire.client import ServiceError
from tests.local_ray import fresh_local_ray
from tests.test_recovery import wait_until

SMALL = {"prompts_per_iteration": 64, "train_groups": 32}


def job(name: str, seed: int = 0, iterations: int = 4, entrypoint: str | None = None, **fields) -> dict:
    spec = {"name": name, "iterations": iterations, "slo": fields.pop("slo", 3.0), **fields}
    if entrypoint:
        return {**spec, "entrypoint": entrypoint, "args": {"seed": seed, **SMALL}}
    return {**spec, "grpo": {"seed": seed, **SMALL}}


def run(tmp_path: Path, *jobs: dict, **cluster) -> RunResult:
    """Jobs stay where they are placed (no regrouping, no SLO guard: tests/test_migration.py
    tests those), so the turns of one group are what is measured."""
    fixed = {"lease_s": 2.0, "regroup": False, "slo_guard": False}
    plan = RunFile.model_validate({"cluster": {**fixed, **cluster}, "jobs": list(jobs)})
    return run_plan(plan, tmp_path / f"run-{time.monotonic_ns()}", tick_s=0.2)


def losses_and_rewards(history: list[dict[str, float]]) -> list[tuple[float, float]]:
    return [(m["loss"], m["reward"]) for m in history]


@pytest.fixture(scope="module")
def local_ray():
    yield from fresh_local_ray(rollout_nodes=2, train_nodes=2)


@pytest.fixture(scope="module")
def alone_and_multiplexed(local_ray, tmp_path_factory):
    folder = tmp_path_factory.mktemp("runs")
    return run(folder, job("a")), run(folder, job("a"), job("b", seed=1))


def test_multiplexing_does_not_change_what_a_job_computes(alone_and_multiplexed):
    alone, together = alone_and_multiplexed
    assert not alone.errors and not together.errors
    solo = losses_and_rewards(alone.histories["a"])
    assert len(solo) == 4 and solo == losses_and_rewards(together.histories["a"])
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
    for name in ("a", "b"):
        phases = [r.phase for r in together.records if r.job == name]
        assert phases == ["rollout", "train"] * 4
    assert {v["state"] for v in together.views.values()} == {"done"}
    assert together.summary["nodes"] == {"rollout": 0, "train": 0}  # everything released


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


@dataclass(frozen=True)
class TrainsFirst(GRPOJob):
    """A faulty job loop that asks for training before any rollout."""

    def run(self, session: Session) -> list[dict[str, float]]:
        with phase("train"):
            pass
        return []


def test_failures_are_reported_with_their_cause_and_release_the_nodes(local_ray, tmp_path):
    result = run(
        tmp_path,
        job("forgetful", iterations=3, entrypoint="tests.test_runtime:ForgetsWeightSync.from_context"),
        job("eager", iterations=1, entrypoint="tests.test_runtime:TrainsFirst.from_context"),
        job("missing", entrypoint="tests.no_such_module:Job"),
    )
    assert "StaleWeights" in result.errors["forgetful"]
    assert "needs weights version 1, holds 0" in result.errors["forgetful"]
    assert "rollout phase comes first" in result.errors["eager"]
    assert "cannot import tests.no_such_module" in result.errors["missing"]
    assert result.summary["nodes"] == {"rollout": 0, "train": 0}


def test_residency_limit_is_enforced_when_a_role_is_loaded(local_ray, tmp_path):
    result = run(tmp_path, job("big"), host_memory_gb=1e-5)
    assert "ResidencyExceeded" in result.errors["big"]


def test_a_job_wider_than_the_cluster_is_refused_before_anything_runs(local_ray, tmp_path):
    with pytest.raises(ServiceError, match="needs 3 rollout node\\(s\\) at once; the cluster offers 2"):
        run(tmp_path, job("wide", rollout_width=3))


class CrashingTrainer(GRPOTrainer):
    """A trainer whose process dies on request: a real crash, not an exception."""

    def crash(self) -> None:
        os._exit(1)


@dataclass(frozen=True)
class CrashesOnce(GRPOJob):
    """Runs two checkpointed iterations, then kills its trainer's worker process in the
    middle of iteration 2's training; restarted, it runs to the end."""

    def role_factory(self, phase_name: str):
        if phase_name == "train":
            return partial(CrashingTrainer, self.config, self.checkpoint)
        return super().role_factory(phase_name)

    def run(self, session: Session) -> list[dict[str, float]]:
        marker = Path(f"{self.checkpoint}.crashed")
        if marker.exists():
            return super().run(session)
        GRPOJob(self.config, 2, self.checkpoint).run(session)
        marker.touch()
        with phase("rollout"):
            session.call("rollout", "generate", 2)
        with phase("train"):
            session.call("train", "crash")
        raise AssertionError("unreachable: the trainer's process died")


@pytest.mark.slow  # a long live scenario: bench/scenarios.py runs it
def test_completed_steps_survive_a_crash_of_the_trainer_process(local_ray, tmp_path):
    result = run(
        tmp_path,
        job("reference", iterations=5),
        job("crashed", iterations=5, entrypoint="tests.test_runtime:CrashesOnce.from_context"),
    )
    assert not result.errors
    crashed = result.views["crashed"]
    assert (crashed["state"], crashed["restarts"]) == ("done", 1)
    assert losses_and_rewards(result.histories["crashed"]) == losses_and_rewards(result.histories["reference"])
    trained = [e["iteration"] for e in result.phase_log if e["job"] == "crashed" and e["phase"] == "train"]
    assert trained == [0, 1, 2, 2, 3, 4]  # iteration 2 ran again (its first try was revoked), nothing else


def test_emulated_jobs_wait_their_phases_on_real_tensors(local_ray, tmp_path):
    emulated = {"rollout_s": 0.2, "train_s": 0.1, "rollout_mib": 4, "train_mib": 8}
    entry = "rollmux.jobs.emulated:EmulatedJob.from_context"
    result = run(tmp_path, *(job(n, iterations=4, entrypoint=entry) | {"args": emulated} for n in ("e1", "e2")))
    assert not result.errors and [len(result.histories[n]) for n in ("e1", "e2")] == [4, 4]
    expected = {"rollout": 0.2, "train": 0.1}
    for record in result.records:
        assert record.released - record.granted < expected[record.phase] + 2.0  # none stuck
        assert record.wake_s > 0 and record.sleep_s > 0
    # The job waits out each phase from grant to release (its switching included), less the
    # hand-back it expects from the last ones, a moving average: one phase may be short by
    # as much as that average is off (105 ms beside a CPU hog), but over the run they hold
    # what the profile says.
    for kind, seconds in expected.items():
        held = [r.released - r.granted for r in result.records if r.phase == kind]
        assert sum(held) / len(held) >= 0.75 * seconds, (kind, held)
    assert {r.nodes for r in result.records if r.phase == "rollout"} == {result.records[0].nodes}  # one group


def worker() -> PoolWorker:
    node = PoolWorker(pool="rollout", host_limit_bytes=2**30)
    node.assign(0)
    for name, seed in (("a", 0), ("b", 1)):
        node.load(name, "rollout", 1, lambda seed=seed: GRPORollout(GRPOConfig(seed=seed, **SMALL)))
    return node


def test_worker_refuses_a_call_outside_the_phase():
    node = worker()
    with pytest.raises(PhaseNotGranted):
        node.call("a", "rollout", 1, 1, "generate", 0)
    node.wake("a", "rollout", 1, 1)
    assert node.call("a", "rollout", 1, 1, "generate", 0)["iteration"] == 0


def test_worker_fences_out_older_grants_and_epochs():
    node = worker()
    node.wake("a", "rollout", 1, 5)
    node.wake("b", "rollout", 1, 6)  # b's newer grant: a's role is put back to sleep
    assert node.awake == ("b", "rollout") and not node.roles[("a", "rollout")].state.awake
    with pytest.raises((StaleEpoch, PhaseNotGranted)):
        node.call("a", "rollout", 1, 5, "generate", 0)
    with pytest.raises(StaleEpoch, match="grant 5 of a is older than grant 6"):
        node.wake("a", "rollout", 1, 5)
    node.load("a", "rollout", 2, lambda: GRPORollout(GRPOConfig(**SMALL)))  # a restarted: epoch 2
    with pytest.raises(StaleEpoch, match="a epoch 1 is stale"):
        node.load("a", "rollout", 1, lambda: GRPORollout(GRPOConfig(**SMALL)))
    with pytest.raises(StaleEpoch):
        node.wake("a", "rollout", 1, 7)
    node.wake("a", "rollout", 2, 7)
    assert node.call("a", "rollout", 2, 7, "generate", 0)["iteration"] == 0


def test_a_one_call_phase_wakes_runs_and_sleeps_the_role_in_one_call():
    node = worker()
    batch, (wake_s, busy_s, sleep_s) = node.run_phase("a", "rollout", 1, 3, "generate", 0)
    assert batch["iteration"] == 0 and wake_s > 0 and busy_s > 0 and sleep_s > 0
    assert node.awake is None and not node.roles[("a", "rollout")].state.awake and node.fence == 3
    with pytest.raises(StaleEpoch, match="grant 2 of b is older than grant 3"):
        node.run_phase("b", "rollout", 1, 2, "generate", 0)
    with pytest.raises(AttributeError):
        node.run_phase("b", "rollout", 1, 4, "no_such_method")
    assert node.awake is None and not node.roles[("b", "rollout")].state.awake  # asleep although it raised


def test_an_emptied_worker_serves_its_next_node_and_still_fences_out_its_old_jobs():
    node = worker()
    node.wake("a", "rollout", 1, 5)
    node.wake("b", "rollout", 1, 6)
    node.reset()  # its node was released; the worker waits, warm, for the next one
    assert not node.roles and node.awake is None and node.host_bytes() == 0
    node.assign(7)
    with pytest.raises(StaleEpoch, match="grant 5 of a is older than grant 6"):
        node.wake("a", "rollout", 1, 5)  # a zombie of a job that was here
    with pytest.raises(KeyError, match="no rollout role on node 7"):
        node.wake("a", "rollout", 1, 7)
    node.load("c", "rollout", 1, lambda: GRPORollout(GRPOConfig(**SMALL)))
    node.wake("c", "rollout", 1, 8)
    assert node.call("c", "rollout", 1, 8, "generate", 0)["iteration"] == 0


def test_a_released_nodes_worker_serves_the_next_node_of_its_pool(local_ray):
    nodes = NodeProvisioner(2**30, JOB_CODE.sandbox, warm=1)
    nodes.ensure(0, Pool.ROLLOUT)
    asyncio.run(nodes.ready(0))
    first = ray.get(worker_of(0).where.remote())
    nodes.release(0)
    with pytest.raises(ValueError, match="node 0 has no worker"):
        worker_of(0)
    nodes.ensure(5, Pool.ROLLOUT)
    nodes.ensure(6, Pool.TRAIN)
    asyncio.run(nodes.ready(5))
    asyncio.run(nodes.ready(6))
    try:
        assert ray.get(worker_of(5).where.remote())["pid"] == first["pid"]  # no process started for node 5
        assert ray.get(worker_of(6).where.remote())["pid"] != first["pid"]  # a train node: another worker
    finally:
        nodes.release_all()


def test_a_restarted_executor_finds_the_drivers_and_spare_workers_that_outlived_it(local_ray):
    warm = WarmOptions(drivers_per_process=4, spare_workers=1, standby_workers=1)
    before = RayExecutor(2**30, JOB_CODE, warm=warm)
    before.connect("http://127.0.0.1:9", "token")  # nobody answers: the driver keeps retrying its session
    asyncio.run(before.warm_up())
    asyncio.run(before.start_driver("a", 3))
    host = before.drivers["a"][1].handle
    wait_until(lambda: ray.get(host.drivers.remote()) == {"a": 3})
    spare = before.nodes.spares[Pool.ROLLOUT][0].name
    standby = before.nodes.standbys[Pool.TRAIN][0].name
    after = RayExecutor(2**30, JOB_CODE, warm=warm)
    after.connect("http://127.0.0.1:9", "token")  # restarted at the same address: its drivers are adopted
    try:
        assert asyncio.run(after.driver_alive("a", 3)) and not asyncio.run(after.driver_alive("a", 2))
        assert asyncio.run(after.driver_pid("a")) == asyncio.run(before.driver_pid("a"))
        assert [s.name for s in after.nodes.spares[Pool.ROLLOUT]] == [spare]
        assert [s.name for s in after.nodes.standbys[Pool.TRAIN]] == [standby]
        assert standby_worker(Pool.TRAIN, 0)._actor_id == after.nodes.standbys[Pool.TRAIN][0].worker._actor_id
    finally:
        asyncio.run(before.close())


class SlowRollout(GRPORollout):
    def slow(self, seconds: float) -> float:
        time.sleep(seconds)
        return time.monotonic()


def test_a_zombie_call_finishes_before_the_next_holder_wakes():
    node = PoolWorker(pool="rollout", host_limit_bytes=2**30)
    node.load("zombie", "rollout", 1, lambda: SlowRollout(GRPOConfig(**SMALL)))
    node.load("next", "rollout", 1, lambda: GRPORollout(GRPOConfig(**SMALL)))
    node.wake("zombie", "rollout", 1, 1)
    finished: list[float] = []
    call = threading.Thread(target=lambda: finished.append(node.call("zombie", "rollout", 1, 1, "slow", 0.5)))
    call.start()
    time.sleep(0.1)
    node.wake("next", "rollout", 1, 2)
    woke = time.monotonic()
    call.join()
    assert finished and finished[0] <= woke


def test_phase_api_outside_a_job_is_refused():
    with pytest.raises(ValueError, match="unknown phase"):
        phase("evaluate")
    with pytest.raises(RuntimeError, match="no session"), phase("rollout"):
        pass


def test_phase_decorator_form_needs_a_session_too():
    @phase("train")
    def step() -> None:
        raise AssertionError("must not run outside a job")

    with pytest.raises(RuntimeError, match="no session"):
        step()


@pytest.mark.slow  # a long live scenario: bench/scenarios.py runs it
def test_a_standby_that_dies_is_replaced_and_named_in_its_place(local_ray):
    executor = RayExecutor(2**30, JOB_CODE, warm=WarmOptions(standby_workers=1))

    async def kill_the_first_and_wait_for_another() -> tuple[str, str, Any, Any, Any]:
        try:
            await executor.warm_up()
            first = executor.nodes.standbys[Pool.TRAIN][0]
            ray.kill(first.worker)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                await asyncio.sleep(0.5)
                now = executor.nodes.standbys[Pool.TRAIN]
                if now and now[0].name != first.name:
                    named = await asyncio.to_thread(standby_worker, Pool.TRAIN, 0)
                    return first.name, now[0].name, named, now[0].worker, (await named.where.remote())["node_id"]
            raise TimeoutError("the dead standby was not replaced")
        finally:
            await executor.close()  # its watch and refill end on this loop

    dead, new, named, kept, serving = asyncio.run(kill_the_first_and_wait_for_another())
    assert dead != new and named is not None and named._actor_id == kept._actor_id and serving is None


def test_nodes_placed_as_others_are_released_take_their_units_in_one_sync(local_ray):
    # A job that ends and one placed on new node ids in the same reconciliation: the new
    # nodes must get the units the old ones give back (as spares or not), not wait forever
    # for units that spares keep.
    executor = RayExecutor(2**30, JOB_CODE, warm=WarmOptions(spare_workers=2))
    try:
        asyncio.run(executor.sync_nodes({0: Pool.ROLLOUT, 1: Pool.ROLLOUT}))
        asyncio.run(executor.wait_nodes((0, 1)))
        asyncio.run(executor.sync_nodes({2: Pool.ROLLOUT, 3: Pool.ROLLOUT}))
        asyncio.run(asyncio.wait_for(executor.wait_nodes((2, 3)), timeout=30))
        assert sorted(executor.nodes.nodes) == [2, 3]
    finally:
        asyncio.run(executor.close())
