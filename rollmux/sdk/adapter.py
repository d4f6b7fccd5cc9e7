"""What an RL framework provides for RollMux to multiplex it: the role adapter.

RollMux runs a job's rollout role on a rollout worker and its training role on a training
worker, and switches between jobs at phase boundaries. For that, each role of a framework
(TRL, veRL, OpenRLHF, the shipped GRPO job) must let RollMux:

- **set it up parked**: the role factory builds the role (restoring its checkpoint if
  there is one) and the worker parks it with ``sleep("offload")`` before any phase, so a
  cold start happens once, never at a switch;
- **sleep** it between its phases, either ``offload`` (every tensor copied to host memory,
  the warm path) or ``discard`` (a rollout engine's weights dropped: no host copy, the
  trainer re-sends them at the next wake, as vLLM's sleep level 2 does);
- **wake** it for its phase by tags, ``weights`` and ``kv_cache``, so an engine can take
  new weights before it allocates its cache (vLLM's ``wake_up(tags)``);
- **run one phase**: a rollout for an iteration, or a training step on its batch;
- **sync weights**: the trainer publishes ``(version, packed weights)`` — one flat buffer
  Ray ships without pickling (:mod:`rollmux.sdk.weights`) — the rollout role copies
  them into its own tensors and refuses to generate on weights older than its iteration
  (on-policy);
- **save and load a checkpoint**, so a restarted job loses no completed step;
- report its **footprint**, host and device bytes, which the residency check counts.

The worker moves a role through its :class:`~rollmux.sdk.state.RoleState`
(``role.state.sleep()``/``wake()``/``host_bytes()``), which is what ``sleep("offload")``,
``wake(WAKE_ALL)`` and ``footprint().host_bytes`` of :class:`ParkedRole` do.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Protocol, runtime_checkable

import ray

from rollmux.core.errors import StaleWeights, WeightsDiscarded
from rollmux.sdk.session import phase
from rollmux.sdk.state import RoleState, SleepMode, read_checkpoint
from rollmux.sdk.weights import PackedWeights, Publisher, load_packed
from rollmux.wire.failpoints import failpoint

if TYPE_CHECKING:
    from rollmux.sdk.session import Session

__all__ = ["StaleWeights", "WeightsDiscarded"]

SleepModeName = Literal["offload", "discard"]
WakeTag = Literal["weights", "kv_cache"]
WAKE_ALL: frozenset[WakeTag] = frozenset({"weights", "kv_cache"})
Weights = PackedWeights


@dataclass(frozen=True)
class Footprint:
    """Bytes one role occupies: in host memory while it sleeps (what the node's residency
    limit counts) and on the device while it is awake (what its phase needs free)."""

    host_bytes: int
    device_bytes: int


@runtime_checkable
class RoleAdapter(Protocol):
    """One role of a framework's job as it lives on a RollMux worker."""

    state: RoleState
    """The role's tensors as the worker moves them today."""

    def sleep(self, mode: SleepModeName = "offload") -> float:
        """Free the device; returns the seconds it took."""
        ...

    def wake(self, tags: Collection[WakeTag] = WAKE_ALL) -> float:
        """Bring back what ``tags`` name; returns the seconds it took."""
        ...

    def footprint(self) -> Footprint: ...


@runtime_checkable
class RolloutAdapter(RoleAdapter, Protocol):
    """A rollout role: generates on the latest weights it was sent."""

    version: int

    def load_weights(self, version: int, weights: Weights) -> None:
        """The receiving end of weight sync; the worker applies it at the role's wake."""
        ...

    def generate(self, iteration: int) -> dict[str, Any]:
        """One rollout phase; raises :class:`StaleWeights` on weights older than ``iteration``."""
        ...


@runtime_checkable
class TrainerAdapter(RoleAdapter, Protocol):
    """A training role: updates on a rollout's batch and publishes versioned weights."""

    version: int

    def train(self, batch: dict[str, Any]) -> dict[str, float]:
        """One training phase; returns the metrics the job reports for the iteration."""
        ...

    def weights(self) -> tuple[int, Weights]:
        """The sending end of weight sync: the version and the tensors, on the host."""
        ...

    def checkpoint(self, path: str) -> int:
        """Save weights, optimizer state and history atomically; returns the version saved."""
        ...


