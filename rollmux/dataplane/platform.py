"""Which failures are the platform's, not the job's.

Ray reports a lost process, node, object or reservation — and a worker its memory monitor
killed under memory pressure — as exceptions that reach whoever waited on the work: a job's
driver waiting on a worker, the control plane waiting on a driver. Those are not the job's
fault and restart it (counted against its ``max_restarts``); an exception raised by the
job's own code (which Ray wraps in a ``RayTaskError`` when it crossed a process) fails it.
"""

from __future__ import annotations

import ray.exceptions as rex

PLATFORM_ERRORS: tuple[type[BaseException], ...] = (
    rex.OutOfMemoryError,  # the memory monitor killed the process running it
    rex.RayActorError,  # the actor's process died (ActorDiedError) or is unreachable (ActorUnavailableError)
    rex.WorkerCrashedError,
    rex.NodeDiedError,
    rex.LocalRayletDiedError,
    rex.ObjectLostError,  # its owner or every copy died (OwnerDiedError, ObjectReconstructionFailedError, …)
    rex.RaySystemError,
    rex.GetTimeoutError,
    rex.TaskUnschedulableError,
    rex.ActorUnschedulableError,
    rex.TaskPlacementGroupRemoved,
    rex.ActorPlacementGroupRemoved,
    rex.OutOfDiskError,
)


def platform_failure(error: BaseException) -> BaseException | None:
    """The platform failure behind ``error`` — itself, or the cause a ``RayTaskError`` carries
    across processes — or None if the job's own code raised it."""
    cause: BaseException | None = error
    while cause is not None:
        if isinstance(cause, PLATFORM_ERRORS):
            return cause
        cause = cause.cause if isinstance(cause, rex.RayTaskError) else None
    return None
