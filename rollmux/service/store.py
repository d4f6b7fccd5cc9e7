"""Durable state of the control plane through SQLAlchemy: SQLite (WAL) by default, any URL
otherwise.

The control plane changes its state in memory and hands the store the rows that changed
(:class:`rollmux.core.control.Delta`); :meth:`Store.apply` writes a batch of deltas in one
transaction, in order, so the database always holds a prefix of the accepted changes and
a change is acknowledged only once it is committed. Loading reads live jobs only, so a
restart takes the same time whatever the finished history holds.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import Float, Integer, String, Text, create_engine, delete, event, make_url, select
from sqlalchemy.engine import Engine
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, sessionmaker

from rollmux.core.control import (
    LIVE_STATES,
    Delta,
    Grant,
    GroupRecord,
    Job,
    JobRecord,
    Move,
    MoveEntry,
    NodeRecord,
    PhaseEntry,
    Snapshot,
)
from rollmux.core.errors import RollMuxError
from rollmux.core.spec import JobSpec, Pool
from rollmux.service.private import private_file

SCHEMA_VERSION = 7
UPGRADES = {
    5: ("ALTER TABLE jobs ADD COLUMN parked INTEGER NOT NULL DEFAULT 0",),
    6: ("ALTER TABLE jobs ADD COLUMN moves INTEGER NOT NULL DEFAULT 0",),
}
"""Statements that bring a database of the schema named up to the next one, so an older
store is upgraded in place instead of refused (its jobs are kept)."""


class StoreError(RollMuxError):
    """The database cannot be used by this version of RollMux."""


class Base(DeclarativeBase):
    pass


class MetaRow(Base):
    __tablename__ = "meta"
    key: Mapped[str] = mapped_column(String(32), primary_key=True)
    value: Mapped[str] = mapped_column(Text)


class JobRow(Base):
    __tablename__ = "jobs"
    seq: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(128), unique=True, index=True)
    spec: Mapped[str] = mapped_column(Text)
    program: Mapped[str] = mapped_column(Text)
    state: Mapped[str] = mapped_column(String(16), index=True)
    reason: Mapped[str] = mapped_column(Text, default="")
    priority: Mapped[int] = mapped_column(Integer, default=0)
    max_restarts: Mapped[int] = mapped_column(Integer, default=3)
    group_id: Mapped[int | None] = mapped_column(Integer, nullable=True)
    rollout_nodes: Mapped[str] = mapped_column(Text, default="[]")
    train_nodes: Mapped[str] = mapped_column(Text, default="[]")
    colocated: Mapped[int] = mapped_column(Integer, default=0)
    epoch: Mapped[int] = mapped_column(Integer, default=0)
    iteration: Mapped[int] = mapped_column(Integer, default=0)
    next_phase: Mapped[str] = mapped_column(String(16), default="rollout")
    cycles: Mapped[int] = mapped_column(Integer, default=0)
    restarts: Mapped[int] = mapped_column(Integer, default=0)
    launch: Mapped[int] = mapped_column(Integer, default=0)
    grant: Mapped[str | None] = mapped_column(Text, nullable=True)
    last_token: Mapped[int] = mapped_column(Integer, default=0)
    submitted_at: Mapped[float] = mapped_column(Float)
    placed_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    ended_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    cost_usd: Mapped[float] = mapped_column(Float, default=0.0)
    paused_s: Mapped[float] = mapped_column(Float, default=0.0)
    moves: Mapped[int] = mapped_column(Integer, default=0)
    move: Mapped[str | None] = mapped_column(Text, nullable=True)
    parked: Mapped[int] = mapped_column(Integer, default=0)


class NodeRow(Base):
    __tablename__ = "nodes"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    pool: Mapped[str] = mapped_column(String(16))
    group_id: Mapped[int] = mapped_column(Integer, index=True)


class GroupRow(Base):
    __tablename__ = "groups"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)


class PhaseRow(Base):
    """One line of the phase log: a grant and how it ended (released or revoked)."""

    __tablename__ = "phases"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job: Mapped[str] = mapped_column(String(128), index=True)
    epoch: Mapped[int] = mapped_column(Integer)
    token: Mapped[int] = mapped_column(Integer)
    phase: Mapped[str] = mapped_column(String(16))
    iteration: Mapped[int] = mapped_column(Integer)
    nodes: Mapped[str] = mapped_column(Text)
    requested_at: Mapped[float] = mapped_column(Float)
    granted_at: Mapped[float] = mapped_column(Float)
    ended_at: Mapped[float] = mapped_column(Float)
    busy_s: Mapped[float] = mapped_column(Float)
    wake_s: Mapped[float] = mapped_column(Float)
    sleep_s: Mapped[float] = mapped_column(Float)
    outcome: Mapped[str] = mapped_column(String(16))


class EventRow(Base):
    __tablename__ = "events"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job: Mapped[str] = mapped_column(String(128), index=True)
    at: Mapped[float] = mapped_column(Float)
    kind: Mapped[str] = mapped_column(String(16))
    detail: Mapped[str] = mapped_column(Text)


class MetricsRow(Base):
    __tablename__ = "metrics"
    job: Mapped[str] = mapped_column(String(128), primary_key=True)
    iteration: Mapped[int] = mapped_column(Integer, primary_key=True)
    values: Mapped[str] = mapped_column(Text)


class NodeLogRow(Base):
    """When each node was taken and given back: what the cluster paid for."""

    __tablename__ = "node_log"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    node: Mapped[int] = mapped_column(Integer, index=True)
    pool: Mapped[str] = mapped_column(String(16))
    at: Mapped[float] = mapped_column(Float)
    held: Mapped[int] = mapped_column(Integer)


class MoveRow(Base):
    """One move of a running job between groups, with the pause it cost the job."""

    __tablename__ = "moves"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job: Mapped[str] = mapped_column(String(128), index=True)
    epoch: Mapped[int] = mapped_column(Integer)
    reason: Mapped[str] = mapped_column(Text)
    origin: Mapped[str] = mapped_column(Text)
    target: Mapped[str] = mapped_column(Text)
    decided_at: Mapped[float] = mapped_column(Float)
    ready_at: Mapped[float] = mapped_column(Float)
    done_at: Mapped[float] = mapped_column(Float)
    pause_s: Mapped[float] = mapped_column(Float)
    moved_bytes: Mapped[int] = mapped_column(Integer)
    outcome: Mapped[str] = mapped_column(String(16))


class CounterRow(Base):
    __tablename__ = "counters"
    name: Mapped[str] = mapped_column(String(32), primary_key=True)
    value: Mapped[int] = mapped_column(Integer)


@dataclass(frozen=True)
class JobPage:
    records: list[JobRecord]
    next_cursor: int | None


def _sqlite_pragmas(engine: Engine) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(connection, _record) -> None:
        cursor = connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=FULL")
        cursor.execute("PRAGMA busy_timeout=10000")
        cursor.close()


def default_url(state_dir: Path) -> str:
    return f"sqlite:///{Path(state_dir) / 'rollmux.db'}"


def _private_sqlite_files(url: str) -> None:
    """Create an SQLite database file readable by its owner only (0600) before SQLite opens
    it: SQLite gives its ``-wal`` and ``-shm`` files the database file's mode. A database,
    WAL or shared-memory file left looser by an older version is tightened."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return
    database = Path(parsed.database)
    private_file(database)
    for suffix in ("-wal", "-shm", "-journal"):
        companion = database.with_name(database.name + suffix)
        if companion.exists():
            private_file(companion)


