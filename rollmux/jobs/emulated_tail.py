"""An emulated RL job whose rollout has long-tailed responses: the mechanism of long-tail
migration (elastic grants that shed and widen, the driver's chunk loop of
:func:`~rollmux.jobs.long_tail.run_chunks`) measured live without a GPU.

Everything but the engine is real: the control plane grants, sheds and widens, the
workers wake and sleep the roles, the driver moves the same :class:`Request` records as
the vLLM job (:mod:`rollmux.jobs.tail_grpo`). The engine is a wait, as a GPU's decoding is
for the host: a chunk takes ``step_s`` per decode step of its longest request (a GPU decodes
a batch that fits at one pace, whatever its size), plus ``prefill_s`` for each request new
to the engine (its prompt and tokens so far prefilled again after a move). A wait uses no
core, so the figure does not depend on what else runs on the machine.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any

from rollmux.core.errors import StaleWeights
from rollmux.core.roundrobin import ROLLOUT, TRAIN
from rollmux.jobs.emulated import EmulatedRole
from rollmux.jobs.long_tail import Request, advance, chunk_prompts, draw_lengths, rollout_metrics, run_chunks, split
from rollmux.jobs.vllm_engine import Completion
from rollmux.sdk.program import JobContext
from rollmux.sdk.session import Session, phase


@dataclass(frozen=True)
class TailConfig:
    """The emulated rollout: its requests and their lognormal lengths, the engine's pace."""

    seed: int = 0
    requests: int = 32
    median_tokens: float = 8.0
    length_sigma: float = 1.0
    max_tokens: int = 96
    chunk_tokens: int = 8
    step_s: float = 0.02
    """One decode step of a whole batch."""
    prefill_s: float = 0.005
    """Prefilling one moved request on the engine it moved to."""
    train_s: float = 0.5


class EmulatedTailRollout(EmulatedRole):
    """The rollout role of one node: requests with drawn lengths, chunks that wait."""

    def __init__(self, config: TailConfig):
        super().__init__(1.0)
        self.config = config

    def requests(self, iteration: int) -> list[Request]:
        c = self.config
        lengths = draw_lengths(c.seed, iteration, c.requests, c.median_tokens, c.length_sigma, c.max_tokens)
        return [Request(i, [0], c.seed * 100_003 + i, n) for i, n in enumerate(lengths)]

    def chunk(self, iteration: int, requests: list[Request], node: int) -> list[Request]:
        """One chunk on this node's emulated engine, on the iteration's weights."""
        if self.version < iteration:
            raise StaleWeights(
                f"rollout of iteration {iteration} needs weights version {iteration}, has {self.version}"
            )
        _, _, max_tokens = chunk_prompts(requests, self.config.chunk_tokens)
        if not max_tokens:
            return list(requests)
        arriving = sum(1 for r in requests if not r.done and r.nodes and r.nodes[-1] != node)
        self.work(max(max_tokens) * self.config.step_s + arriving * self.config.prefill_s)
        completions = [Completion([0] * n, [0.0] * n, "length") for n in max_tokens]
        return advance(requests, completions, self.version, node)


class EmulatedTailTrainer(EmulatedRole):
    """The training role: a wait, then the next weights version."""

    def __init__(self, config: TailConfig):
        super().__init__(1.0)
        self.config = config

    def train(self, iteration: int) -> int:
        self.work(self.config.train_s)
        self.version = iteration + 1
        return self.version


@dataclass(frozen=True)
class EmulatedTailJob:
    """Entrypoint ``rollmux.jobs.emulated_tail:EmulatedTailJob.from_context``; its spec's
    ``tail`` turns the migration on. Progress is what the control plane counted, as for
    :class:`~rollmux.jobs.emulated.EmulatedJob`."""

    config: TailConfig
    iterations: int

    @classmethod
    def from_context(cls, context: JobContext) -> EmulatedTailJob:
        return cls(TailConfig(**context.args), context.iterations)

    def role_factory(self, phase_name: str) -> partial[EmulatedRole]:
        return partial(EmulatedTailRollout if phase_name == ROLLOUT else EmulatedTailTrainer, self.config)

    def run(self, session: Session) -> list[dict[str, float]]:
        history = []
        for iteration in range(session.iteration, self.iterations):
            with phase(ROLLOUT):
                rolled = self._rollout(session, iteration)
            with phase(TRAIN):
                session.fetch(session.call(TRAIN, "train", iteration))
                session.sync_weights(session.call(TRAIN, "weights"))
                history.append(session.report({"iteration": float(iteration), **rolled}, iteration))
        return history

    @staticmethod
    def _rollout(session: Session, iteration: int) -> dict[str, Any]:
        assert session.grant is not None
        requests = session.fetch(session.submit(ROLLOUT, session.grant.nodes[0], "requests", iteration))
        shares, moved_at = run_chunks(session, iteration, split(requests, session.grant.nodes))
        return rollout_metrics([r for share in shares.values() for r in share], iteration, moved_at)
