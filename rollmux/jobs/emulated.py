"""An emulated RL job: phases that wait as a GPU phase waits (no CPU spin), on roles that
hold real tensors, so sleep/wake and moving a job between workers move real bytes.

It is a real job program on the phase API: the control plane places it, grants its
phases in its group's turns and restarts it from its checkpoint. A trace replay runs one
per trace job, with the trace's phase times divided by a time scale and each role's
resident memory scaled down (by default 1 MiB per GB).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import ray

from rollmux.runtime.program import JobContext
from rollmux.runtime.session import Session, phase

if TYPE_CHECKING:
    from rollmux.runtime.state import RoleState


@dataclass(frozen=True)
class EmulatedConfig:
    rollout_s: float
    train_s: float
    rollout_mib: float = 1.0
    train_mib: float = 1.0
    colo_rollout_s: float | None = None
    """Phase times when seated co-located (both phases on its training nodes), if known."""
    colo_train_s: float | None = None

    def phase_s(self, phase_name: str, colocated: bool) -> float:
        if colocated and self.colo_rollout_s is not None and self.colo_train_s is not None:
            return self.colo_rollout_s if phase_name == "rollout" else self.colo_train_s
        return self.rollout_s if phase_name == "rollout" else self.train_s


class EmulatedRole:
    """A role whose state is ``mib`` MiB of real tensors and whose work is a wait."""

    def __init__(self, mib: float):
        import torch

        from rollmux.runtime.state import RoleState

        self.version = 0
        module = torch.nn.Module()
        module.register_buffer("state", torch.zeros(max(1, int(mib * 2**20) // 4), dtype=torch.float32))
        self.state: RoleState = RoleState(module)

    def work(self, seconds: float) -> float:
        """The phase's work: a wait, as a GPU phase is for the host, using no core."""
        time.sleep(max(0.0, seconds))
        return seconds

    def load_weights(self, version: int, weights: dict) -> None:
        self.version = version


@dataclass(frozen=True)
class EmulatedJob:
    config: EmulatedConfig
    iterations: int
    checkpoint: str | None = None

    @classmethod
    def from_context(cls, context: JobContext) -> EmulatedJob:
        return cls(EmulatedConfig(**context.args), context.iterations, context.checkpoint)

    def role_factory(self, phase_name: str):
        return partial(EmulatedRole, self.config.rollout_mib if phase_name == "rollout" else self.config.train_mib)

    def resume_from(self) -> int:
        if not self.checkpoint or not Path(self.checkpoint).exists():
            return 0
        return int(json.loads(Path(self.checkpoint).read_text())["iterations"])

    def run(self, session: Session) -> list[dict[str, float]]:
        history = []
        for iteration in range(self.resume_from(), self.iterations):
            with phase("rollout"):
                seconds = self.config.phase_s("rollout", session.colocated)
                session.call_all("rollout", "work", self._left(session, seconds), collective=False)
            with phase("train"):
                history.append(session.report({"iteration": float(iteration)}, iteration))
                seconds = self.config.phase_s("train", session.colocated)
                ray.get(session.call_all("train", "work", self._left(session, seconds), collective=False))
            self._checkpoint(iteration + 1)  # once its release is recorded: a crash repeats a step, never skips it
        return history

    @staticmethod
    def _left(session: Session, seconds: float) -> float:
        """What remains of a phase of ``seconds`` from grant to release: its switching (the
        wake already done, the offload and hand-back to come) is part of it, as it is part
        of a profiled GPU phase."""
        return seconds - session.since_grant() - session.handback_s

    def _checkpoint(self, iterations: int) -> None:
        """The iterations done, written atomically (the emulated state needs no more)."""
        if not self.checkpoint:
            return
        path = Path(self.checkpoint)
        temporary = path.with_name(path.name + ".tmp")
        temporary.write_text(json.dumps({"iterations": iterations}))
        os.replace(temporary, path)