class Store:
    """Reads and writes the control plane's rows."""

    def __init__(self, url: str):
        self.url = url
        _private_sqlite_files(url)
        self.engine = create_engine(url)
        if self.engine.dialect.name == "sqlite":
            _sqlite_pragmas(self.engine)
        self._upgrade_schema()
        Base.metadata.create_all(self.engine)
        self.sessions = sessionmaker(self.engine, expire_on_commit=False)
        with self.sessions.begin() as session:
            if session.get(MetaRow, "schema") is None:
                session.add(MetaRow(key="schema", value=str(SCHEMA_VERSION)))

    def _upgrade_schema(self) -> None:
        """Bring a database of an older schema this version knows up to date, in one
        transaction; refuse any other instead of misreading it."""
        with self.engine.begin() as connection:
            tables = set(self.engine.dialect.get_table_names(connection))
            if not tables:
                return
            version = None
            if "meta" in tables:
                version = connection.exec_driver_sql("SELECT value FROM meta WHERE key = 'schema'").scalar()
            found = int(version) if version is not None and version.isdigit() else 1
            if found not in UPGRADES and found != SCHEMA_VERSION:
                raise StoreError(
                    f"{self.url}: written by another RollMux version (schema {found}, this one reads "
                    f"{SCHEMA_VERSION}); move it away or use another --state-dir"
                )
            for step in range(found, SCHEMA_VERSION):
                for statement in UPGRADES[step]:
                    connection.exec_driver_sql(statement)
            if found != SCHEMA_VERSION:
                connection.exec_driver_sql(f"UPDATE meta SET value = '{SCHEMA_VERSION}' WHERE key = 'schema'")

    # --- writes ------------------------------------------------------------------------

    def apply(self, deltas: Sequence[Delta]) -> None:
        """Write a batch of deltas in one transaction: rows as the last delta left them (the
        intermediate states are never visible), log entries all, in order."""
        merged = _merge(deltas)
        with self.sessions.begin() as session:
            _apply(session, merged)

    # --- reads -------------------------------------------------------------------------

    def load(self) -> Snapshot:
        """Live jobs, groups with their nodes, and counters: the state to restore."""
        with self.sessions() as session:
            live = session.scalars(select(JobRow).where(JobRow.state.in_(LIVE_STATES)).order_by(JobRow.seq))
            jobs = [_record(row) for row in live]
            nodes: dict[int, list[NodeRecord]] = {}
            for row in session.scalars(select(NodeRow).order_by(NodeRow.id)):
                nodes.setdefault(row.group_id, []).append(NodeRecord(row.id, Pool(row.pool)))
            groups = [GroupRecord(g.id, tuple(nodes.get(g.id, ()))) for g in session.scalars(select(GroupRow))]
            counters = {row.name: row.value for row in session.scalars(select(CounterRow))}
        return Snapshot(jobs, groups, counters)

    def job(self, name: str) -> JobRecord | None:
        with self.sessions() as session:
            row = session.scalars(select(JobRow).where(JobRow.name == name)).one_or_none()
            return _record(row) if row else None

    def named(self, names: Sequence[str]) -> dict[str, JobRecord]:
        """The stored jobs among ``names`` (one query, for a plan's name check)."""
        with self.sessions() as session:
            rows = session.scalars(select(JobRow).where(JobRow.name.in_(list(names))))
            return {row.name: _record(row) for row in rows}

    def jobs(self, states: Sequence[str] = (), after: int = -1, limit: int = 100) -> JobPage:
        """Jobs in submission order after the cursor ``after``, optionally of some states."""
        with self.sessions() as session:
            query = select(JobRow).where(JobRow.seq > after)
            if states:
                query = query.where(JobRow.state.in_(states))
            rows = list(session.scalars(query.order_by(JobRow.seq).limit(limit + 1)))
        more = len(rows) > limit
        rows = rows[:limit]
        return JobPage([_record(r) for r in rows], rows[-1].seq if more else None)

    def phases(self, job: str | None = None, after: int = -1, limit: int | None = None) -> list[dict[str, Any]]:
        """The phase log, of one job or of all, in the order phases ended (after id ``after``)."""
        with self.sessions() as session:
            query = select(PhaseRow).where(PhaseRow.id > after).order_by(PhaseRow.id)
            if job is not None:
                query = query.where(PhaseRow.job == job)
            if limit is not None:
                query = query.limit(limit)
            return [
                {
                    "id": r.id,
                    "job": r.job,
                    "epoch": r.epoch,
                    "token": r.token,
                    "phase": r.phase,
                    "iteration": r.iteration,
                    "nodes": json.loads(r.nodes),
                    "requested_at": r.requested_at,
                    "granted_at": r.granted_at,
                    "ended_at": r.ended_at,
                    "busy_s": r.busy_s,
                    "wake_s": r.wake_s,
                    "sleep_s": r.sleep_s,
                    "outcome": r.outcome,
                }
                for r in session.scalars(query)
            ]

    def node_log(self, after: int = -1, limit: int | None = None) -> list[dict[str, Any]]:
        """Nodes taken and given back, in order (after id ``after``)."""
        with self.sessions() as session:
            query = select(NodeLogRow).where(NodeLogRow.id > after).order_by(NodeLogRow.id)
            if limit is not None:
                query = query.limit(limit)
            return [
                {"id": r.id, "node": r.node, "pool": r.pool, "at": r.at, "held": bool(r.held)}
                for r in session.scalars(query)
            ]

    def moves(self, after: int = -1, limit: int | None = None) -> list[dict[str, Any]]:
        """The moves of running jobs, in the order they ended (after id ``after``)."""
        with self.sessions() as session:
            query = select(MoveRow).where(MoveRow.id > after).order_by(MoveRow.id)
            if limit is not None:
                query = query.limit(limit)
            return [
                {
                    "id": r.id,
                    "job": r.job,
                    "epoch": r.epoch,
                    "reason": r.reason,
                    "origin": json.loads(r.origin),
                    "target": json.loads(r.target),
                    "decided_at": r.decided_at,
                    "ready_at": r.ready_at,
                    "done_at": r.done_at,
                    "pause_s": r.pause_s,
                    "moved_bytes": r.moved_bytes,
                    "outcome": r.outcome,
                }
                for r in session.scalars(query)
            ]

    def events(self, job: str) -> list[dict[str, Any]]:
        with self.sessions() as session:
            rows = session.scalars(select(EventRow).where(EventRow.job == job).order_by(EventRow.id))
            return [{"at": r.at, "kind": r.kind, "detail": r.detail} for r in rows]

    def metrics(self, job: str) -> list[dict[str, float]]:
        with self.sessions() as session:
            rows = session.scalars(select(MetricsRow).where(MetricsRow.job == job).order_by(MetricsRow.iteration))
            return [json.loads(r.values) for r in rows]


