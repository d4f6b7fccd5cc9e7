"""Two TRL GRPO jobs rolling out on vLLM engines, multiplexed on one rollout and one training
node by the real control plane, compute bit-identical losses and rewards to each job alone:
one engine per job, per-request seeds, and a host copy loaded back at every wake leave
nothing of one job in the other's numbers."""

from __future__ import annotations

import pytest

from tests.test_trl import alone_and_together, losses_and_rewards, trl_job

pytestmark = pytest.mark.slow  # a long live scenario: bench/scenarios.py runs it

ITERATIONS = 3
ENGINE = {"engine": "vllm", "hidden_size": 128, "heads": 2, "kv_heads": 1}


def vllm_job(name: str, seed: int) -> dict:
    job = trl_job(name, seed)
    return {**job, "iterations": ITERATIONS, "args": {**job["args"], **ENGINE}}


@pytest.fixture(scope="module")
def alone_and_multiplexed(tmp_path_factory):
    yield from alone_and_together(tmp_path_factory.mktemp("vllm-runs"), vllm_job("a", 0), vllm_job("b", 1))


def test_two_vllm_trl_jobs_multiplexed_compute_what_each_computes_alone(alone_and_multiplexed):
    alone_a, alone_b, together = alone_and_multiplexed
    assert not alone_a.errors and not alone_b.errors and not together.errors
    solo_a, solo_b = losses_and_rewards(alone_a.histories["a"]), losses_and_rewards(alone_b.histories["b"])
    assert len(solo_a) == ITERATIONS and solo_a != solo_b
    assert losses_and_rewards(together.histories["a"]) == solo_a
    assert losses_and_rewards(together.histories["b"]) == solo_b
    nodes = {(r.job, r.phase): r.nodes for r in together.records}
    assert nodes[("a", "rollout")] == nodes[("b", "rollout")]
    assert nodes[("a", "train")] == nodes[("b", "train")]
