"""Failpoints: named places where a test can have the service killed, to prove a crash
there loses nothing.

``ROLLMUX_FAILPOINT=name`` makes the process SIGKILL itself the first time it reaches the
failpoint ``name`` (as an operator's ``kill -9`` would, with no cleanup); unset, a
failpoint is a dictionary lookup. Every process started with the variable has it armed
(each worker, each restarted service); with ``ROLLMUX_FAILPOINT_ONCE=path`` it fires in
the first process that creates ``path`` only, so one crash is injected, not one per process
(a test re-arms it by removing ``path``). With ``ROLLMUX_FAILPOINT_RAISE=OutOfMemoryError``
(any class of ``ray.exceptions``) it raises that error instead, as Ray does to whoever
waited on a process its memory monitor killed.
"""

from __future__ import annotations

import os
import signal

VARIABLE = "ROLLMUX_FAILPOINT"
ONCE_VARIABLE = "ROLLMUX_FAILPOINT_ONCE"
SKIP_VARIABLE = "ROLLMUX_FAILPOINT_SKIP"
RAISE_VARIABLE = "ROLLMUX_FAILPOINT_RAISE"
_passed: dict[str, int] = {}


def failpoint(name: str) -> None:
    if os.environ.get(VARIABLE) != name:
        return
    _passed[name] = _passed.get(name, 0) + 1
    if _passed[name] > int(os.environ.get(SKIP_VARIABLE, "0")) and _first_anywhere():
        error = os.environ.get(RAISE_VARIABLE)
        if error:
            raise _ray_error(error, name)
        os.kill(os.getpid(), signal.SIGKILL)


def _ray_error(kind: str, name: str) -> Exception:
    """The Ray error ``kind``, as Ray raises it, saying which failpoint raised it."""
    import ray.exceptions  # only processes that run Ray raise its errors

    return getattr(ray.exceptions, kind)(f"simulated by failpoint {name}: the process was killed (e.g. out of memory)")


def _first_anywhere() -> bool:
    """Whether this is the crash to inject: always, unless a marker file says one was."""
    marker = os.environ.get(ONCE_VARIABLE)
    if not marker:
        return True
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True