def _merge(deltas: Sequence[Delta]) -> Delta:
    merged = Delta()
    for delta in deltas:
        merged.jobs.update(delta.jobs)
        merged.groups.update(delta.groups)
        merged.counters.update(delta.counters)
        merged.phases += delta.phases
        merged.events += delta.events
        merged.metrics += delta.metrics
        merged.nodes += delta.nodes
        merged.moves += delta.moves
    return merged


_STATEMENTS: dict[tuple[str, str, tuple[str, ...], tuple[str, ...]], Any] = {}


def _upsert(session: Session, table, rows: list[dict[str, Any]], keys: tuple[str, ...]) -> None:
    """Insert rows, or update those whose key exists: one statement for all of them (built
    once per table and column set: building it costs more than running it)."""
    if not rows:
        return
    dialect = session.get_bind().dialect.name
    values = tuple(c for c in rows[0] if c not in keys)
    cache_key = (dialect, table.name, keys, values)
    if cache_key not in _STATEMENTS:
        _STATEMENTS[cache_key] = _upsert_statement(dialect, table, keys, values)
    session.execute(_STATEMENTS[cache_key], rows)


def _upsert_statement(dialect: str, table, keys: tuple[str, ...], values: tuple[str, ...]):
    if dialect in ("mysql", "mariadb"):
        from sqlalchemy.dialects.mysql import insert as mysql_insert

        statement = mysql_insert(table)
        return statement.on_duplicate_key_update({c: statement.inserted[c] for c in values or keys[:1]})
    if dialect == "postgresql":
        from sqlalchemy.dialects.postgresql import insert
    else:
        from sqlalchemy.dialects.sqlite import insert
    statement = insert(table)
    if not values:
        return statement.on_conflict_do_nothing(index_elements=list(keys))
    return statement.on_conflict_do_update(index_elements=list(keys), set_={c: statement.excluded[c] for c in values})


