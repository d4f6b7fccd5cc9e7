"""The state directory is private: it holds the bearer token, every job's spec, metrics and
events, and the jobs' checkpoints. Folders RollMux keeps there are 0700 and files 0600,
whatever the process's umask, and ones an older version left looser are tightened.
"""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

log = logging.getLogger("rollmux.service")
DIR_MODE = 0o700
FILE_MODE = 0o600


def private_dir(path: Path) -> Path:
    """Create the folder 0700 (its missing parents as the umask says), or tighten it."""
    path = Path(path)
    path.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
    _tighten(path, DIR_MODE)
    return path


def private_file(path: Path) -> Path:
    """Create the file empty and 0600 if it is missing, or tighten it; its content is kept."""
    path = Path(path)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT, FILE_MODE)
    os.close(descriptor)
    _tighten(path, FILE_MODE)
    return path


def _tighten(path: Path, mode: int) -> None:
    """Drop the group's and others' bits, saying so: someone may have relied on them."""
    found = stat.S_IMODE(path.stat().st_mode)
    if found & 0o077:
        os.chmod(path, found & ~0o077 | mode)
        log.warning("%s was %03o: now %03o (it holds RollMux's private state)", path, found, mode)
