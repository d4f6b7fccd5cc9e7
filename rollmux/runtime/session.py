"""The phase API that job code uses: ``with rollmux.phase("rollout"):`` and friends.

A job's driver process holds one :class:`Session`. Entering a phase asks the control
plane for the grant (blocking until the group's round-robin gives this job its turn) and
wakes the job's roles on the phase's nodes; leaving puts them back to sleep in host memory
and reports the measured phase to the control plane. Processes stay alive throughout.
"""

from __future__ import annotations

import time
from contextlib import ContextDecorator
from typing import Any, Protocol

import ray

from rollmux.core.roundrobin import ROLLOUT, TRAIN
from rollmux.core.turns import PhaseRecord
from rollmux.runtime.control import JobPlacement

PHASES = (ROLLOUT, TRAIN)
_current: Session | None = None


class JobProgram(Protocol):
    """The shape of a RollMux job: role factories for the workers and a driver loop."""

    def role_factory(self, phase: str) -> Any: ...

    def run(self, session: Session) -> list[dict[str, float]]: ...


class Session:
    """A job's connection to the control plane and to the workers of its placement."""

    def __init__(self, control: Any, placement: JobPlacement):
        self.control = control
        self.placement = placement
        self.job = placement.job
        self.iteration = 0
        self.began = time.time()
        self.holding: str | None = None
        self._requested = self._granted = self._started = 0.0
        self._wake_s = 0.0

    def resume(self, iteration: int) -> None:
        """Continue counting from ``iteration`` (a job restored from a checkpoint)."""
        self.iteration = iteration

    def enter(self, phase: str) -> None:
        if phase not in PHASES:
            raise ValueError(f"unknown phase {phase!r}; phases are {', '.join(PHASES)}")
        if self.holding is not None:
            raise RuntimeError(f"{self.job}: phase {phase} entered inside phase {self.holding}")
        self._requested = time.time()
        ray.get(self.control.acquire.remote(self.job, phase))
        self._granted = time.time()
        self.holding = phase
        self._wake_s = max(ray.get([w.wake.remote(self.job) for w in self.placement.workers_of(phase)]))
        self._started = time.time()

    def leave(self, phase: str) -> None:
        ended = time.time()
        sleep_s = max(ray.get([w.sleep.remote(self.job) for w in self.placement.workers_of(phase)]))
        record = PhaseRecord(
            job=self.job,
            phase=phase,
            iteration=self.iteration,
            nodes=self.placement.rollout_nodes if phase == ROLLOUT else self.placement.train_nodes,
            requested=self._requested,
            granted=self._granted,
            started=self._started,
            ended=ended,
            released=time.time(),
            wake_s=self._wake_s,
            sleep_s=sleep_s,
        )
        self.holding = None
        ray.get(self.control.release.remote(record))
        if phase == TRAIN:
            self.iteration += 1

    def call(self, phase: str, method: str, *args: Any) -> ray.ObjectRef:
        """Run ``method`` of the job's role on the phase's first node and wait for it.

        Returns the result's reference, so large results (a rollout batch) can be passed
        to the other role without a copy through the driver.
        """
        if self.holding != phase:
            raise RuntimeError(f"{self.job}: {phase} role called outside its phase")
        ref = self.placement.workers_of(phase)[0].call.remote(self.job, method, *args)
        ray.wait([ref], fetch_local=False)
        return ref

    def fetch(self, ref: ray.ObjectRef) -> Any:
        """The value behind a reference returned by :meth:`call`."""
        return ray.get(ref)

    def sync_weights(self, published: ray.ObjectRef) -> None:
        """Weight sync: deliver (version, weights) to every rollout node of the job."""
        ray.get([w.deliver.remote(self.job, published) for w in self.placement.workers_of(ROLLOUT)])

    def report(self, metrics: dict[str, float]) -> dict[str, float]:
        """Tell the control plane how the job is doing; returns the metrics stamped with the
        seconds since the job's session began."""
        stamped = {**metrics, "elapsed_s": time.time() - self.began}
        ray.get(self.control.progress.remote(self.job, self.iteration, stamped))
        return stamped


def attach(session: Session | None) -> None:
    """Make ``session`` the one ``rollmux.phase`` uses in this process."""
    global _current
    _current = session


def current_session() -> Session:
    if _current is None:
        raise RuntimeError("rollmux.phase used outside a RollMux job: no session is attached")
    return _current


class phase(ContextDecorator):  # noqa: N801 - reads as a keyword: `with rollmux.phase("rollout"):`
    """Context manager and decorator marking one phase of the job's iteration."""

    def __init__(self, name: str):
        if name not in PHASES:
            raise ValueError(f"unknown phase {name!r}; phases are {', '.join(PHASES)}")
        self.name = name

    def __enter__(self) -> phase:
        current_session().enter(self.name)
        return self

    def __exit__(self, *exc: object) -> bool:
        current_session().leave(self.name)
        return False