def _apply(session: Session, delta: Delta) -> None:
    _upsert(session, JobRow.__table__, [_job_row(r) for r in delta.jobs.values()], ("seq",))
    if delta.groups:
        session.execute(delete(NodeRow).where(NodeRow.group_id.in_(list(delta.groups))))
        gone = [g for g, group in delta.groups.items() if group is None]
        if gone:
            session.execute(delete(GroupRow).where(GroupRow.id.in_(gone)))
        kept = [group for group in delta.groups.values() if group is not None]
        _upsert(session, GroupRow.__table__, [{"id": g.id} for g in kept], ("id",))
        nodes = [{"id": n.id, "pool": n.pool.value, "group_id": g.id} for g in kept for n in g.nodes]
        if nodes:
            session.execute(NodeRow.__table__.insert(), nodes)
    counters = [{"name": name, "value": value} for name, value in delta.counters.items()]
    _upsert(session, CounterRow.__table__, counters, ("name",))
    if delta.phases:
        session.execute(PhaseRow.__table__.insert(), [_phase_row(entry) for entry in delta.phases])
    if delta.events:
        events = [{"job": e.job, "at": e.at, "kind": e.kind, "detail": e.detail[:2000]} for e in delta.events]
        session.execute(EventRow.__table__.insert(), events)
    if delta.nodes:
        nodes = [{"node": n.node, "pool": n.pool.value, "at": n.at, "held": int(n.held)} for n in delta.nodes]
        session.execute(NodeLogRow.__table__.insert(), nodes)
    if delta.moves:
        session.execute(MoveRow.__table__.insert(), [_move_row(entry) for entry in delta.moves])
    latest = {(m.job, m.iteration): m for m in delta.metrics}
    metrics = [{"job": m.job, "iteration": m.iteration, "values": json.dumps(m.values)} for m in latest.values()]
    _upsert(session, MetricsRow.__table__, metrics, ("job", "iteration"))


