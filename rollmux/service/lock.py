"""Single writer: one control plane per store, enforced by a lock the operating system or
the database releases when its holder dies.

SQLite: an exclusive ``flock`` on ``<database>.lock``, which also records who holds it.
PostgreSQL: a session-level advisory lock; MySQL/MariaDB: a named lock. Either is held by a
connection kept open for the life of the server.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import text
from sqlalchemy.engine import Connection, Engine

from rollmux.core.errors import RollMuxError
from rollmux.service.private import private_file

LOCK_KEY = 0x524F4C4C4D5558  # "ROLLMUX"


class StoreLocked(RollMuxError):
    """Another control plane already writes this store."""


@dataclass
class WriterLock:
    """Held for the life of the server; :meth:`release` on a clean stop."""

    holder: dict[str, Any]
    _file: Any = None
    _connection: Connection | None = None

    def release(self) -> None:
        if self._file is not None:
            fcntl.flock(self._file, fcntl.LOCK_UN)
            self._file.close()
            self._file = None
        if self._connection is not None:
            self._connection.invalidate()  # really close it: a pooled connection would keep the lock
            self._connection.close()
            self._connection = None


def acquire_writer_lock(engine: Engine, serving: str) -> WriterLock:
    """Take the store's single-writer lock, or raise :class:`StoreLocked` naming its holder."""
    holder = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.time(), "serving": serving}
    dialect = engine.dialect.name
    if dialect == "sqlite":
        return _sqlite_lock(engine, holder)
    if dialect in ("postgresql", "mysql", "mariadb"):
        return _database_lock(engine, holder, dialect)
    raise StoreLocked(f"no single-writer lock for {dialect} databases: use SQLite, PostgreSQL or MySQL")


def _sqlite_lock(engine: Engine, holder: dict[str, Any]) -> WriterLock:
    database = engine.url.database
    if not database or database == ":memory:":
        return WriterLock(holder)
    path = private_file(Path(database).with_name(Path(database).name + ".lock"))
    handle = open(path, "a+")  # noqa: SIM115 - kept open: the lock lives as long as the file handle
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        owner = handle.read()
        handle.close()
        raise StoreLocked(f"{database} is in use by another rollmux control plane: {_describe(owner)}") from None
    handle.seek(0)
    handle.truncate()
    handle.write(json.dumps(holder))
    handle.flush()
    return WriterLock(holder, _file=handle)


def sqlite_holder(database: Path) -> str | None:
    """Who writes this SQLite store now, described; None while no control plane does."""
    path = database.with_name(database.name + ".lock")
    if not path.exists():
        return None
    with open(path, "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            return _describe(handle.read())
        fcntl.flock(handle, fcntl.LOCK_UN)
    return None


def _database_lock(engine: Engine, holder: dict[str, Any], dialect: str) -> WriterLock:
    """A session-level lock held by a connection kept open; the holder is written to the
    ``meta`` table so that a refused server can name it."""
    connection = engine.connect()
    if dialect == "postgresql":
        got = connection.execute(text("SELECT pg_try_advisory_lock(:key)"), {"key": LOCK_KEY}).scalar()
    else:
        got = connection.execute(text("SELECT GET_LOCK('rollmux-control-plane', 0)")).scalar() == 1
    connection.commit()
    if not got:
        connection.close()
        with engine.connect() as reader:
            owner = reader.execute(text("SELECT value FROM meta WHERE key = 'holder'")).scalar() or ""
        url = engine.url.render_as_string()
        raise StoreLocked(f"{url} is in use by another rollmux control plane: {_describe(owner)}")
    with engine.begin() as writer:
        writer.execute(text("DELETE FROM meta WHERE key = 'holder'"))
        writer.execute(text("INSERT INTO meta (key, value) VALUES ('holder', :value)"), {"value": json.dumps(holder)})
    return WriterLock(holder, _connection=connection)


def _describe(owner: str) -> str:
    try:
        info = json.loads(owner)
    except ValueError:
        return "holder unknown"
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(info.get("since", 0)))
    return f"pid {info.get('pid')} on {info.get('host')} since {since}, serving {info.get('serving')}; stop it first"
