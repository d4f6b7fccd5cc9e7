"""Start (or join) Ray, start the control plane, run jobs, collect what happened."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import ray

from rollmux.core.spec import JobSpec
from rollmux.core.turns import PhaseRecord
from rollmux.runtime.control import NAMESPACE, RuntimeConfig, control_actor
from rollmux.runtime.driver import driver_actor
from rollmux.runtime.nodes import pool_resources
from rollmux.runtime.session import JobProgram


def start_ray(address: str | None = None, rollout_nodes: int = 1, train_nodes: int = 1) -> None:
    """Join the Ray cluster at ``address``, or start a local instance offering this many
    logical nodes of each pool. Does nothing if Ray is already up in this process."""
    if ray.is_initialized():
        return
    if address:
        ray.init(address=address, namespace=NAMESPACE, log_to_driver=False)
        return
    ray.init(
        num_cpus=max(4, os.cpu_count() or 1),
        resources=pool_resources(rollout_nodes, train_nodes),
        include_dashboard=False,
        namespace=NAMESPACE,
        log_to_driver=False,
    )


@dataclass
class RunResult:
    histories: dict[str, list[dict[str, float]]] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    records: list[PhaseRecord] = field(default_factory=list)
    snapshot: dict[str, Any] = field(default_factory=dict)


def run_jobs(
    jobs: Sequence[tuple[JobSpec, JobProgram]],
    config: RuntimeConfig | None = None,
    on_tick: Callable[[dict[str, Any]], None] | None = None,
    tick_s: float = 0.5,
) -> RunResult:
    """Run every job to the end on a fresh control plane; Ray must be started."""
    control = control_actor(config or RuntimeConfig())
    try:
        runs = {spec.name: driver_actor(control).run.remote(spec, program) for spec, program in jobs}
        pending = list(runs.values())
        while pending:
            _, pending = ray.wait(pending, num_returns=len(pending), timeout=tick_s)
            if on_tick:
                on_tick(ray.get(control.snapshot.remote()))
        result = RunResult()
        for name, ref in runs.items():
            try:
                result.histories[name] = ray.get(ref)
            except ray.exceptions.RayTaskError as failure:
                result.errors[name] = _describe(failure)
        result.records = ray.get(control.phase_records.remote())
        result.snapshot = ray.get(control.snapshot.remote())
        return result
    finally:
        ray.get(control.shutdown.remote())
        ray.kill(control)


def _describe(failure: ray.exceptions.RayTaskError) -> str:
    """The innermost cause of a failure that crossed actors, as 'Type: message'."""
    cause: BaseException = failure
    while isinstance(cause, ray.exceptions.RayTaskError) and cause.cause is not None:
        cause = cause.cause
    return f"{type(cause).__name__}: {cause}"