def _move_row(entry: MoveEntry) -> dict[str, Any]:
    return {
        "job": entry.job,
        "epoch": entry.epoch,
        "reason": entry.reason[:2000],
        "origin": json.dumps(list(entry.origin)),
        "target": json.dumps(list(entry.target)),
        "decided_at": entry.decided_at,
        "ready_at": entry.ready_at,
        "done_at": entry.done_at,
        "pause_s": entry.pause_s,
        "moved_bytes": entry.moved_bytes,
        "outcome": entry.outcome,
    }


def _move_json(move: Move | None) -> str | None:
    if move is None:
        return None
    return json.dumps(
        {
            "origin": [[n, p.value] for n, p in move.origin],
            "rollout_from": list(move.rollout_from),
            "train_from": list(move.train_from),
            "decided_at": move.decided_at,
            "reason": move.reason,
            "ready_at": move.ready_at,
        }
    )


def _move(text: str | None) -> Move | None:
    if not text:
        return None
    m = json.loads(text)
    return Move(
        tuple((n, Pool(p)) for n, p in m["origin"]),
        tuple(m["rollout_from"]),
        tuple(m["train_from"]),
        m["decided_at"],
        m["reason"],
        m["ready_at"],
    )


def _phase_row(entry: PhaseEntry) -> dict[str, Any]:
    g = entry.grant
    return {
        "job": g.job,
        "epoch": g.epoch,
        "token": g.token,
        "phase": g.phase,
        "iteration": g.iteration,
        "nodes": json.dumps(list(g.nodes)),
        "requested_at": g.requested_at,
        "granted_at": g.granted_at,
        "ended_at": entry.ended_at,
        "busy_s": entry.timing.busy_s,
        "wake_s": entry.timing.wake_s,
        "sleep_s": entry.timing.sleep_s,
        "outcome": entry.outcome,
    }


