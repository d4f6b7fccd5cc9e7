"""Background work of the control plane that never fails unobserved.

A task whose exception nobody retrieves is reported by asyncio only when it is collected
(``Task exception was never retrieved``), without saying which job it was for or what it
was doing, and whatever it should have done next (lose the job, restart it) never happens.
Every task the control plane and its executor start goes through :func:`spawn`: an
exception that escapes it is logged with what the task was doing and handed to a handler;
a helper future given up on goes through :func:`abandon`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

log = logging.getLogger("rollmux.tasks")


def spawn(
    work: Coroutine[Any, Any, Any],
    what: str,
    on_error: Callable[[BaseException], Awaitable[None]] | None = None,
) -> asyncio.Task:
    """Run ``work`` in a task named ``what`` (e.g. "launching job a"); an exception it lets
    escape is logged with ``what`` and then handled by ``on_error``, in a task observed the
    same way. Cancellation is not a failure."""
    task = asyncio.create_task(work, name=what)
    task.add_done_callback(lambda done: _observe(done, what, on_error))
    return task


_handling: set[asyncio.Task] = set()
"""Handlers running (the event loop keeps only weak references to tasks)."""


def _observe(task: asyncio.Task, what: str, on_error: Callable[[BaseException], Awaitable[None]] | None) -> None:
    if task.cancelled() or task.exception() is None:
        return
    error = task.exception()
    log.error("%s failed: %s", what, describe(error), exc_info=error)
    if on_error is not None:
        handler = spawn(on_error(error), f"handling the failure of {what}")
        _handling.add(handler)
        handler.add_done_callback(_handling.discard)


def abandon(future: asyncio.Future) -> None:
    """Give up on a helper future: cancel it if it is still running, else take its exception
    (it was handled, or is moot, where it was awaited)."""
    if not future.done():
        future.cancel()
    elif not future.cancelled():
        future.exception()


def describe(error: BaseException) -> str:
    """'Type: first line of the message', for reasons and logs."""
    first = str(error).splitlines()[0] if str(error) else ""
    return f"{type(error).__name__}: {first}" if first else type(error).__name__
