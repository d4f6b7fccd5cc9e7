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
import contextlib
import faulthandler
import logging
import signal
import threading
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


async def wait_event(event: asyncio.Event, timeout_s: float) -> bool:
    """Whether ``event`` was set within ``timeout_s``. Not ``asyncio.wait_for``: on Python
    3.11 it swallows a cancellation that lands as the event is set, and a loop built on it
    runs on after being cancelled (the control plane's stop waited for it for ever)."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(timeout_s):
            await event.wait()
            return True
    return False


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


def dump_tasks() -> str:
    """Every task of the running loop with the chain of awaits it is suspended in: what an
    operator asks for when the control plane seems stuck (``kill -USR2`` on ``rollmux serve``)."""
    lines = []
    for task in sorted(asyncio.all_tasks(), key=lambda t: t.get_name()):
        lines.append(f"{task.get_name()}: {' -> '.join(_awaits(task.get_coro())) or 'running'}")
    return "\n".join(lines)


def _awaits(coro: Any) -> list[str]:
    """Where a suspended coroutine waits, outermost first (``cr_await`` down to a future)."""
    where = []
    while coro is not None and getattr(coro, "cr_frame", None) is not None:
        frame = coro.cr_frame
        where.append(f"{frame.f_code.co_name} ({frame.f_code.co_filename.rsplit('/', 1)[-1]}:{frame.f_lineno})")
        coro = coro.cr_await
    if coro is not None:
        where.append(repr(coro)[:200])
    return where


def install_dumps(loop: asyncio.AbstractEventLoop) -> None:
    """On SIGUSR1, every thread's stack (faulthandler); on SIGUSR2, every task's (logged).
    Only where the loop runs in the main thread (``rollmux serve``): signals go there."""
    if threading.current_thread() is not threading.main_thread():
        return
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    loop.add_signal_handler(signal.SIGUSR2, lambda: log.warning("control plane tasks:\n%s", dump_tasks()))
