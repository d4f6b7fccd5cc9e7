"""Ray's token authentication, settled before joining a cluster by its address.

Ray 2.60 turns token authentication on for a cluster that ``ray start --head`` starts
where a token is at hand (``~/.ray/auth_token``, which any local ``ray.init()`` writes,
``$RAY_AUTH_TOKEN_PATH`` or ``$RAY_AUTH_TOKEN``), unless ``RAY_AUTH_MODE`` says otherwise.
``ray.init(address=HOST:PORT)``, though, never turns it on by itself: without
``RAY_AUTH_MODE=token`` it connects without the token, and the cluster answers
``InvalidAuthToken`` for as long as ``ray.init`` retries. Turning token mode on blindly
is no cure: a client in token mode on a cluster without authentication connects, but its
actors die before they run.

So RollMux asks the cluster first, with one request to its GCS: when it refuses a request
without a token, token mode is turned on for this process (and the processes it starts)
if a token is at hand, and a missing or wrong token is named with what to set. Ray has no
public API for any of this, hence the few names from ``ray._raylet`` kept in this module.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from ray._raylet import AuthenticationTokenLoader, Config, GcsClient
from ray.exceptions import AuthenticationError, RayError

from rollmux.core.errors import RollMuxError

MODE = "RAY_AUTH_MODE"
WHAT_TO_SET = (
    "give this process the cluster's token: set RAY_AUTH_TOKEN to it, or RAY_AUTH_TOKEN_PATH to a file "
    "holding it (`ray get-auth-token` prints it on the head node, from its ~/.ray/auth_token)"
)


class RayAuthError(RollMuxError):
    """The Ray cluster wants a token this process does not have (or the right one)."""


def settle_token_auth(address: str) -> None:
    """Turn Ray's token mode on for this process if the cluster at ``address`` requires it.

    Does nothing where ``RAY_AUTH_MODE`` is set (the user decided) or where ``address`` is
    not ``HOST:PORT`` (``auto`` is settled by Ray itself, from the local token)."""
    if os.environ.get(MODE) is not None or not re.fullmatch(r"[^/:\s]+:\d+", address):
        return
    if _answers(address):
        return
    token = _token_at_hand()
    if token is None:
        raise RayAuthError(f"the Ray cluster at {address} wants a token and none is here: {WHAT_TO_SET}")
    os.environ[MODE] = "token"
    Config.initialize("")  # what Ray does to take up the mode in a running process
    AuthenticationTokenLoader.instance().reset_cache()
    if not _answers(address):
        raise RayAuthError(f"the Ray cluster at {address} refuses the token from {token}: {WHAT_TO_SET}")


def _answers(address: str) -> bool:
    """Whether the cluster's GCS answers this process with its present authentication
    (a single request: it fails at once when refused, unlike ``ray.init``). Ray's own
    warning of the refusal is kept off the terminal: here it is an answer, not a fault."""
    try:
        with _native_stderr_silenced():
            GcsClient(address=address)
    except AuthenticationError:
        return False
    except RayError as error:  # RpcError: the GCS did not answer in Ray's connect timeout
        raise RollMuxError(f"cannot reach the Ray cluster at {address}: {error}") from None
    return True


@contextmanager
def _native_stderr_silenced() -> Iterator[None]:
    """Point file descriptor 2 (where Ray's C++ logs go) at /dev/null for the block."""
    sys.stderr.flush()
    kept = os.dup(2)
    try:
        with open(os.devnull, "w") as sink:
            os.dup2(sink.fileno(), 2)
        yield
    finally:
        os.dup2(kept, 2)
        os.close(kept)


def _token_at_hand() -> str | None:
    """Where this process's token comes from, in Ray's order; None when it has none."""
    try:
        if not AuthenticationTokenLoader.instance().has_token(ignore_auth_mode=True):
            return None
    except AuthenticationError as error:  # e.g. RAY_AUTH_TOKEN_PATH names a missing file
        raise RayAuthError(f"{error.message}: {WHAT_TO_SET}") from None
    if os.environ.get("RAY_AUTH_TOKEN"):
        return "$RAY_AUTH_TOKEN"
    return os.environ.get("RAY_AUTH_TOKEN_PATH") or "~/.ray/auth_token"
