"""TRL's GRPO on vLLM engines with long-tailed responses, its rollout's tail moved onto
fewer nodes: the shipped job of long-tail rollout migration (DESIGN.md 5b, issue 29).

The task is the shipped TRL task (:mod:`rollmux.jobs.trl_grpo`), with response lengths
drawn from a lognormal per request (seeded by the job's seed and the iteration, the
end-of-sequence token ignored until then): a few responses run many times longer than the
median, as a reasoning model's do.

The rollout runs data-parallel, one vLLM engine per rollout node, in chunks of
``chunk_tokens`` tokens per request (:mod:`rollmux.jobs.long_tail`), so the driver knows
how many requests are done after every chunk. Its grant is elastic when the job's spec
has a ``tail`` (:class:`~rollmux.core.spec.RolloutTail`):

- it may start on some of its nodes, and each chunk first asks whether the control plane
  widened it onto more (another job's rollout freed them); the unfinished requests are
  then dealt over all the nodes it holds;
- once ``tail.threshold`` of the requests are done, the unfinished ones move onto the
  first ``tail.nodes`` nodes it holds (prompt and tokens so far; the weights version is
  the same everywhere, so the rollout stays on-policy), the roles on its other nodes
  sleep and those nodes are shed: the next rollout in the group's turns starts there.

Without a tail the same chunks run on all its nodes to the end. A request's chunks are
seeded by the request and its tokens so far, never by the node, so on the same weights the
completions are the same with or without the move, and so are the rewards. Scoring,
advantages and the training step are TRL's, as in the shipped TRL job.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from typing import Any, ClassVar

import ray
import trl
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from rollmux.core.roundrobin import ROLLOUT
from rollmux.jobs.long_tail import Request, draw_lengths, generate_chunk, rollout_metrics, run_chunks, split
from rollmux.jobs.trl_grpo import (
    TRLJob,
    TRLTask,
    TRLTrainer,
    TRLVLLMRollout,
    _help,
    request_seeds,
    scored_rollout,
    tiny_qwen2,
    trainer_sampling,
)
from rollmux.sdk.adapter import ParkedRole
from rollmux.sdk.session import Session


@dataclass(frozen=True)
class TailTask(TRLTask):
    """The shipped TRL task with long-tailed response lengths, on vLLM engines."""

    hidden_size: int = 64
    heads: int = 2
    kv_heads: int = 1
    engine: str = "vllm"
    max_completion_length: int = 48
    median_tokens: float = field(default=6.0, metadata=_help("median response length in tokens (lognormal)"))
    length_sigma: float = field(
        default=1.0, metadata=_help("shape of the lognormal response lengths: the larger, the longer the tail")
    )
    chunk_tokens: int = field(
        default=4, metadata=_help("tokens per request between two looks at the rollout's progress")
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.engine != "vllm":
            raise ValueError("a tailed rollout runs on vLLM engines: engine must be vllm")
        if self.chunk_tokens < 1 or self.median_tokens <= 0 or self.length_sigma < 0:
            raise ValueError("chunk_tokens must be >= 1, median_tokens > 0 and length_sigma >= 0")

    def model(self, tokenizer: PreTrainedTokenizerBase) -> PreTrainedModel:
        """The shipped model with room for the longest response after its prompt."""
        return tiny_qwen2(tokenizer, self.hidden_size, self.layers, self.heads, self.kv_heads, max_positions=64)


class TailRollout(TRLVLLMRollout):
    """The rollout role of one node: the iteration's requests, one chunk of a share of
    them on this node's engine, and TRL's scoring of the completed requests."""

    def __init__(self, task: TailTask, checkpoint: str | None = None):
        super().__init__(task, checkpoint)
        self._completed: list[Request] | None = None

    def requests(self, iteration: int) -> list[Request]:
        """The iteration's requests as TRL would sample them (each prompt
        ``num_generations`` times, TRL's tokenization, one seed each), with drawn lengths."""
        task = self.task
        assert isinstance(task, TailTask)
        rows = [row["prompt"] for row in task.prompts(iteration) for _ in range(task.num_generations)]
        prompt_ids = self.trainer._tokenize_prompts(rows)[0]
        seeds = request_seeds(task.seed, iteration, len(rows))
        lengths = draw_lengths(
            task.seed, iteration, len(rows), task.median_tokens, task.length_sigma, task.max_completion_length
        )
        return [Request(i, list(p), s, n) for i, (p, s, n) in enumerate(zip(prompt_ids, seeds, lengths, strict=True))]

    def chunk(self, iteration: int, requests: list[Request], node: int) -> list[Request]:
        """One chunk of ``requests`` on this node's engine, on the iteration's weights."""
        self.require_version(iteration)
        task = self.task
        assert isinstance(task, TailTask)
        return generate_chunk(self, requests, task.chunk_tokens, trainer_sampling(self.trainer), node)

    def score(self, iteration: int, requests: list[Request]) -> dict[str, Any]:
        """TRL's rollout step on the completed requests: rewards, advantages, the batch."""
        self.require_version(iteration)
        self._iteration, self._completed = iteration, sorted(requests, key=lambda r: r.index)
        try:
            return scored_rollout(self.task, self.trainer, self.rewards, iteration, self.version)
        finally:
            self._completed = None

    def _rollout(self, prompts: list[Any], trainer: trl.GRPOTrainer) -> dict[str, Any]:
        """TRL's ``rollout_func``: the completed requests (the prompts TRL asks for are
        theirs, in the same order)."""
        if self._completed is None:
            return super()._rollout(prompts, trainer)
        prompt_ids = trainer._tokenize_prompts(prompts)[0]
        if [list(p) for p in prompt_ids] != [r.prompt for r in self._completed]:
            raise ValueError("the completed requests are not the prompts TRL scores")
        return {
            "prompt_ids": prompt_ids,
            "completion_ids": [r.tokens for r in self._completed],
            "logprobs": [r.logprobs for r in self._completed],
        }


@dataclass(frozen=True)
class TailTRLJob(TRLJob):
    """The tailed TRL job: entrypoint ``rollmux.jobs.tail_grpo:TailTRLJob.from_context``;
    its spec's ``tail`` turns the migration on (``rollout_width`` above ``tail.nodes``)."""

    task_type: ClassVar[type[TRLTask]] = TailTask
    wide: ClassVar[bool] = True

    def rollout(self, session: Session, iteration: int) -> tuple[Any, dict[str, float]]:
        if len(session.train_nodes) != 1:
            raise ValueError(f"{type(self).__name__} trains on one node; the job asks for {len(session.train_nodes)}")
        first = session.grant.nodes[0] if session.grant else session.rollout_nodes[0]
        requests = session.fetch(session.submit(ROLLOUT, first, "requests", iteration))
        shares, moved_at = run_chunks(session, iteration, split(requests, session.grant.nodes))
        done = sorted((r for share in shares.values() for r in share), key=lambda r: r.index)
        batch = session.submit(ROLLOUT, session.grant.nodes[0], "score", iteration, done)
        ray.wait([batch], fetch_local=False)
        return batch, rollout_metrics(done, iteration, moved_at)

    def role_factory(self, phase_name: str) -> partial[ParkedRole | TRLVLLMRollout]:
        if phase_name != ROLLOUT:
            return partial(TRLTrainer, self.task, self.checkpoint)
        return partial(TailRollout, self.task, self.checkpoint)