class ParkedRole:
    """The sleep/wake/footprint/weight sync of the adapter for a role whose tensors sit
    behind a :class:`RoleState`; a framework's role subclasses it and passes its state up.

    Discarding drops every device tensor without a host copy (the state keeps their
    shapes), so re-sent weights land in fresh buffers. Only a role without an optimizer
    may discard: a trainer's weights are the only copy.
    """

    park_mode: SleepModeName = "offload"
    """How the worker parks the role between its phases; a rollout role whose weights the
    trainer re-sends after every update may say ``discard`` and keep no host copy."""

    def __init__(self, state: RoleState):
        self.state = state
        self._device_bytes = state.host_bytes()
        self._publisher: Publisher | None = None

    def sleep(self, mode: SleepModeName = "offload") -> float:
        if mode not in ("offload", "discard"):
            raise ValueError(f"unknown sleep mode {mode!r}; modes are 'offload' and 'discard'")
        if mode == "discard" and self.state.optimizer is not None:
            raise ValueError("a trainer's weights are the only copy: it sleeps with mode 'offload'")
        if self.state.awake:
            self._device_bytes = self.state.host_bytes()
        return self.state.sleep(SleepMode(mode))

    def wake(self, tags: Collection[WakeTag] = WAKE_ALL) -> float:
        """``weights`` puts the tensors back on the device (discarded ones uninitialised until
        :meth:`receive_weights`); ``kv_cache`` is a no-op for torch roles, whose generation
        allocates its cache per call."""
        unknown = set(tags) - WAKE_ALL
        if unknown:
            raise ValueError(f"unknown wake tags {sorted(unknown)}; tags are {sorted(WAKE_ALL)}")
        return self.state.wake() if "weights" in tags else 0.0

    def footprint(self) -> Footprint:
        """Host bytes as the residency check counts them (0 for discarded weights); device
        bytes as of the role's last time awake."""
        awake_bytes = self.state.host_bytes() if self.state.awake else self._device_bytes
        return Footprint(host_bytes=self.state.host_bytes(), device_bytes=awake_bytes)

    def publish(self, version: int) -> PackedWeights:
        """The sending end of weight sync: the module's weights packed into a buffer made at
        the first publication, reused after, and counted in the role's host memory."""
        if self._publisher is None:
            self._publisher = Publisher(self.state.module)
            self.state.also_holds(self._publisher.buffer)
        return self._publisher.publish(version)

    def receive_weights(self, weights: PackedWeights, holds: int) -> int:
        """The receiving end: copy synced weights into the (awake) role's own tensors,
        refilling discarded ones; refuses weights older than ``holds``. Returns their version."""
        version = load_packed(self.state.module, weights, holds)
        self.state.weights_loaded()
        return version

    def require_weights(self) -> None:
        """Refuse to work on discarded weights that were never re-sent."""
        if self.state.needs_weights:
            raise WeightsDiscarded("the role's weights were discarded at sleep and not re-sent since")

    def save_checkpoint(self, path: str | Path, extra: dict[str, Any]) -> None:
        self.state.save(Path(path), extra)

    def load_checkpoint(self, path: str | Path) -> dict[str, Any]:
        return self.state.restore(Path(path))


class OnPolicyLoop:
    """The driver loop of an on-policy job whose roles implement the adapter: rollout,
    training, weight sync, metrics, checkpoint — every iteration, resuming from the
    checkpoint. A job class (a dataclass with ``iterations`` and ``checkpoint``) inherits
    it and gives its role factories.

    Every node of a wide phase works (one rank each); a job whose rollout ranks each
    sample a share overrides :meth:`merge` to put their batches together, and a job that
    cannot split its work says ``wide = False`` and is refused a wide placement by name.
    """

    iterations: int
    checkpoint: str | None
    checkpoint_every: int = 1
    wide: ClassVar[bool] = False

    def resume_from(self) -> int:
        return len(self.completed())

    def merge(self, parts: list[dict[str, Any]]) -> dict[str, Any]:
        """The batch of a rollout over several ranks, in rank order."""
        raise NotImplementedError(f"{type(self).__name__} cannot merge a rollout over {len(parts)} nodes")

    def rollout(self, session: Session, iteration: int) -> tuple[Any, dict[str, float]]:
        """One iteration's rollout, inside its phase: the batch to train on (or its
        reference) and metrics of the rollout itself, reported with the iteration's."""
        parts = session.call_all("rollout", "generate", iteration)
        return (parts[0] if len(parts) == 1 else self.merge(ray.get(parts))), {}

    def run(self, session: Session) -> list[dict[str, float]]:
        widest = max(len(session.rollout_nodes), len(session.train_nodes))
        if widest > 1 and not self.wide:
            raise ValueError(f"{type(self).__name__} runs on one node per phase; the job asks for {widest}")
        history = self.completed() if session.restored is None else self._restored(session)
        session.report_missing(history)
        for iteration in range(len(history), self.iterations):
            with phase("rollout"):
                batch, rolled = self.rollout(session, iteration)
            with phase("train"):
                result = session.call_all("train", "train", batch)[0]  # every rank returns the same
                session.sync_weights(session.call("train", "weights"))
                # The report goes with the phase's release, after the checkpoint: a crash in
                # between leaves the iteration checkpointed but unreported, and the next
                # session reports it from the checkpoint's history.
                history.append(session.report({**session.fetch(result), **rolled}, iteration))
                due = (iteration + 1) % self.checkpoint_every == 0 or iteration + 1 == self.iterations
                if self.checkpoint and due:
                    session.call("train", "checkpoint", self.checkpoint)
                    failpoint("checkpoint:written")
        return history

    @staticmethod
    def _restored(session: Session) -> list[dict[str, float]]:
        """Resume from a trainer that survived or came from its replica: the rollouts get
        its weights first."""
        history = list(session.restored or [])
        session.level_rollouts()
        return history

    def completed(self) -> list[dict[str, float]]:
        """Metrics of the iterations a previous run of this job checkpointed."""
        if not self.checkpoint or not Path(self.checkpoint).exists():
            return []
        return list(read_checkpoint(Path(self.checkpoint))["extra"]["history"])
