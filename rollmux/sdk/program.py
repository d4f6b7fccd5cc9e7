"""Job programs: what a RollMux job is, and how the control plane finds one from its spec.

A job program has role factories for the workers and a driver loop written against the
phase API. The control plane names it by ``entrypoint: package.module:callable`` (the
callable may be ``Class.method``, as in Python entry points); the callable receives a
:class:`JobContext` and returns the program. ``kind: grpo`` is the shipped GRPO job.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from rollmux.core.errors import RollMuxError

if TYPE_CHECKING:
    from rollmux.sdk.session import Session


class BadEntrypoint(RollMuxError):
    """The entrypoint does not name an importable callable that returns a job program."""


@dataclass(frozen=True)
class JobContext:
    """What the control plane tells a job program about its job."""

    name: str
    iterations: int
    args: dict[str, Any] = field(default_factory=dict)
    checkpoint: str | None = None
    """A file the job may write its checkpoint to."""
    checkpoint_every: int = 1
    """Iterations between two checkpoints (and after the last)."""


class JobProgram(Protocol):
    """The shape of a RollMux job: role factories for the workers and a driver loop."""

    def role_factory(self, phase: str) -> Any: ...

    def resume_from(self) -> int:
        """Iterations already completed (by its checkpoint); the job continues from there."""
        ...

    def run(self, session: Session) -> list[dict[str, float]]: ...


def load_program(entrypoint: str, context: JobContext) -> JobProgram:
    """Import ``package.module:callable`` and call it with the job's context."""
    module_name, _, attribute = entrypoint.partition(":")
    try:
        target: Any = importlib.import_module(module_name)
    except ImportError as error:
        raise BadEntrypoint(f"entrypoint {entrypoint}: cannot import {module_name}: {error}") from None
    for part in attribute.split("."):
        if not hasattr(target, part):
            raise BadEntrypoint(f"entrypoint {entrypoint}: {module_name} has no {attribute}")
        target = getattr(target, part)
    if not callable(target):
        raise BadEntrypoint(f"entrypoint {entrypoint}: {attribute} is not callable")
    program = target(context)
    missing = [m for m in ("role_factory", "run") if not callable(getattr(program, m, None))]
    if missing:
        raise BadEntrypoint(f"entrypoint {entrypoint} returned {type(program).__name__}, which has no {missing[0]}()")
    return program
