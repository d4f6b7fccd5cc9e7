"""Failpoints: named places where a test can have the service killed, to prove a crash
there loses nothing.

``ROLLMUX_FAILPOINT=name`` makes the process SIGKILL itself the first time it reaches the
failpoint ``name`` (as an operator's ``kill -9`` would, with no cleanup); unset, a
failpoint is a dictionary lookup.
"""

from __future__ import annotations

import os
import signal

VARIABLE = "ROLLMUX_FAILPOINT"


def failpoint(name: str) -> None:
    if os.environ.get(VARIABLE) == name:
        os.kill(os.getpid(), signal.SIGKILL)
