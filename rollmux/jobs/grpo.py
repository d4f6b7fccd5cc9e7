"""GRPO on a small transformer policy, on a verifiable task generated on the fly.

The task: a prompt of ``operands`` digits, ``BOS d1 + d2 + ... =``; the answer is the
last ``answer_digits`` digits of their sum, generated token by token; the reward is 1 for
an exact match of every digit, else 0. With the default single digit a random policy
scores about 0.08 and a trained one close to 1. (With two digits the policy collapses
onto a leading ``0`` — the more frequent tens digit — long before it learns the units.)

The job has two roles, each living on a RollMux worker with its tensors behind a
:class:`RoleState`, parked and woken through the role adapter
(:mod:`rollmux.sdk.adapter`): the rollout role samples ``group_size`` answers per
prompt and scores them; the trainer role takes a GRPO step (group-relative advantages,
clipped policy ratio) and publishes new weights with a version. A rollout refuses to
start on weights older than its iteration needs: that is the on-policy guarantee.

All randomness comes from generators seeded by (seed, iteration), never from global
state, so a job computes the same losses and rewards alone or multiplexed.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import ClassVar

import torch
from torch import nn

from rollmux.dataplane import ranks
from rollmux.sdk.adapter import OnPolicyLoop, ParkedRole, StaleWeights, Weights
from rollmux.sdk.program import JobContext
from rollmux.sdk.state import RoleState, read_checkpoint

PLUS, EQUALS, BOS = 10, 11, 12
VOCAB = 13


@dataclass(frozen=True)
class GRPOConfig:
    seed: int = 0
    operands: int = 2
    answer_digits: int = 1
    prompts_per_iteration: int = 64
    group_size: int = 8
    train_groups: int = 64
    d_model: int = 64
    layers: int = 2
    heads: int = 4
    lr: float = 3e-3
    clip: float = 0.2
    entropy_coef: float = 0.1
    epochs: int = 1
    threads: int = 1

    @staticmethod
    def benchmark(seed: int = 0) -> GRPOConfig:
        """The workload the benches measure: phases of about half a second on one core,
        rollout and training of similar length."""
        return GRPOConfig(seed=seed, prompts_per_iteration=2048, train_groups=800)

    @property
    def prompt_len(self) -> int:
        return 2 * self.operands + 1

    @property
    def answer_len(self) -> int:
        return self.answer_digits


class TinyTransformer(nn.Module):
    """A causal transformer language model over the task's 13 tokens."""

    def __init__(self, config: GRPOConfig):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, config.d_model)
        self.position = nn.Parameter(torch.zeros(config.prompt_len + config.answer_len, config.d_model))
        layer = nn.TransformerEncoderLayer(
            config.d_model, config.heads, 4 * config.d_model, dropout=0.0, batch_first=True, norm_first=True
        )
        self.body = nn.TransformerEncoder(layer, config.layers, enable_nested_tensor=False)
        self.head = nn.Linear(config.d_model, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Logits of the next token after each prefix: [batch, length, vocab]."""
        length = tokens.shape[1]
        mask = nn.Transformer.generate_square_subsequent_mask(length, device=tokens.device)
        hidden = self.body(self.embed(tokens) + self.position[:length], mask=mask, is_causal=True)
        return self.head(hidden)


_INIT_LOCK = threading.Lock()


def make_policy(config: GRPOConfig) -> TinyTransformer:
    """The initial policy, a pure function of the seed.

    Roles of several jobs are built concurrently in one worker process (its actor is
    threaded), and torch's initialisers draw from the global generator: without the lock
    one job's construction would change another's weights.
    """
    with _INIT_LOCK, torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        return TinyTransformer(config)


def task_batch(config: GRPOConfig, iteration: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Prompts and exact answer digits of one iteration, a pure function of (seed, iteration)."""
    n = config.prompts_per_iteration
    gen = torch.Generator().manual_seed(config.seed * 1_000_003 + iteration)
    digits = torch.randint(0, 10, (n, config.operands), generator=gen)
    tokens = [torch.full((n, 1), BOS)]
    for k in range(config.operands):
        tokens.append(digits[:, k : k + 1])
        tokens.append(torch.full((n, 1), PLUS if k < config.operands - 1 else EQUALS))
    total = digits.sum(dim=1, keepdim=True)
    places = 10 ** torch.arange(config.answer_len - 1, -1, -1)
    return torch.cat(tokens, dim=1), (total // places) % 10


def answer_logprobs(policy: nn.Module, sequences: torch.Tensor, answer_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probabilities of the answer tokens at the end of ``sequences`` and the entropy of
    each answer position, both [batch, answer_len]."""
    logits = policy(sequences[:, :-1])[:, -answer_len:, :]
    logp = torch.log_softmax(logits, dim=-1)
    entropy = -(logp.exp() * logp).sum(dim=-1)
    return logp.gather(2, sequences[:, -answer_len:].unsqueeze(2)).squeeze(2), entropy


class GRPORollout(ParkedRole):
    """Rollout role: samples answers with the latest synced weights and scores them."""

    def __init__(self, config: GRPOConfig, checkpoint: str | None = None):
        torch.set_num_threads(config.threads)
        self.config = config
        self.policy = make_policy(config)
        self.policy.eval()
        self.version = 0
        if checkpoint and Path(checkpoint).exists():
            saved = read_checkpoint(Path(checkpoint))
            self.policy.load_state_dict(saved["module"])
            self.version = saved["extra"]["version"]
        super().__init__(RoleState(self.policy))

    def load_weights(self, version: int, weights: Weights) -> None:
        """Take the trainer's weights of ``version`` into the policy's own tensors; the role
        must be awake. Older weights than it holds are refused."""
        self.version = self.receive_weights(weights, self.version)

    @torch.no_grad()
    def generate(self, iteration: int) -> dict:
        """Sample ``group_size`` answers per prompt; refuses weights older than ``iteration``."""
        if self.version < iteration:
            raise StaleWeights(
                f"rollout of iteration {iteration} needs weights version {iteration}, holds {self.version}"
            )
        self.require_weights()
        config = self.config
        device = self.state.device
        prompts, targets = task_batch(config, iteration)
        mine = ranks.current().shard(len(prompts))  # a wide rollout: each rank samples its prompts
        sequences = prompts[mine].repeat_interleave(config.group_size, dim=0).to(device)
        targets = targets[mine].repeat_interleave(config.group_size, dim=0).to(device)
        gen = torch.Generator(device=device).manual_seed(config.seed * 7_919 + iteration + 1_000_003 * mine.start)
        logprobs = []
        for _ in range(config.answer_len):
            step = torch.log_softmax(self.policy(sequences)[:, -1, :], dim=-1)
            token = torch.multinomial(step.exp(), 1, generator=gen)
            logprobs.append(step.gather(1, token))
            sequences = torch.cat([sequences, token], dim=1)
        rewards = (sequences[:, -config.answer_len :] == targets).all(dim=1).float()
        return {
            "iteration": iteration,
            "version": self.version,
            "sequences": sequences.cpu(),
            "old_logprobs": torch.cat(logprobs, dim=1).cpu(),
            "rewards": rewards.cpu(),
        }


def merge(parts: list[dict]) -> dict:
    """The batch of a wide rollout: its ranks' samples in rank order."""
    if len({(p["iteration"], p["version"]) for p in parts}) != 1:
        raise StaleWeights(f"the ranks of one rollout sampled different iterations or weights: {parts[0]['version']}")
    return {
        **parts[0],
        **{key: torch.cat([p[key] for p in parts]) for key in ("sequences", "old_logprobs", "rewards")},
    }


class GRPOTrainer(ParkedRole):
    """Trainer role: one GRPO update per iteration, then publishes versioned weights.

    Only groups whose rewards differ carry a policy gradient (the others' advantages are
    all zero), so the update takes those first, up to ``train_groups`` groups (dynamic
    sampling, as in DAPO), and fills the rest with other groups, which only feed the
    entropy bonus. The training cost per iteration is therefore fixed, whatever the
    reward, and the bonus keeps acting once most groups agree.
    """

    def __init__(self, config: GRPOConfig, checkpoint: str | None = None):
        torch.set_num_threads(config.threads)
        self.config = config
        self.policy = make_policy(config)
        self.optimizer = torch.optim.Adam(self.policy.parameters(), lr=config.lr)
        self.version = 0
        self.history: list[dict[str, float]] = []
        super().__init__(RoleState(self.policy, self.optimizer))
        if checkpoint and Path(checkpoint).exists():
            saved = self.load_checkpoint(checkpoint)
            self.version, self.history = saved["version"], list(saved["history"])

    def checkpoint(self, path: str) -> int:
        """Persist weights, optimizer state, version and every iteration's metrics."""
        self.save_checkpoint(path, {"version": self.version, "history": self.history})
        return self.version

    def train(self, batch: dict) -> dict:
        """GRPO step on one rollout batch; returns loss and reward of the batch."""
        if batch["version"] != self.version:
            raise StaleWeights(f"batch sampled with weights {batch['version']}, trainer is at {self.version}")
        device = self.state.device
        size = self.config.group_size
        groups = batch["rewards"].view(-1, size)
        spread = groups.std(dim=1)
        chosen = torch.argsort((spread > 0).float(), descending=True, stable=True)[: self.config.train_groups]
        informative = int((spread[chosen] > 0).sum())
        rows = (chosen.unsqueeze(1) * size + torch.arange(size)).view(-1)
        groups = groups[chosen].to(device)
        advantages = (groups - groups.mean(dim=1, keepdim=True)) / (groups.std(dim=1, keepdim=True) + 1e-4)
        place = ranks.current()  # a wide training phase: data parallel over the chosen groups
        mine = place.shard(len(chosen))
        rows = rows[mine.start * size : mine.stop * size]
        sequences, old = batch["sequences"][rows].to(device), batch["old_logprobs"][rows].to(device)
        gain = advantages[mine].reshape(-1, 1)
        self.policy.train()
        loss_value = 0.0
        for _ in range(self.config.epochs):
            logprobs, entropy = answer_logprobs(self.policy, sequences, self.config.answer_len)
            ratio = torch.exp(logprobs - old)
            clipped = torch.clamp(ratio, 1 - self.config.clip, 1 + self.config.clip)
            surrogate = torch.min(ratio * gain, clipped * gain).sum() / max(
                1, informative * size * self.config.answer_len
            )
            # The entropy bonus keeps the policy from collapsing onto one answer per prompt,
            # after which no group has differing rewards and learning stops. Over several
            # ranks each takes its share of the mean, so the ranks' losses sum to it.
            bonus = entropy.mean() if place.world == 1 else entropy.sum() / (len(chosen) * size * entropy.shape[1])
            loss = -surrogate - self.config.entropy_coef * bonus
            loss.backward()
            for parameter in self.policy.parameters():
                place.all_reduce(parameter.grad)
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
            loss_value = place.all_reduce(loss.detach().clone()).item()
        self.version += 1
        metrics = {
            "iteration": batch["iteration"],
            "loss": loss_value,
            "reward": batch["rewards"].mean().item(),
            "trained_groups": informative,
            "version": self.version,
        }
        self.history.append(metrics)
        return metrics

    def weights(self) -> tuple[int, Weights]:
        """The current weights and their version, packed for a sync without pickling."""
        return self.version, self.publish(self.version)


@dataclass(frozen=True)
class GRPOJob(OnPolicyLoop):
    """The shipped RL job: its roles for the workers and its driver loop.

    It uses only the phase API (``phase``, ``Session.call``/``sync_weights``/``report``)
    and the roles' sleep/wake state, the shape a veRL or ROLL job would adopt.
    """

    config: GRPOConfig
    iterations: int
    checkpoint: str | None = None
    """Trainer checkpoint file, rewritten every ``checkpoint_every`` iterations; a job that
    finds one resumes."""
    checkpoint_every: int = 1
    wide: ClassVar[bool] = True

    @classmethod
    def from_context(cls, context: JobContext) -> GRPOJob:
        """The job as the control plane starts it (``kind: grpo``, or an entrypoint naming
        ``<module>:<GRPOJob subclass>.from_context``)."""
        return cls(GRPOConfig(**context.args), context.iterations, context.checkpoint, context.checkpoint_every)

    def role_factory(self, phase_name: str):
        return partial(GRPORollout if phase_name == "rollout" else GRPOTrainer, self.config, self.checkpoint)

    def merge(self, parts: list[dict]) -> dict:
        return merge(parts)


def run_alone(config: GRPOConfig, iterations: int) -> list[dict[str, float]]:
    """The job trained in this process without RollMux: what every run under RollMux —
    multiplexed, moved, restarted, failed over — must reproduce metric for metric."""
    rollout, trainer = GRPORollout(config), GRPOTrainer(config)
    for iteration in range(iterations):
        trainer.train(rollout.generate(iteration))
        rollout.load_weights(*trainer.weights())
    return trainer.history
