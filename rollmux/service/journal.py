"""Group commit: the control plane's changes written in order, many per transaction, off the
event loop.

Every change the control plane makes in memory is queued here as a delta; one writer
thread commits whatever has queued in a single transaction (one ``fsync`` for many
changes) and then resolves the futures of those deltas on the event loop. A change is
acknowledged only once its future resolved, so nothing acknowledged is ever lost, and the
event loop never waits on the disk.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable

from rollmux.core.control import Delta
from rollmux.service.store import Store

log = logging.getLogger("rollmux.journal")


class Journal:
    def __init__(self, store: Store, on_failure: Callable[[BaseException], None]):
        self.store = store
        self.on_failure = on_failure
        self._pending: list[tuple[Delta, asyncio.Future]] = []
        self._cv = threading.Condition()
        self._stopping = False
        self._failed: BaseException | None = None
        self._last: asyncio.Future | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread = threading.Thread(target=self._write_forever, name="rollmux-journal", daemon=True)
        self.commits = 0

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._thread.start()

    def submit(self, delta: Delta) -> asyncio.Future:
        """Queue a delta; the future resolves once it is committed (or fails with the commit)."""
        assert self._loop is not None, "journal not started"
        future = self._loop.create_future()
        if self._failed is not None:
            future.set_exception(self._failed)
            return future
        with self._cv:
            self._pending.append((delta, future))
            self._cv.notify()
        self._last = future
        return future

    async def barrier(self) -> None:
        """Wait until everything submitted so far is committed."""
        if self._last is not None:
            await asyncio.shield(self._last)

    def stop(self) -> None:
        with self._cv:
            self._stopping = True
            self._cv.notify()
        self._thread.join(timeout=30)

    def _write_forever(self) -> None:
        while True:
            with self._cv:
                while not self._pending and not self._stopping:
                    self._cv.wait()
                batch, self._pending = self._pending, []
                if not batch and self._stopping:
                    return
            try:
                self.store.apply([delta for delta, _ in batch])
            except BaseException as error:  # noqa: BLE001 - any failure stops the writer: fail-stop
                log.critical("commit failed, the control plane stops: %s", error)
                self._failed = error
                self._resolve(batch, error)
                self._fail_rest(error)
                assert self._loop is not None
                self._loop.call_soon_threadsafe(self.on_failure, error)
                return
            self.commits += 1
            self._resolve(batch, None)

    def _fail_rest(self, error: BaseException) -> None:
        with self._cv:
            rest, self._pending = self._pending, []
        self._resolve(rest, error)

    def _resolve(self, batch: list[tuple[Delta, asyncio.Future]], error: BaseException | None) -> None:
        assert self._loop is not None

        def settle() -> None:
            for _, future in batch:
                if future.done():
                    continue
                if error is None:
                    future.set_result(None)
                else:
                    future.set_exception(error)

        self._loop.call_soon_threadsafe(settle)
