"""What every request must pass before the API reads its body: the token, the size limit
and the nesting limit.

A plain ASGI middleware, so nothing is read or parsed for a request it refuses: a wrong
or missing token is answered 401 before one byte of the body is received, a declared or
actual body over the limit 413, and JSON or YAML nested deeper than :data:`MAX_DEPTH`
422 (deep nesting would otherwise exhaust the parsers' recursion).
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Awaitable, Callable
from typing import Any

MAX_BODY_BYTES = 1 << 20
MAX_DEPTH = 32
OPEN_PATHS = frozenset({"/healthz", "/readyz"})

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]

_STRINGS = re.compile(rb'"(?:\\.|[^"\\])*"|\'(?:[^\'])*\'')
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")


def nesting_depth(body: bytes) -> int:
    """Deepest bracket nesting of a JSON (or flow-style YAML) text, strings ignored."""
    brackets = _STRINGS.sub(b"", body).translate(None, _NOT_BRACKETS)
    depth = deepest = 0
    for byte in brackets:
        depth += 1 if byte in b"[{" else -1
        deepest = max(deepest, depth)
    return deepest


class RequestGuard:
    def __init__(self, app: Callable, token: str, max_body: int = MAX_BODY_BYTES, max_depth: int = MAX_DEPTH):
        self.app = app
        self.token = token.encode()
        self.max_body = max_body
        self.max_depth = max_depth

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        if scope["path"] not in OPEN_PATHS and not self._authorised(headers.get(b"authorization", b"")):
            await _answer(send, 401, "missing or wrong bearer token", {b"www-authenticate": b"Bearer"})
            return
        declared = headers.get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.max_body):
            await _answer(send, 413, f"body over {self.max_body} bytes")
            return
        if scope["method"] in ("GET", "HEAD"):
            await self.app(scope, receive, send)
            return
        try:
            body = await self._read(receive)
        except _Gone:
            return
        if body is None:
            await _answer(send, 413, f"body over {self.max_body} bytes")
            return
        if nesting_depth(body) > self.max_depth:
            await _answer(send, 422, [{"loc": ["body"], "msg": f"nested deeper than {self.max_depth} levels"}])
            return
        await self.app(scope, _replay(body, receive), send)

    def _authorised(self, header: bytes) -> bool:
        scheme, _, credentials = header.partition(b" ")
        return scheme.lower() == b"bearer" and secrets.compare_digest(credentials.strip(), self.token)

    async def _read(self, receive: Receive) -> bytes | None:
        """The whole body, or None as soon as it grows over the limit."""
        chunks, size, more = [], 0, True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise _Gone
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body:
                return None
            chunks.append(chunk)
            more = message.get("more_body", False)
        return b"".join(chunks)


class _Gone(Exception):
    """The client disconnected before its body arrived."""


def _replay(body: bytes, receive: Receive) -> Receive:
    """The body already read, then the connection's own messages (a later disconnect)."""
    sent = False

    async def replayed() -> dict[str, Any]:
        nonlocal sent
        if sent:
            return await receive()
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replayed


async def _answer(send: Send, status: int, detail: Any, extra: dict[bytes, bytes] | None = None) -> None:
    payload = json.dumps({"detail": detail}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
    headers += list((extra or {}).items())
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": payload})
