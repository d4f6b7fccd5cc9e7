"""Pool workers: one Ray actor per RollMux node, hosting the roles of every job on it.

A worker never tears a role down between phases: roles sleep in host memory and wake
when their job is granted the node. Host memory used by sleeping roles is accounted per
node and the residency limit is enforced when a role is loaded.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Protocol

import ray

from rollmux.core.errors import ResidencyExceeded, RollMuxError
from rollmux.runtime.state import RoleState


class PhaseNotGranted(RollMuxError):
    """A role was called while asleep: its job does not hold this node now."""


class Role(Protocol):
    """What job code puts on a worker: an object whose tensors sit behind a RoleState."""

    state: RoleState


class PoolWorker:
    """Hosts job roles on one logical node; wrapped by ``ray.remote`` in :mod:`nodes`."""

    def __init__(self, node_id: int, pool: str, host_limit_bytes: int):
        self.node_id = node_id
        self.pool = pool
        self.host_limit_bytes = host_limit_bytes
        self.roles: dict[str, Role] = {}
        self.pending_weights: dict[str, tuple[int, dict]] = {}

    def where(self) -> dict[str, Any]:
        """The logical node and the Ray node this worker runs on."""
        return {"node_id": self.node_id, "pool": self.pool, "ray_node_id": ray.get_runtime_context().get_node_id()}

    def load(self, job: str, factory: Callable[[], Role]) -> dict[str, float]:
        """Cold start of a job's role: build it, then put it to sleep in host memory."""
        start = time.perf_counter()
        role = factory()
        role.state.sleep()
        needed = role.state.host_bytes()
        used = self.host_bytes()
        if used + needed > self.host_limit_bytes:
            raise ResidencyExceeded(
                f"node {self.node_id} ({self.pool}): {job} needs {needed / 2**20:.1f} MiB of host memory, "
                f"{(self.host_limit_bytes - used) / 2**20:.1f} MiB of {self.host_limit_bytes / 2**20:.1f} MiB left"
            )
        self.roles[job] = role
        return {"cold_s": time.perf_counter() - start, "host_bytes": float(needed)}

    def unload(self, job: str) -> None:
        self.roles.pop(job, None)
        self.pending_weights.pop(job, None)

    def wake(self, job: str) -> float:
        """Bring the job's role onto the device; apply weights delivered while it slept."""
        role = self._role(job)
        seconds = role.state.wake()
        if job in self.pending_weights:
            version, weights = self.pending_weights.pop(job)
            start = time.perf_counter()
            role.load_weights(version, weights)  # type: ignore[attr-defined]
            seconds += time.perf_counter() - start
        return seconds

    def sleep(self, job: str) -> float:
        return self._role(job).state.sleep()

    def deliver(self, job: str, published: tuple[int, dict]) -> int:
        """Receive a job's new weights (version, tensors); they are applied at its next wake.

        Runs beside another job's phase (the actor is threaded) and only stores a reference.
        """
        self._role(job)
        version, weights = published
        self.pending_weights[job] = (version, weights)
        return version

    def call(self, job: str, method: str, *args: Any) -> Any:
        """Run one method of the job's role; only while the job holds this node."""
        role = self._role(job)
        if not role.state.awake:
            raise PhaseNotGranted(f"{job} called {method} on node {self.node_id} outside its phase")
        return getattr(role, method)(*args)

    def host_bytes(self) -> int:
        return sum(role.state.host_bytes() for role in self.roles.values())

    def _role(self, job: str) -> Role:
        if job not in self.roles:
            raise KeyError(f"job {job} has no role on node {self.node_id}")
        return self.roles[job]
