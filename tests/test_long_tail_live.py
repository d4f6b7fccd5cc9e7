"""Long-tail rollout migration live (issue 29): two TRL jobs on vLLM engines share two
rollout nodes and one training node; their responses are long-tailed. With migration on,
each rollout moves its unfinished requests onto one node once 80 % are done and sheds the
other, where the other job's rollout starts before the tail ends (the phase log shows it);
no node ever holds two jobs' phases; every chunk of every moved request ran on the
iteration's weights; and each job's rewards are those it gets without migration (the
chunks are seeded by request, never by node, so they are the same numbers)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import ray

from rollmux.dataplane.connect import start_ray
from rollmux.inputs.runfile import RunFile
from rollmux.live.launch import RunResult, run_plan

pytestmark = pytest.mark.slow  # two live runs of four vLLM engines each, 4-7 minutes: bench/scenarios.py runs it

ENTRYPOINT = "rollmux.jobs.tail_grpo:TailTRLJob.from_context"
ITERATIONS = 3
TASK = {"prompts_per_iteration": 4, "num_generations": 4, "median_tokens": 6.0, "length_sigma": 1.0}


def tailed_job(name: str, seed: int, migrate: bool) -> dict[str, Any]:
    job = {
        "name": name,
        "iterations": ITERATIONS,
        "slo": 3.0,
        "rollout_width": 2,
        "entrypoint": ENTRYPOINT,
        "args": {**TASK, "seed": seed},
    }
    return job | ({"tail": {"share": 0.3, "nodes": 1, "threshold": 0.8}} if migrate else {})


def run(folder: Path, migrate: bool) -> RunResult:
    cluster = {"rollout_nodes": 2, "train_nodes": 1, "lease_s": 5.0, "regroup": False, "slo_guard": False}
    jobs = [tailed_job("a", 0, migrate), tailed_job("b", 1, migrate)]
    plan = RunFile.model_validate({"cluster": cluster, "jobs": jobs})
    return run_plan(plan, folder / f"run-{time.monotonic_ns()}", tick_s=0.2)


@pytest.fixture(scope="module")
def with_and_without(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tail-runs")
    if ray.is_initialized():
        ray.shutdown()
    start_ray(rollout_nodes=2, train_nodes=1)
    try:
        yield run(folder, migrate=True), run(folder, migrate=False)
    finally:
        ray.shutdown()


def lines(result: RunResult, outcome: str | None = None) -> list[dict[str, Any]]:
    return [e for e in result.phase_log if e["phase"] == "rollout" and outcome in (None, e["outcome"])]


def test_the_next_rollout_starts_on_a_shed_node_before_the_tail_ends(with_and_without):
    moved, _ = with_and_without
    assert not moved.errors
    sheds = lines(moved, "shed")
    assert sheds, "no rollout shed a node"
    overlapped = 0
    for shed in sheds:
        tail_end = max(
            e["ended_at"]
            for e in lines(moved)
            if e["job"] == shed["job"] and e["iteration"] == shed["iteration"] and e["outcome"] != "shed"
        )
        starts = [
            e["granted_at"]
            for e in lines(moved)
            if e["job"] != shed["job"] and shed["nodes"][0] in e["nodes"] and e["granted_at"] >= shed["ended_at"]
        ]
        overlapped += bool(starts) and min(starts) < tail_end
    assert overlapped >= 1, "no rollout started on a shed node while the tail ran"


def test_no_node_ever_holds_two_jobs_phases(with_and_without):
    for result in with_and_without:
        held: dict[int, list[tuple[float, float, str]]] = {}
        for entry in result.phase_log:
            for node in entry["nodes"]:
                held.setdefault(node, []).append((entry["granted_at"], entry["ended_at"], entry["job"]))
        for node, spans in held.items():
            spans.sort()
            for (_, end, first), (start, _, second) in zip(spans, spans[1:], strict=False):
                assert end <= start, f"node {node}: {first} until {end}, {second} from {start}"


def test_moved_requests_finish_on_the_iterations_weights(with_and_without):
    moved, still = with_and_without
    for job in "ab":
        history = moved.histories[job]
        assert len(history) == ITERATIONS
        assert all(m["chunks_off_policy"] == 0 for m in history)
        moves = [m["tail_moved_at"] for m in history if m["tail_moved_at"] >= 0]
        assert moves and all(at >= 0.8 for at in moves)  # a rollout that never got both nodes has none
        assert sum(m["requests_moved"] for m in history) > 0
        assert all(m["tail_moved_at"] == -1 and m["requests_moved"] == 0 for m in still.histories[job])


def test_rewards_are_those_without_migration(with_and_without):
    moved, still = with_and_without
    assert not still.errors
    for job in "ab":
        with_move = [(m["reward"], m["tokens"]) for m in moved.histories[job]]
        without = [(m["reward"], m["tokens"]) for m in still.histories[job]]
        assert with_move == pytest.approx(without, abs=1e-9)
