"""The service's bearer token: created on first start, readable by its owner only."""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from rollmux.service.private import FILE_MODE, private_dir, private_file
from rollmux.wire.client import TOKEN_FILE, read_token


def ensure_token(state_dir: Path) -> str:
    """Read the token, or create it (0600, in a 0700 folder) if this is the first start."""
    path = private_dir(state_dir) / TOKEN_FILE
    try:
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
    except FileExistsError:
        private_file(path)
        return read_token(state_dir)
    token = secrets.token_urlsafe(32)
    with os.fdopen(descriptor, "w") as handle:
        handle.write(token + "\n")
    return token
