"""The store on every database it supports: a restart restores what was committed, one
writer at a time. SQLite always; PostgreSQL when ``ROLLMUX_TEST_POSTGRES`` names a
database to use (it is emptied), e.g. ``postgresql+psycopg://user:pass@127.0.0.1/rollmux``."""

from __future__ import annotations

import os

import pytest
from sqlalchemy import MetaData, create_engine

from rollmux.core.cluster import Cluster
from rollmux.core.control import ControlState, PhaseTiming
from rollmux.core.placement import make_policy
from rollmux.core.spec import DEFAULT_PLANNING, CostModel, JobSpec, PhaseTime
from rollmux.service.lock import StoreLocked, acquire_writer_lock
from rollmux.service.store import Store, StoreError

POSTGRES = os.environ.get("ROLLMUX_TEST_POSTGRES")


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request, tmp_path):
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'state.db'}"
    if not POSTGRES:
        pytest.skip("set ROLLMUX_TEST_POSTGRES to test PostgreSQL")
    engine = create_engine(POSTGRES)
    metadata = MetaData()
    metadata.reflect(engine)
    metadata.drop_all(engine)
    engine.dispose()
    return POSTGRES


def test_what_was_committed_is_what_a_restart_restores(url):
    store = Store(url)
    state = ControlState(Cluster(), make_policy("rollmux"))
    for name in ("a", "b", "c"):
        state.submit(JobSpec(name, PhaseTime.fixed(1.0), PhaseTime.fixed(1.0), slo=3.0), {"kind": "external"}, 0.0)
        state.activate(name, state.begin_session(name, 0.0).epoch, 0, 0.0)
    for step in range(7):
        for job in list(state.jobs.values()):
            if job.grant is not None:
                state.release(job.name, job.grant.phase, job.epoch, job.grant.token, PhaseTiming(1.0), step)
            else:
                state.acquire(job.name, job.next_phase, job.epoch, step)
        state.report("a", 1, step, {"loss": 1.0 / (step + 1)}, step)
        store.apply([state.drain()])
    state.end("c", "done", 9.0)
    store.apply([state.drain()])

    again = Store(url)
    restored = ControlState.restore(again.load(), CostModel(), DEFAULT_PLANNING, make_policy("rollmux"), 10.0)
    assert sorted(restored.jobs) == ["a", "b"]
    for name, job in restored.jobs.items():
        kept = state.jobs[name]
        assert (job.epoch, job.grant, job.next_phase, job.iteration) == (
            kept.epoch,
            kept.grant,
            kept.next_phase,
            kept.iteration,
        )
    assert again.job("c").job.state == "done" and again.job("c").group_id is not None
    assert [m["loss"] for m in again.metrics("a")] == [1.0 / (s + 1) for s in range(7)]
    assert len(again.phases()) == sum(1 for _ in again.phases("a")) + sum(1 for _ in again.phases("b")) + len(
        again.phases("c")
    )


def test_one_writer_at_a_time(url):
    store = Store(url)
    held = acquire_writer_lock(store.engine, "http://first:8765")
    with pytest.raises(StoreLocked, match="serving http://first:8765"):
        acquire_writer_lock(Store(url).engine, "http://second:8765")
    held.release()
    acquire_writer_lock(Store(url).engine, "http://second:8765").release()


def test_a_database_of_the_previous_schema_is_upgraded_in_place(tmp_path):
    import sqlite3

    path = tmp_path / "old.db"
    store = Store(f"sqlite:///{path}")
    state = ControlState(Cluster(), make_policy("rollmux"))
    state.submit(JobSpec("a", PhaseTime.fixed(1.0), PhaseTime.fixed(1.0), slo=3.0), {"kind": "external"}, 0.0)
    store.apply([state.drain()])
    store.engine.dispose()
    with sqlite3.connect(path) as old:  # as schema 5 left it: no parked or moves column
        old.execute("ALTER TABLE jobs DROP COLUMN parked")
        old.execute("ALTER TABLE jobs DROP COLUMN moves")
        old.execute("UPDATE meta SET value = '5' WHERE key = 'schema'")
    again = Store(f"sqlite:///{path}")
    (record,) = again.load().jobs
    assert record.job.name == "a" and record.job.state == "placed" and not record.job.parked
    assert record.job.moves == 0


def test_a_database_of_another_version_is_refused(tmp_path):
    import sqlite3

    with sqlite3.connect(tmp_path / "old.db") as old:
        old.execute("CREATE TABLE jobs (seq INTEGER PRIMARY KEY, name TEXT)")
    with pytest.raises(StoreError, match="written by another RollMux version"):
        Store(f"sqlite:///{tmp_path / 'old.db'}")
