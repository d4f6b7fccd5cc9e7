"""Job drivers, started (and restarted) by the control plane in the data plane's warm
driver processes (:mod:`rollmux.dataplane.hosts`).

A driver begins a session (the next epoch, a lease kept alive by heartbeats), loads the
job's roles on its nodes' workers, joins its group's turns from the iteration its
checkpoint reached, and runs the job program. It ends the job when the program returns
(done) or raises (failed, with the cause), unless what it raised is the platform's (a
worker or object lost, a process killed by Ray's memory monitor: see
:mod:`rollmux.dataplane.platform`): then it stops without ending the job, which the control
plane restarts. A driver whose session was fenced out (a newer incarnation exists) stops
without touching the job.
"""

from __future__ import annotations

import traceback
from typing import Any

import ray

from rollmux.core.errors import StaleEpoch
from rollmux.core.roundrobin import ROLLOUT, TRAIN
from rollmux.dataplane.nodes import buddy_of, worker_of
from rollmux.dataplane.platform import platform_failure
from rollmux.inputs.runfile import JobSubmission
from rollmux.sdk.program import JobContext, load_program
from rollmux.sdk.session import Session, attach
from rollmux.wire.client import Client, ServiceError, TurnSession


def drive(url: str, token: str, job: str) -> str:
    """Run the job to its end; returns how it ended (for logs: the control plane knows)."""
    client = Client(url, token)
    turns = client.session(job)
    try:
        spec = JobSubmission.model_validate(turns.info["program"])
        assert spec.callable_path is not None and spec.iterations is not None, f"{job} is not run by RollMux"
        context = JobContext(job, spec.iterations, spec.program_args, turns.info["checkpoint"], spec.checkpoint_every)
        program = load_program(spec.callable_path, context)
        nodes = {ROLLOUT: turns.info["rollout_nodes"], TRAIN: turns.info["train_nodes"]}
        workers = {node: worker_of(node) for phase_nodes in nodes.values() for node in phase_nodes}
        restored, source = _load_roles(turns, program, nodes, workers, spec.replicas > 0)
        resume = getattr(program, "resume_from", None)
        iteration = len(restored) if restored is not None else resume() if resume else None
        turns.activate(iteration, source if iteration else None)
        tail = spec.tail.to_tail() if spec.tail is not None else None
        session = Session(turns, workers, spec.replicas > 0, restored, tail)
        attach(session)
        program.run(session)
    except StaleEpoch as fenced:
        return f"fenced: {fenced}"
    except BaseException as failure:
        gone = platform_failure(failure)
        if gone is not None:
            # A worker, node or object was lost, or the memory monitor killed a process: not
            # the job's fault. The control plane sees this driver end (at the latest, its
            # lease expire) and restarts the job from its checkpoint on a fresh worker.
            return f"lost: {type(gone).__name__}: {str(gone).splitlines()[0] if str(gone) else ''}"
        return _end(turns, _describe(failure))
    else:
        return _end(turns, "")
    finally:
        attach(None)
        turns.close()


def _load_roles(
    turns: TurnSession, program: Any, nodes: dict[str, list[int]], workers: dict[int, Any], replicas: bool
) -> tuple[list[dict[str, float]] | None, str]:
    """Put the job's roles on its nodes' workers for this session. A job with replicas
    keeps its trainer where it survived, or takes it from its replica: on the worker that
    now serves the node if it was the buddy, else pulled from the buddy; its rollouts are
    kept too, as they cannot be ahead of that trainer.
    Returns the restored trainer's metrics of every iteration (where the job resumes) and
    where it came from, or None and "checkpoint" when it was built: then every role is."""

    def load(phases: tuple[str, ...], keep: int | None) -> list[dict[str, Any]]:
        buddy = buddy_of(turns.job) if keep is not None else None
        loads = [
            workers[node].load.remote(
                turns.job, phase, turns.epoch, program.role_factory(phase), keep, buddy if phase == TRAIN else None
            )
            for phase in phases
            for node in nodes[phase]
        ]
        return ray.get(loads)

    keep = turns.iteration if replicas and len(nodes[TRAIN]) == 1 else None
    source = load((TRAIN,), keep)[0]["source"] if keep is not None else "built"
    if source != "built":
        history = ray.get(workers[nodes[TRAIN][0]].progress.remote(turns.job, TRAIN, turns.epoch))
        if history is not None:
            load((ROLLOUT,), keep)
            return history, source
    load((TRAIN, ROLLOUT), None)
    return None, "checkpoint"


def _end(turns: TurnSession, error: str) -> str:
    """Tell the control plane the job ended, unless it already knows (cancelled, fenced)."""
    try:
        turns.complete(error)
    except (ServiceError, StaleEpoch) as refused:
        return f"not ended by this driver: {refused}"
    return f"failed: {error}" if error else "done"


def _describe(failure: BaseException) -> str:
    """The innermost cause of a failure that crossed actors, as 'Type: message'."""
    cause: BaseException = failure
    while isinstance(cause, ray.exceptions.RayTaskError) and cause.cause is not None:
        cause = cause.cause
    return "".join(traceback.format_exception_only(type(cause), cause)).strip()
