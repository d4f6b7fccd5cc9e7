"""An emulated RL job: phases that wait as a GPU phase waits (no CPU spin), on roles that
hold real tensors, so sleep/wake and moving a job between workers move real bytes.

It is a real job program on the phase API: the control plane places it, grants its
phases in its group's turns and restarts it from its checkpoint. A trace replay runs one
per trace job, with the trace's phase times divided by a time scale and each role's
resident memory scaled down (by default 1 MiB per GB).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING

import ray

from rollmux.sdk.program import JobContext
from rollmux.sdk.session import Session, phase

if TYPE_CHECKING:
    from rollmux.sdk.state import RoleState


@dataclass(frozen=True)
class EmulatedConfig:
    rollout_s: float
    train_s: float
    rollout_mib: float = 1.0
    train_mib: float = 1.0
    colo_rollout_s: float | None = None
    """Phase times when seated co-located (both phases on its training nodes), if known."""
    colo_train_s: float | None = None
    one_call_phases: bool = True
    """Each phase one call per node (wake, wait, sleep in one round trip); False: three,
    as a job written with plain ``phase`` blocks makes (for bench/phase_switch.py)."""

    def phase_s(self, phase_name: str, colocated: bool) -> float:
        if colocated and self.colo_rollout_s is not None and self.colo_train_s is not None:
            return self.colo_rollout_s if phase_name == "rollout" else self.colo_train_s
        return self.rollout_s if phase_name == "rollout" else self.train_s


class EmulatedRole:
    """A role whose state is ``mib`` MiB of real tensors and whose work is a wait."""

    def __init__(self, mib: float):
        import torch

        from rollmux.sdk.state import RoleState

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

    def weights(self) -> tuple[int, dict]:
        """A trainer's weights for its co-located rollout: an emulated job's tensors carry
        no values, so its version only."""
        return self.version, {}


@dataclass(frozen=True)
class EmulatedJob:
    """Its progress is the iterations the control plane counted (a training phase counts
    once its release is recorded), so it keeps no checkpoint of its own: a restart
    resumes there, repeating a step at most, never skipping one."""

    config: EmulatedConfig
    iterations: int

    @classmethod
    def from_context(cls, context: JobContext) -> EmulatedJob:
        return cls(EmulatedConfig(**context.args), context.iterations)

    def role_factory(self, phase_name: str):
        return partial(EmulatedRole, self.config.rollout_mib if phase_name == "rollout" else self.config.train_mib)

    def run(self, session: Session) -> list[dict[str, float]]:
        """Each phase is one call per node (wake, wait, sleep in one round trip, unless told
        otherwise), and the iteration's report goes with the training phase's release: a
        phase switch costs one Ray call per node and one or two requests to the control plane."""
        history = []
        one_call = self.config.one_call_phases
        for iteration in range(session.iteration, self.iterations):
            with phase("rollout", one_call=one_call):
                seconds = self.config.phase_s("rollout", session.colocated)
                session.call_all("rollout", "work", self._left(session, seconds), collective=False)
            with phase("train", one_call=one_call):
                history.append(session.report({"iteration": float(iteration)}, iteration))
                seconds = self.config.phase_s("train", session.colocated)
                ray.get(session.call_all("train", "work", self._left(session, seconds), collective=False))
        return history

    @staticmethod
    def _left(session: Session, seconds: float) -> float:
        """What remains of a phase of ``seconds`` from grant to release: its switching (the
        wake and offload to come, the hand-back) is part of it, as it is part of a
        profiled GPU phase."""
        return seconds - session.since_grant() - session.handback_s
