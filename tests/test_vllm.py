"""The vLLM rollout adapter on a real engine (needs a GPU and the ``vllm`` extra; skipped
otherwise): offload keeps the weights in host memory and wakes to the same greedy
answers, discard keeps nothing and refuses to generate until packed weights arrive."""

from __future__ import annotations

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]
pytest.importorskip("vllm")

from rollmux.core.errors import WeightsDiscarded  # noqa: E402
from rollmux.jobs.trl_grpo import TRLTask, initial_model  # noqa: E402
from rollmux.jobs.vllm_rollout import VLLMRollout  # noqa: E402
from rollmux.runtime.weights import Publisher  # noqa: E402

GREEDY = {"temperature": 0.0, "max_tokens": 3}
PROMPTS = ["1+2=", "7+5="]


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    """A small random Qwen2 and its tokenizer written as a model folder (nothing downloaded)."""
    folder = tmp_path_factory.mktemp("model")
    task = TRLTask(seed=1, hidden_size=64, heads=4, kv_heads=2)
    tokenizer = task.tokenizer()
    model = initial_model(task, tokenizer)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    weights = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    rollout = VLLMRollout(str(folder), weights, gpu_memory_utilization=0.2, enforce_eager=True, dtype="float32")
    return rollout, model


def test_offload_keeps_the_weights_and_wakes_to_the_same_answers(engine):
    rollout, _ = engine
    before = rollout.generate(PROMPTS, GREEDY, iteration=0)
    free_awake = torch.cuda.mem_get_info()[0]
    rollout.sleep("offload")
    assert torch.cuda.mem_get_info()[0] > free_awake
    assert rollout.footprint().host_bytes == rollout.weights_bytes
    rollout.wake()
    assert rollout.generate(PROMPTS, GREEDY, iteration=0) == before


def test_discard_keeps_nothing_until_packed_weights_arrive(engine):
    rollout, model = engine
    before = rollout.generate(PROMPTS, GREEDY, iteration=0)
    rollout.sleep("discard")
    assert rollout.footprint().host_bytes == 0
    rollout.wake()
    with pytest.raises(WeightsDiscarded):
        rollout.generate(PROMPTS, GREEDY, iteration=0)
    rollout.load_weights(1, Publisher(model).publish(1))
    assert rollout.generate(PROMPTS, GREEDY, iteration=1) == before
