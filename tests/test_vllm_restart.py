"""A vLLM engine killed in the middle of a job (SIGKILL in its rollout, as an operator's
``kill -9`` or the memory monitor would) restarts the job: the control plane takes the lost
process for a platform failure, the job's roles are built again with a new engine, and it
resumes from its checkpoint computing what it computes undisturbed."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import pytest
import ray

from rollmux.inputs.runfile import RunFile
from rollmux.jobs.trl_grpo import TRLTask, TRLTrainer, TRLVLLMRollout
from rollmux.live.launch import run_plan
from rollmux.wire.failpoints import ONCE_VARIABLE, SKIP_VARIABLE, VARIABLE
from tests.local_ray import fresh_local_ray

ITERATIONS = 2
ARGS = {"seed": 7, "hidden_size": 128, "heads": 2, "kv_heads": 1, "engine": "vllm"}


@pytest.fixture(scope="module")
def armed_ray(tmp_path_factory) -> Iterator[None]:
    """Ray whose processes (the engines' among them) inherit a failpoint that kills the
    first engine at its second generation: the job's second rollout."""
    armed = {VARIABLE: "engine:generate", SKIP_VARIABLE: "1", ONCE_VARIABLE: str(tmp_path_factory.mktemp("fp") / "m")}
    os.environ.update(armed)
    try:
        yield from fresh_local_ray(rollout_nodes=1, train_nodes=1)
    finally:
        for name in armed:
            os.environ.pop(name, None)


def undisturbed(task: TRLTask) -> list[tuple[float, float]]:
    rollout, trainer = TRLVLLMRollout(task), TRLTrainer(task)
    for iteration in range(ITERATIONS):
        trainer.train(rollout.generate(iteration))
        rollout.load_weights(*trainer.weights())
    return [(m["loss"], m["reward"]) for m in trainer.history]


@pytest.mark.slow
def test_a_killed_vllm_engine_restarts_its_job_which_resumes_as_if_undisturbed(armed_ray, tmp_path):
    job = {"name": "k", "iterations": ITERATIONS, "slo": 3.0, "entrypoint": "rollmux.jobs.trl_grpo:TRLJob.from_context"}
    cluster = {"rollout_nodes": 1, "train_nodes": 1, "lease_s": 2.0, "regroup": False, "slo_guard": False}
    plan = RunFile.model_validate({"cluster": cluster, "jobs": [{**job, "args": ARGS}]})
    result = run_plan(plan, tmp_path / f"run-{time.monotonic_ns()}", tick_s=0.2)
    assert not result.errors, result.errors
    # The kill costs one restart; on a loaded machine the new engine's cold start may cost
    # its driver one more lease (seen beside a CPU hog): a restart, never a loss of steps.
    assert result.views["k"]["restarts"] >= 1
    os.environ.pop(VARIABLE)  # the reference's engine runs unarmed
    expected = undisturbed(TRLTask(**ARGS))
    assert [(m["loss"], m["reward"]) for m in result.histories["k"]] == expected
    assert ray.is_initialized()