@functools.lru_cache(maxsize=4096)
def _spec_json(spec: JobSpec) -> str:
    return json.dumps(spec.to_dict())


def _job_row(record: JobRecord) -> dict[str, Any]:
    job = record.job
    return {
        "seq": job.seq,
        "name": job.name,
        "spec": _spec_json(job.spec),
        "program": json.dumps(job.program),
        "state": job.state,
        "reason": job.reason[:2000],
        "priority": job.priority,
        "max_restarts": job.max_restarts,
        "group_id": record.group_id,
        "rollout_nodes": json.dumps(list(record.rollout_nodes)),
        "train_nodes": json.dumps(list(record.train_nodes)),
        "colocated": int(record.colocated),
        "epoch": job.epoch,
        "iteration": job.iteration,
        "next_phase": job.next_phase,
        "cycles": job.cycles,
        "restarts": job.restarts,
        "launch": job.launch,
        "grant": json.dumps(_grant_dict(job.grant)) if job.grant else None,
        "last_token": job.last_token,
        "submitted_at": job.submitted_at,
        "placed_at": job.placed_at,
        "ended_at": job.ended_at,
        "cost_usd": job.cost_usd,
        "paused_s": job.paused_s,
        "moves": job.moves,
        "move": _move_json(job.move),
        "parked": int(job.parked),
    }


def _grant_dict(grant: Grant) -> dict[str, Any]:
    return {
        "phase": grant.phase,
        "nodes": list(grant.nodes),
        "epoch": grant.epoch,
        "token": grant.token,
        "iteration": grant.iteration,
        "requested_at": grant.requested_at,
        "granted_at": grant.granted_at,
        "joined": [list(pair) for pair in grant.joined],
        "shed": list(grant.shed),
        "tail_moved": grant.tail_moved,
        "shed_node_s": grant.shed_node_s,
    }


def _record(row: JobRow) -> JobRecord:
    grant = None
    if row.grant:
        g = json.loads(row.grant)
        grant = Grant(
            row.name,
            g["phase"],
            tuple(g["nodes"]),
            g["epoch"],
            g["token"],
            g["iteration"],
            g["requested_at"],
            g["granted_at"],
            tuple((node, at) for node, at in g.get("joined", ())),
            tuple(g.get("shed", ())),
            g.get("tail_moved", False),
            g.get("shed_node_s", 0.0),
        )
    job = Job(
        name=row.name,
        seq=row.seq,
        spec=JobSpec.from_dict(json.loads(row.spec)),
        program=json.loads(row.program),
        submitted_at=row.submitted_at,
        priority=row.priority,
        max_restarts=row.max_restarts,
        state=row.state,
        reason=row.reason,
        epoch=row.epoch,
        iteration=row.iteration,
        next_phase=row.next_phase,
        cycles=row.cycles,
        restarts=row.restarts,
        launch=row.launch,
        grant=grant,
        last_token=row.last_token,
        placed_at=row.placed_at,
        ended_at=row.ended_at,
        cost_usd=row.cost_usd,
        paused_s=row.paused_s,
        moves=row.moves,
        move=_move(row.move),
        parked=bool(row.parked),
    )
    return JobRecord(
        job,
        row.group_id,
        tuple(json.loads(row.rollout_nodes)),
        tuple(json.loads(row.train_nodes)),
        bool(row.colocated),
    )
