"""Durable state of the service through SQLAlchemy: SQLite (WAL) by default, any URL otherwise.

Every accepted change is written in one transaction that holds the whole change (the job,
the group it joined or created, the nodes it added or released, the id counters), so after
a crash the database holds either all of a placement or none of it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import Float, ForeignKey, Integer, String, Text, create_engine, event, select
from sqlalchemy.engine import Engine
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, sessionmaker

from rollmux.core.cluster import Cluster, Group, Member
from rollmux.core.spec import CostModel, JobSpec, Planning, Pool

LIVE_STATES = ("placed", "running")


class Base(DeclarativeBase):
    pass


class JobRow(Base):
    __tablename__ = "jobs"
    seq: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(128), unique=True, index=True)
    spec: Mapped[str] = mapped_column(Text)
    state: Mapped[str] = mapped_column(String(16), index=True)
    group_id: Mapped[int | None] = mapped_column(Integer, nullable=True)
    rollout_nodes: Mapped[str] = mapped_column(Text, default="[]")
    train_nodes: Mapped[str] = mapped_column(Text, default="[]")
    submitted_at: Mapped[float] = mapped_column(Float)
    ended_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    cost_usd: Mapped[float] = mapped_column(Float, default=0.0)


class GroupRow(Base):
    __tablename__ = "groups"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)


class NodeRow(Base):
    __tablename__ = "nodes"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    pool: Mapped[str] = mapped_column(String(16))
    group_id: Mapped[int] = mapped_column(ForeignKey("groups.id"))


class PhaseRow(Base):
    """One completed phase a job reported (phase events)."""

    __tablename__ = "phases"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job: Mapped[str] = mapped_column(String(128), index=True)
    phase: Mapped[str] = mapped_column(String(16))
    iteration: Mapped[int] = mapped_column(Integer)
    nodes: Mapped[str] = mapped_column(Text)
    busy_s: Mapped[float] = mapped_column(Float)
    ended_at: Mapped[float] = mapped_column(Float)


class CounterRow(Base):
    __tablename__ = "counters"
    name: Mapped[str] = mapped_column(String(32), primary_key=True)
    value: Mapped[int] = mapped_column(Integer)


@dataclass(frozen=True)
class StoredJob:
    name: str
    spec: JobSpec
    state: str
    group_id: int | None
    rollout_nodes: tuple[int, ...]
    train_nodes: tuple[int, ...]
    submitted_at: float
    ended_at: float | None
    cost_usd: float


def _sqlite_pragmas(engine: Engine) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(connection, _record) -> None:
        cursor = connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=FULL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute("PRAGMA busy_timeout=10000")
        cursor.close()


def default_url(state_dir: Path) -> str:
    return f"sqlite:///{Path(state_dir) / 'rollmux.db'}"


class Store:
    """Reads and writes the service's state; one method per kind of accepted change."""

    def __init__(self, url: str):
        self.engine = create_engine(url, future=True)
        if self.engine.dialect.name == "sqlite":
            _sqlite_pragmas(self.engine)
        Base.metadata.create_all(self.engine)
        self.sessions = sessionmaker(self.engine, expire_on_commit=False)

    def load_cluster(self, cost: CostModel, planning: Planning) -> Cluster:
        """The cluster exactly as the last committed transaction left it."""
        with self.sessions() as session:
            counters = {row.name: row.value for row in session.scalars(select(CounterRow))}
            nodes = list(session.scalars(select(NodeRow).order_by(NodeRow.id)))
            live = session.scalars(select(JobRow).where(JobRow.state.in_(LIVE_STATES)).order_by(JobRow.seq))
            members: dict[int, list[Member]] = {}
            for row in live:
                member = Member(
                    JobSpec.from_dict(json.loads(row.spec)),
                    tuple(json.loads(row.rollout_nodes)),
                    tuple(json.loads(row.train_nodes)),
                )
                members.setdefault(row.group_id, []).append(member)
            groups = []
            for group_id in sorted(members):
                mine = [n for n in nodes if n.group_id == group_id]
                groups.append(
                    (
                        group_id,
                        [n.id for n in mine if n.pool == Pool.ROLLOUT.value],
                        [n.id for n in mine if n.pool == Pool.TRAIN.value],
                        members[group_id],
                    )
                )
            return Cluster.restore(
                cost,
                planning,
                groups,
                {n.id: Pool(n.pool) for n in nodes},
                counters.get("next_node", 0),
                counters.get("next_group", 0),
            )

    def record_placement(self, member: Member, group: Group, cluster: Cluster, now: float) -> None:
        """One transaction: the job row, its group, the nodes it added, the counters."""
        with self.sessions.begin() as session:
            session.add(
                JobRow(
                    name=member.job.name,
                    spec=json.dumps(member.job.to_dict()),
                    state="placed",
                    group_id=group.id,
                    rollout_nodes=json.dumps(list(member.rollout_nodes)),
                    train_nodes=json.dumps(list(member.train_nodes)),
                    submitted_at=now,
                )
            )
            if session.get(GroupRow, group.id) is None:
                session.add(GroupRow(id=group.id))
                session.flush()
            for node in (*group.rollout_nodes, *group.train_nodes):
                if session.get(NodeRow, node) is None:
                    session.add(NodeRow(id=node, pool=cluster.node_pool[node].value, group_id=group.id))
            self._save_counters(session, cluster)

    def record_end(
        self, job: str, state: str, released: Iterable[int], group_gone: int | None, now: float, cost_usd: float
    ) -> None:
        """One transaction: the job's final state, its released nodes and, if empty, its group."""
        with self.sessions.begin() as session:
            row = session.scalars(select(JobRow).where(JobRow.name == job)).one()
            row.state, row.ended_at, row.cost_usd = state, now, cost_usd
            for node in released:
                session.delete(session.get(NodeRow, node))
            session.flush()
            if group_gone is not None:
                session.delete(session.get(GroupRow, group_gone))

    def set_state(self, job: str, state: str) -> None:
        with self.sessions.begin() as session:
            session.scalars(select(JobRow).where(JobRow.name == job)).one().state = state

    def record_phase(
        self, job: str, phase: str, iteration: int, nodes: Iterable[int], busy_s: float, now: float
    ) -> None:
        with self.sessions.begin() as session:
            session.add(
                PhaseRow(
                    job=job,
                    phase=phase,
                    iteration=iteration,
                    nodes=json.dumps(list(nodes)),
                    busy_s=busy_s,
                    ended_at=now,
                )
            )

    def phases(self, job: str) -> list[dict]:
        with self.sessions() as session:
            rows = session.scalars(select(PhaseRow).where(PhaseRow.job == job).order_by(PhaseRow.id))
            return [
                {
                    "phase": r.phase,
                    "iteration": r.iteration,
                    "nodes": json.loads(r.nodes),
                    "busy_s": r.busy_s,
                    "ended_at": r.ended_at,
                }
                for r in rows
            ]

    def jobs(self) -> list[StoredJob]:
        with self.sessions() as session:
            return [_stored(row) for row in session.scalars(select(JobRow).order_by(JobRow.seq))]

    def job(self, name: str) -> StoredJob | None:
        with self.sessions() as session:
            row = session.scalars(select(JobRow).where(JobRow.name == name)).one_or_none()
            return _stored(row) if row else None

    @staticmethod
    def _save_counters(session: Session, cluster: Cluster) -> None:
        next_node, next_group = cluster.next_ids
        for name, value in (("next_node", next_node), ("next_group", next_group)):
            row = session.get(CounterRow, name)
            if row is None:
                session.add(CounterRow(name=name, value=value))
            else:
                row.value = value


def _stored(row: JobRow) -> StoredJob:
    return StoredJob(
        name=row.name,
        spec=JobSpec.from_dict(json.loads(row.spec)),
        state=row.state,
        group_id=row.group_id,
        rollout_nodes=tuple(json.loads(row.rollout_nodes)),
        train_nodes=tuple(json.loads(row.train_nodes)),
        submitted_at=row.submitted_at,
        ended_at=row.ended_at,
        cost_usd=row.cost_usd,
    )
