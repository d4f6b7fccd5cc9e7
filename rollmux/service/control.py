"""The one control plane: the core's state machine, made durable, waited on without
threads, and carried out on Ray.

Every operation changes the core's :class:`ControlState` on the event loop (no locks: one
thread mutates), drains the rows it changed into the journal and answers only once they
are committed. Waiting for a turn is an ``asyncio`` event, not a thread, so a thousand
waiting jobs cost nothing. Three background tasks keep the live system in line with the
state: leases (lost sessions are revoked, managed jobs restarted; jobs seated without a
session past their grace stop holding nodes), capacity (what Ray offers; queued jobs are
admitted as it frees) and reconciliation (the executor provisions the nodes the state holds
and starts the drivers of placed jobs, each once its restart back-off is over).

A failure of the platform under a managed job — its nodes' workers did not come up, its
driver could not be started, its driver's process or a worker died (Ray's memory monitor
kills them under memory pressure) — loses the job and restarts it, counted against its
``max_restarts``, never fails it outright; only the job's own code failing (its driver
reports the error) ends it ``failed``. Every task started here is observed
(:mod:`rollmux.wire.tasks`): an exception is logged with the job and what was being done,
and handled.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import itertools
import logging
import math
import os
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from rollmux.core.cluster import Cluster
from rollmux.core.control import (
    CANCELLED,
    DONE,
    ENDED_STATES,
    FAILED,
    LIVE_STATES,
    LOST,
    PLACED,
    RUNNING,
    SESSION_STATES,
    Capacity,
    ControlState,
    Grant,
    Job,
    JobRecord,
    PhaseTiming,
)
from rollmux.core.errors import JobEnded, JobExists, RollMuxError, UnknownJob
from rollmux.core.placement import make_policy
from rollmux.core.regroup import RegroupConfig, RegroupPlan, RegroupState, new_node_pools, plan_regroup
from rollmux.core.replicas import plan_buddies
from rollmux.core.roundrobin import ROLLOUT, TRAIN
from rollmux.core.spec import DEFAULT_PLANNING, CostModel, Planning, Pool
from rollmux.inputs.runfile import JobSubmission
from rollmux.service.journal import Journal
from rollmux.service.store import Store
from rollmux.wire.failpoints import failpoint
from rollmux.wire.tasks import abandon, describe, install_dumps, spawn, wait_event

log = logging.getLogger("rollmux.control")
NODES_PATIENCE_S = 20.0
"""After this long without its nodes, a placed job says it is waiting for Ray."""
RESERVATION_GRACES = 10
"""However busy Ray is readying other nodes, a launch waits for its own at most this many
lost graces in all: then it is lost and restarted (counted) like any other."""
ROUND_LOG = 10_000
"""Regrouping rounds whose timing is kept in memory (the oldest are dropped first)."""


@dataclass(frozen=True)
class RoundTiming:
    """One regrouping round's wall times: ``plan_s`` from its snapshot to its plan,
    ``ready_s`` readying its new nodes until its moves start, or until it is dropped because
    its groups changed meanwhile (0 without a plan to carry out). The
    virtual clock replaying a live run takes each round's (``rollmux replay``), as it takes
    each phase's; kept in memory only, for they are measurements, not state."""

    id: int
    taken_at: float
    plan_s: float
    ready_s: float
    moves: int


class Executor(Protocol):
    """What carries the control plane's decisions out: nodes and job drivers (Ray)."""

    async def capacity(self) -> Capacity | None:
        """Nodes per pool the cluster offers now (None: unknown, keep the last)."""
        ...

    async def sync_nodes(self, nodes: dict[int, Pool]) -> None:
        """Provision the nodes not provisioned yet, release those no longer held."""
        ...

    async def name_buddies(self, buddies: dict[str, str]) -> None:
        """Tell the jobs with replicas where to keep them: job → ``Buddy.key`` (a job left
        out keeps none)."""
        ...

    async def wait_nodes(self, nodes: tuple[int, ...]) -> None:
        """Return once these nodes are reserved and their workers are up."""
        ...

    def nodes_readied(self) -> int:
        """Nodes readied since it started: the platform's progress, which a launch waiting
        for its own nodes watches (a busy cluster readies them slowly, a hung one never)."""
        ...

    async def transfer(self, job: str, epoch: int, pairs: list[tuple[str, int, int]]) -> int:
        """Carry a moving job's roles (phase, old node, new node) to their new nodes; its bytes."""
        ...

    async def start_driver(self, job: str, incarnation: int) -> None:
        """Start the job's driver (stopping any older one of the same job)."""
        ...

    async def driver_alive(self, job: str, incarnation: int) -> bool: ...

    async def driver_ended(self, job: str, incarnation: int) -> str:
        """Return once the driver started by :meth:`start_driver` is gone, saying how."""
        ...

    async def stop_driver(self, job: str, incarnation: int) -> None:
        """Stop the job's driver and drop its roles from every worker."""
        ...

    async def warm_up(self) -> None:
        """Start the processes kept ahead of need and return once they answer."""
        ...

    async def close(self) -> None: ...


class NoExecutor:
    """The control plane without Ray: it places and grants, and every job runs itself."""

    async def capacity(self) -> Capacity | None:
        return None

    async def sync_nodes(self, nodes: dict[int, Pool]) -> None:
        return None

    async def name_buddies(self, buddies: dict[str, str]) -> None:
        return None

    async def wait_nodes(self, nodes: tuple[int, ...]) -> None:
        return None

    def nodes_readied(self) -> int:
        return 0

    async def transfer(self, job: str, epoch: int, pairs: list[tuple[str, int, int]]) -> int:
        return 0  # jobs that run their own workers follow their grants' nodes

    async def start_driver(self, job: str, incarnation: int) -> None:
        raise RollMuxError("this control plane runs without Ray: it cannot start job drivers")

    async def driver_alive(self, job: str, incarnation: int) -> bool:
        return False

    async def driver_ended(self, job: str, incarnation: int) -> str:
        return "no driver"

    async def stop_driver(self, job: str, incarnation: int) -> None:
        return None

    async def warm_up(self) -> None:
        return None

    async def close(self) -> None:
        return None


@dataclass(frozen=True)
class ControlOptions:
    policy: str = "rollmux"
    planning: Planning = DEFAULT_PLANNING
    cost: CostModel = field(default_factory=CostModel)
    lease_s: float = 10.0
    lost_grace_s: float | None = None
    """How long a job may sit seated without a session (None: ``default_lost_grace``)."""
    capacity: Capacity = field(default_factory=Capacity)
    """Static capacity, used when the executor does not report one (no Ray)."""
    checkpoint_dir: Path = Path("checkpoints")
    capacity_poll_s: float = 5.0
    runs_jobs: bool = False
    """True when an executor can start drivers (managed jobs are accepted)."""
    regroup: RegroupConfig | None = None
    """Re-place running jobs after arrivals and departures when it pays (None: never)."""
    slo_guard: bool = True
    """Move a job out of a group whose measured phase times break an SLO."""
    regroup_poll_s: float = 0.2
    """How often the SLO guard runs and a plan not carried out is planned again; arrivals,
    starts and departures start a round sooner (see ``regroup_settle_s``)."""
    regroup_settle_s: float = 0.2
    """A round starts this long after the last of a burst of events, not at each of them: a
    round planned between two departures of the same instant moved jobs about to leave."""


class ControlPlane:
    def __init__(
        self,
        store: Store,
        options: ControlOptions,
        executor: Executor | None = None,
        clock: Callable[[], float] | None = None,
    ):
        self.store = store
        self.options = options
        self.executor = executor or NoExecutor()
        self.clock = clock or steady_wall_clock()
        self.state = ControlState.restore(
            store.load(),
            options.cost,
            options.planning,
            make_policy(options.policy),
            self.clock(),
            options.lease_s,
            options.capacity,
            options.lost_grace_s,
        )
        self.journal = Journal(store, self._fail_stop)
        self.waiters: dict[str, asyncio.Event] = {}
        self.last_metrics: dict[str, dict[str, float]] = {}
        self.buddies: dict[str, str] = {}
        """Where each job with replicas keeps its trainer's copy (``Buddy.key``), as last
        written for the workers."""
        self.launched: dict[str, int] = {}
        self.accepted = 0
        self.ready = False
        self._changed: asyncio.Event | None = None
        self._regroup_now: asyncio.Event | None = None
        """Set by an arrival, start or departure: the next regrouping round runs at once
        (a placed job's driver waits for it), not at the next poll."""
        self._tasks: list[asyncio.Task] = []
        self._relaunch: tuple[float, asyncio.TimerHandle] | None = None
        """When reconciling runs again for a restart waiting out its back-off, and its timer."""
        self._launches: dict[str, asyncio.Task] = {}
        self._reserving: dict[str, asyncio.Future] = {}
        """Each job's launch waiting for its nodes: a newer launch gives it up."""
        self._carrying: dict[str, asyncio.Task] = {}
        self._syncing = asyncio.Lock()
        self._regroup_due = options.regroup is not None
        self._regrouping = RegroupState()
        self._round_s = 0.0
        """Wall seconds the last regrouping round took to plan."""
        self._planning_s = 0.0
        """Wall seconds every regrouping round took to plan, all together."""
        self._round_log: deque[RoundTiming] = deque(maxlen=ROUND_LOG)
        self._rounds_planned = 0
        """Regrouping rounds planned since start, those that found nothing to examine too."""
        self._warming: dict[int, Pool] = {}
        """New nodes of a regrouping being readied before it is applied."""
        self._waiting_room = False
        """The last round's plan did not fit the capacity: it is planned again once nodes
        are given back, not at once."""
        self._examined_at = -math.inf
        """When the last regrouping round took its snapshot (see :meth:`_settled`)."""
        self._reseating: frozenset[str] = frozenset()
        """Jobs not started yet that the round being carried out seats elsewhere: they
        wait for it (the others it saw start as soon as it is planned)."""

    # --- life ----------------------------------------------------------------------------

    async def start(self) -> None:
        """Start writing, watching leases and capacity, and recover what the executor lost."""
        self._changed, self._regroup_now = asyncio.Event(), asyncio.Event()
        install_dumps(asyncio.get_running_loop())
        self.journal.start(asyncio.get_running_loop())
        capacity = await self.executor.capacity()
        if capacity is not None:
            self.state.set_capacity(capacity, self.clock())
        await self._recover_drivers()
        await self._persist()
        await self._sync_nodes()
        await self.executor.warm_up()
        self.state.renew_deadlines(self.clock())  # counted from now: no driver could reach it until now
        self._tasks = [
            spawn(self._expire_forever(), "watching leases and graces"),
            spawn(self._reconcile_forever(), "reconciling with the executor"),
            spawn(self._watch_capacity(), "watching the capacity"),
            spawn(self._regroup_forever(), "regrouping"),
        ]
        self._carry(self.state.movable())
        self._changed.set()
        self.ready = True

    async def stop(self) -> None:
        """Stop watching (so drivers stopped now are not taken for lost jobs), give the
        executor's nodes and drivers back, and finish writing."""
        self.ready = False
        if self._relaunch is not None:
            self._relaunch[1].cancel()
        tasks = [*self._tasks, *self._launches.values(), *self._carrying.values()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.executor.close()
        self.journal.stop()

    def _fail_stop(self, error: BaseException) -> None:
        """A commit failed: memory may be ahead of the database, so the process ends and a
        restart rebuilds the committed state (nothing acknowledged is lost)."""
        log.critical("store commit failed (%s): stopping so that a restart resumes from the database", error)
        os._exit(70)

    # --- jobs ----------------------------------------------------------------------------

    async def submit(self, jobs: list[JobSubmission]) -> tuple[list[dict[str, Any]], bool]:
        """Accept jobs in one transaction (each placed now or queued). Resubmitting an
        identical job answers with it; a different job under a used name is refused.
        Returns the views and whether anything new was accepted."""
        known = await asyncio.to_thread(self.store.named, [job.name for job in jobs])
        fresh = []
        for job in jobs:
            existing = self.state.jobs.get(job.name) or (known[job.name].job if job.name in known else None)
            program = existing.program if existing else None
            if program is None:
                fresh.append(job)
            elif program != job.program():
                raise JobExists(f"a job named {job.name!r} was already submitted with another spec")
        for job in fresh:
            self._refuse_unrunnable(job)
            self.state.validate(job.spec())
        now = self.clock()
        for job in fresh:
            self.state.submit(job.spec(), job.program(), now, job.priority, job.max_restarts)
        self.accepted += len(fresh)
        await self._persist()
        return [await self.view(job.name) for job in jobs], bool(fresh)

    def _refuse_unrunnable(self, job: JobSubmission) -> None:
        """Refuse what nothing here could ever run (an external job is placed and labelled
        instead: its owner runs it)."""
        if job.managed and not self.options.runs_jobs:
            raise RollMuxError(
                f"job {job.name}: this control plane runs without Ray and cannot run a {job.kind} job; "
                "submit it as kind 'external' and drive it through the API, or start `rollmux serve` with Ray"
            )

    async def cancel(self, name: str) -> dict[str, Any]:
        await self._live(name)
        self.state.end(name, CANCELLED, self.clock(), "cancelled")
        await self._persist()
        return await self.view(name)

    # --- sessions and phases ---------------------------------------------------------------

    async def begin_session(self, name: str, driver: str) -> dict[str, Any]:
        """A new incarnation of the job (its ``driver`` process, for the events): epoch,
        lease, seat, program and checkpoint path. An unseated job re-enters admission; if it
        must wait for room, that is committed and the call refused saying so."""
        await self._live(name)
        try:
            job = self.state.begin_session(name, self.clock(), driver)
        finally:
            await self._persist()
        seat = self.state.seat(name)
        return {
            "epoch": job.epoch,
            "iteration": job.iteration,
            "lease_s": self.options.lease_s,
            "rollout_nodes": list(seat.rollout_nodes) if seat else [],
            "train_nodes": list(seat.train_nodes) if seat else [],
            "program": job.program,
            "checkpoint": str(self.options.checkpoint_dir / f"{name}.pt"),
        }

    async def activate(
        self, name: str, epoch: int, iteration: int | None, restored: str | None = None
    ) -> dict[str, Any]:
        await self._live(name)
        self.state.activate(name, epoch, iteration, self.clock(), restored)
        await self._persist()
        return await self.view(name)

    async def heartbeat(self, name: str, epoch: int) -> dict[str, Any]:
        await self._live(name)
        job = self.state.heartbeat(name, epoch, self.clock())
        return {"epoch": job.epoch, "lease_until": job.lease_until}

    async def acquire(self, name: str, phase: str, epoch: int, wait_s: float) -> Grant | None:
        """The grant once the job's turn comes, or None after ``wait_s`` (ask again: the
        grant, once made, stays the job's until it releases it or its lease expires)."""
        await self._live(name)
        return await self._acquire(name, phase, epoch, wait_s)

    async def release(
        self,
        name: str,
        phase: str,
        epoch: int,
        token: int,
        timing: PhaseTiming,
        then_wait_s: float | None = None,
        progress: tuple[int, dict[str, float]] | None = None,
    ) -> Grant | None:
        """Hand the phase back, then record the metrics (iteration, metrics) reported during
        it (a release refused records none); with ``then_wait_s``, ask for the job's next
        phase in the same call (one round trip and one commit per phase switch for jobs
        that go straight on)."""
        await self._live(name)
        self.state.release(name, phase, epoch, token, timing, self.clock())
        if progress is not None:
            self._record_progress(name, epoch, *progress)
        if then_wait_s is None:
            await self._persist()
            return None
        return await self._acquire(name, ROLLOUT if phase == TRAIN else TRAIN, epoch, then_wait_s)

    async def shed(self, name: str, phase: str, epoch: int, token: int, keep: list[int]) -> Grant:
        """An elastic rollout gives back its nodes but ``keep``; durable before it answers,
        like a grant, so the nodes' next holders never run beside a shed the store lost."""
        await self._live(name)
        grant = self.state.shed(name, phase, epoch, token, keep, self.clock())
        await self._persist()
        await self.journal.barrier()
        return grant

    async def _acquire(self, name: str, phase: str, epoch: int, wait_s: float) -> Grant | None:
        grant = self.state.acquire(name, phase, epoch, self.clock())
        await self._persist()
        if grant is None:
            # Granted while this call committed? Another call's commit may have woken the
            # job before it waited here, and that wake is gone: it would wait out its poll.
            grant = self._held(name, phase, epoch)
        if grant is None and wait_s > 0:
            waiter = self.waiters.setdefault(name, asyncio.Event())
            await wait_event(waiter, min(wait_s, self.options.lease_s / 2))
            grant = self._held(name, phase, epoch)
        if grant is not None:
            await self.journal.barrier()
        return grant

    def _held(self, name: str, phase: str, epoch: int) -> Grant | None:
        """The job's grant of ``phase`` in this incarnation, if it holds one."""
        job = self.state.jobs.get(name)
        held = job.grant if job is not None and job.epoch == epoch else None
        return held if held is not None and held.phase == phase else None

    async def report(self, name: str, epoch: int, iteration: int, metrics: dict[str, float]) -> None:
        await self._live(name)
        self._record_progress(name, epoch, iteration, metrics)
        await self._persist()

    def _record_progress(self, name: str, epoch: int, iteration: int, metrics: dict[str, float]) -> None:
        self.state.report(name, epoch, iteration, metrics, self.clock())
        self.last_metrics[name] = dict(metrics)

    async def complete(self, name: str, epoch: int, error: str) -> dict[str, Any]:
        """The job's driver ends it: done, or failed with ``error``. Answered again if retried."""
        if name in self.state.jobs:
            self.state.end_session(name, epoch, FAILED if error else DONE, self.clock(), error)
            await self._persist()
        return await self.view(name)

    # --- views ---------------------------------------------------------------------------

    async def view(self, name: str) -> dict[str, Any]:
        job = self.state.jobs.get(name)
        if job is not None:
            return self._live_view(job)
        record = await asyncio.to_thread(self.store.job, name)
        if record is None:
            raise UnknownJob(f"no job named {name!r}")
        return _record_view(record)

    async def list_jobs(self, states: list[str], after: int, limit: int) -> dict[str, Any]:
        page = await asyncio.to_thread(self.store.jobs, states, after, limit)
        views = [
            self._live_view(self.state.jobs[r.job.name]) if r.job.name in self.state.jobs else _record_view(r)
            for r in page.records
        ]
        return {"jobs": views, "next_cursor": page.next_cursor}

    def _live_view(self, job: Job) -> dict[str, Any]:
        """The stored view of the job, with what only memory knows: its planned slowdown,
        the phase it holds, its last metrics and its cost so far."""
        view = _record_view(self.state.record(job.name))
        if job.name in self.state.cluster.job_group:
            view["slowdown"] = self.state.cluster.group_of(job.name).slowdowns().get(job.name)
        view["phase"] = job.grant.phase if job.grant else None
        if job.program.get("replicas"):
            view["buddy"] = self.buddies.get(job.name)
        view["metrics"] = self.last_metrics.get(job.name)
        view["cost_usd"] = self.state.cost_so_far(job, self.clock())
        view["lost_grace_s"] = self.state.lost_grace_s
        return view

    async def _read_committed(self, read: Callable[..., Any], *args: Any) -> Any:
        """Read a store-backed log once every change already made in memory is committed: a
        client that saw a job's new state (answered from memory) then reads its log must find
        the entries behind that state there, not an older page."""
        await self._persist()
        return await asyncio.to_thread(read, *args)

    async def phase_log(self, name: str | None, after: int = -1, limit: int | None = None) -> list[dict[str, Any]]:
        return await self._read_committed(self.store.phases, name, after, limit)

    async def node_log(self, after: int, limit: int) -> list[dict[str, Any]]:
        return await self._read_committed(self.store.node_log, after, limit)

    async def events(self, name: str) -> list[dict[str, Any]]:
        return await self._read_committed(self.store.events, name)

    async def metrics(self, name: str) -> list[dict[str, float]]:
        return await self._read_committed(self.store.metrics, name)

    def groups(self) -> list[dict[str, Any]]:
        cluster = self.state.cluster
        out = []
        for g in cluster.groups.values():
            slow = g.slowdowns()
            out.append(
                {
                    "id": g.id,
                    "rollout_nodes": list(g.rollout_nodes),
                    "train_nodes": list(g.train_nodes),
                    "cycle_s": g.schedule.cycle,
                    "t1_s": g.schedule.t1,
                    "t2_s": g.schedule.t2,
                    "jobs": [{"name": m.job.name, "slowdown": slow[m.job.name], "slo": m.job.slo} for m in g.members],
                }
            )
        return out

    def nodes(self) -> list[dict[str, Any]]:
        cluster = self.state.cluster
        out = []
        for g in cluster.groups.values():
            turns = self.state.turns.get(g.id)
            for node in (*g.rollout_nodes, *g.train_nodes):
                pool = cluster.node_pool[node]
                out.append(
                    {
                        "id": node,
                        "pool": pool.value,
                        "group_id": g.id,
                        "holder": turns.holder.get(node) if turns else None,
                        "busy_fraction": g.schedule.busy_fraction(node),
                        "price_per_hour": cluster.cost.price(pool),
                    }
                )
        return out

    def summary(self) -> dict[str, Any]:
        cluster = self.state.cluster
        busy = {pool: cluster.busy_node_fraction(pool) for pool in Pool}
        total_busy = sum(b for b, _ in busy.values())
        total_nodes = sum(n for _, n in busy.values())
        states = dict.fromkeys(LIVE_STATES, 0)
        for job in self.state.jobs.values():
            states[job.state] += 1
        capacity = self.state.capacity
        return {
            "nodes": {pool.value: cluster.nodes(pool) for pool in Pool},
            "capacity": {pool.value: capacity.limit(pool) for pool in Pool},
            "groups": len(cluster.groups),
            "jobs": states,
            "queued": len(self.state.queue),
            "cost_usd_per_hour": cluster.cost_per_hour(),
            "busy_fraction": {pool.value: (b / n if n else 0.0) for pool, (b, n) in busy.items()},
            "bubble_fraction": 1.0 - total_busy / total_nodes if total_nodes else 0.0,
            "accepted_since_start": self.accepted,
            "commits_since_start": self.journal.commits,
            "regrouping": self._regrouping_view(),
        }

    def _regrouping_view(self) -> dict[str, Any]:
        """What regrouping did: rounds, those its budget stopped, its cache, its last round."""
        state = self._regrouping
        return {
            "rounds": state.rounds,
            "rounds_exhausted": state.exhausted_rounds,
            "planning_s": self._planning_s,
            "cached_sets": state.cached,
            "last_round": {**dataclasses.asdict(state.last_round), "seconds": self._round_s},
        }

    # --- internals -----------------------------------------------------------------------

    async def _live(self, name: str) -> None:
        """Raise JobEnded for a job that ended, UnknownJob for one never submitted."""
        if name in self.state.jobs:
            return
        record = await asyncio.to_thread(self.store.job, name)
        if record is None:
            raise UnknownJob(f"no job named {name!r}")
        raise JobEnded(f"job {name!r} already ended ({record.job.state})")

    async def _persist(self) -> None:
        """Commit what changed; wake the jobs granted a turn once that is durable."""
        delta = self.state.drain()
        if not delta:
            await self.journal.barrier()
            return
        waking = set(delta.wake)
        for name, record in delta.jobs.items():
            if record.job.state != RUNNING:
                waking.add(name)
            if record.job.state in ENDED_STATES:
                self.last_metrics.pop(name, None)
        await self.journal.submit(delta)
        if (delta.jobs or delta.groups) and self._changed is not None:
            self._changed.set()
        if delta.asks_for_round():
            self._regroup_due = self.options.regroup is not None
            if self._regroup_now is not None:
                self._regroup_now.set()
        if self._waiting_room and any(not entry.held for entry in delta.nodes):
            # Nodes given back: the round that waited for room is planned again now (after
            # the settle delay, as the virtual clock does), not at the next poll.
            self._waiting_room, self._regroup_due = False, self.options.regroup is not None
            if self._regroup_now is not None:
                self._regroup_now.set()
        self._carry(delta.movable)
        for name in waking:
            waiter = self.waiters.pop(name, None)
            if waiter is not None:
                waiter.set()

    async def _expire_forever(self) -> None:
        tick = min(0.25, self.options.lease_s / 10)
        while True:
            await asyncio.sleep(tick)
            try:
                await self._expire_once()
            except Exception:  # noqa: BLE001 - the next tick tries again: leases must keep being watched
                log.exception("checking leases and graces failed; retrying at the next tick")

    async def _expire_once(self) -> None:
        """Lose expired sessions, restart the managed jobs among them, unseat jobs idle past
        their grace; commit."""
        now = self.clock()
        lost = self.state.expire(now)
        for name in lost:
            self._after_loss(name, now)
        await self._persist()

    async def _lose(self, name: str, reason: str) -> None:
        """The job's session is gone for ``reason``: lost now (not a lease later), restarted
        if RollMux runs it, and committed."""
        now = self.clock()
        self.state.lose(name, now, reason)
        self._after_loss(name, now)
        await self._persist()

    def _after_loss(self, name: str, now: float) -> None:
        """A managed job is restarted (if it has restarts left); an external one waits for
        its owner to begin a new session."""
        if self.state.jobs[name].managed:
            self.state.restart(name, now)

    async def _recover_drivers(self) -> None:
        """After a restart: managed jobs whose driver did not survive are lost at once
        (not a lease later), and restarted without counting against their restarts."""
        now = self.clock()
        for job in list(self.state.jobs.values()):
            if not job.managed or job.state not in (*SESSION_STATES, LOST):
                continue
            if job.state != LOST and await self.executor.driver_alive(job.name, job.launch):
                self.launched[job.name] = job.launch
                self.state.claim(job.name)
                continue
            if job.state != LOST:
                self.state.lose(job.name, now, "its driver did not survive the control plane's restart")
            self.state.restart(job.name, now, counted=False)

    async def _reconcile_forever(self) -> None:
        assert self._changed is not None
        while True:
            await self._changed.wait()
            self._changed.clear()
            try:
                await self._reconcile()
            except Exception:
                log.exception("reconciling with the executor failed; retrying")
                await asyncio.sleep(1.0)
                self._changed.set()

    async def _reconcile(self) -> None:
        """Provision the nodes the state holds, start drivers of placed managed jobs (once
        their restart back-off is over), stop drivers of jobs that ended."""
        synced = await self._sync_nodes()
        now = self.clock()
        for job in list(self.state.jobs.values()):
            if not (job.managed and job.state == PLACED and self.launched.get(job.name) != job.launch):
                continue
            if not self._provisioned(job.name, synced):
                continue  # placed while the nodes were synced: the next round (its placement woke it) starts it
            if job.backing_off(now):
                self._reconcile_at(job.restart_at)
            elif self._settled(job):
                self._start_launch(job)
        for name in [n for n in self.launched if n not in self.state.jobs]:
            await self.executor.stop_driver(name, self.launched.pop(name))

    def _provisioned(self, name: str, synced: dict[int, Pool]) -> bool:
        """Every node of the job's seat was among those the executor was just given."""
        seat = self.state.seat(name)
        return seat is not None and all(n in synced for n in (*seat.rollout_nodes, *seat.train_nodes))

    def _start_launch(self, job: Job) -> None:
        """Launch this incarnation of the job; a launch of an older one still waiting for
        nodes that never came is given up (any other sees it is superseded and stops)."""
        self.launched[job.name] = job.launch
        self.state.claim(job.name)
        older = self._reserving.pop(job.name, None)
        if older is not None:
            older.cancel()
        name, incarnation = job.name, job.launch
        task = spawn(
            self._launch(name, incarnation),
            f"launching job {name} (incarnation {incarnation})",
            lambda error: self._launch_failed(name, incarnation, error),
        )
        self._launches[name] = task
        task.add_done_callback(lambda done: self._forget_launch(name, done))

    def _reconcile_at(self, at: float) -> None:
        """Reconcile again at ``at`` (one timer, for the earliest such time)."""
        if self._relaunch is not None and self._relaunch[0] <= at:
            return
        if self._relaunch is not None:
            self._relaunch[1].cancel()
        loop = asyncio.get_running_loop()
        self._relaunch = (at, loop.call_later(max(at - self.clock(), 0.0), self._reconcile_now))

    def _reconcile_now(self) -> None:
        self._relaunch = None
        if self._changed is not None:
            self._changed.set()

    def _forget_launch(self, name: str, task: asyncio.Task) -> None:
        if self._launches.get(name) is task:
            del self._launches[name]

    async def _launch(self, name: str, incarnation: int) -> None:
        """Ready the job's nodes, start its driver and watch it end. What fails on the way
        is the platform's (the job's code has not run, or its driver died without saying
        why): the job is lost and restarted, counted."""
        seat = self.state.seat(name)
        if seat is None:
            return
        nodes = (*seat.rollout_nodes, *seat.train_nodes)
        reserved = self._reserving[name] = asyncio.ensure_future(self.executor.wait_nodes(nodes))
        try:
            await self._await_reservation(name, incarnation, nodes, reserved)
        except KeyError:
            if self._current(name, incarnation, (PLACED,)) and self._changed is not None:
                self.launched.pop(name, None)  # its nodes are not provisioned yet: the next round starts it
                self._changed.set()
            return  # else its nodes were released meanwhile: it ended before it could start
        except Exception as error:  # noqa: BLE001 - a node's new worker died too: try again, counted
            log.warning("nodes of %s are not ready: %s", name, describe(error))
            await self._platform_failed(name, incarnation, f"its nodes did not come up: {describe(error)}")
            return
        finally:
            if self._reserving.get(name) is reserved:
                del self._reserving[name]
            abandon(reserved)  # cancelled with the launch (stop, or a newer launch): nobody waits for it
        if not self._current(name, incarnation, (PLACED,)):
            return
        self.state.launching(name, self.clock())
        try:
            await self.executor.start_driver(name, incarnation)
        except Exception as error:  # noqa: BLE001 - nothing of the job ran yet: the platform's failure
            log.warning("driver of %s did not start: %s", name, describe(error))
            await self._platform_failed(name, incarnation, f"its driver did not start: {describe(error)}")
            return
        if self._current(name, incarnation, (PLACED,)):
            self.state.launching(name, self.clock())
        outcome = await self.executor.driver_ended(name, incarnation)
        # Its driver is gone without ending the job (process killed, crashed before its
        # session, gave up on an unreachable control plane): no need to wait for a lease.
        await self._platform_failed(name, incarnation, f"its driver ended: {outcome}")

    async def _await_reservation(
        self, name: str, incarnation: int, nodes: tuple[int, ...], reserved: asyncio.Future
    ) -> None:
        """Wait for the job's nodes. Past ``NODES_PATIENCE_S`` the job says it waits for Ray,
        and each time Ray has readied other nodes meanwhile its grace starts again: a burst
        of placements on a busy cluster readies nodes one after the other, and a job that
        waited its turn there is not lost and restarted (a window of the production trace
        lost 28 of 45 jobs so). A platform that readies nothing for a whole grace still
        loses it, and so does one that has not readied its nodes within
        ``RESERVATION_GRACES`` graces in all."""
        readied = self.executor.nodes_readied()
        limit = self.clock() + RESERVATION_GRACES * self.state.lost_grace_s
        while not (await asyncio.wait({reserved}, timeout=NODES_PATIENCE_S))[0]:
            if not self._current(name, incarnation, (PLACED,)):
                break
            self.state.explain(name, f"waiting for Ray to reserve node(s) {', '.join(map(str, nodes))}")
            if self.executor.nodes_readied() > readied and self.clock() < limit:
                readied = self.executor.nodes_readied()
                self.state.launching(name, self.clock())
            await self._persist()
        await reserved

    async def _launch_failed(self, name: str, incarnation: int, error: BaseException) -> None:
        """A launch raised what it does not expect (a bug, or Ray failing in a new way): the
        job is not left placed with nobody starting it."""
        await self._platform_failed(name, incarnation, f"its launch failed: {describe(error)}")

    def _current(self, name: str, incarnation: int, states: tuple[str, ...]) -> bool:
        """The job is live, in one of ``states``, and this incarnation is still its own."""
        job = self.state.jobs.get(name)
        return job is not None and job.launch == incarnation and job.state in states

    async def _platform_failed(self, name: str, incarnation: int, reason: str) -> None:
        """Lose and restart (counted) the job if that incarnation is still its own and has
        not ended it."""
        if self._current(name, incarnation, (PLACED, *SESSION_STATES)):
            await self._lose(name, reason)

    # --- moving running jobs ----------------------------------------------------------------

    async def _regroup_forever(self) -> None:
        assert self._regroup_now is not None
        while True:
            await wait_event(self._regroup_now, self.options.regroup_poll_s)
            while self._regroup_now.is_set():
                # Events of one instant come as several requests (a window's departures):
                # planned once they have all landed, as the simulator regroups once after them.
                self._regroup_now.clear()
                await asyncio.sleep(self.options.regroup_settle_s)
            try:
                await self._regroup_once()
            except Exception:
                log.exception("regrouping failed; retrying at the next event")
                self._regroup_due = False
                self._examined(self.clock())  # placed jobs start where they are

    async def _regroup_once(self) -> None:
        """After arrivals, departures and job starts, the core's regrouping over the settled
        groups, on a copy (in a thread: the event loop keeps granting); its new nodes are
        readied while the jobs go on where they are, then it is applied if the groups it
        moves jobs out of did not change meanwhile. The SLO guard on every tick."""
        moved: list[str] = []
        if self.options.slo_guard:
            moved += self.state.guard(self.clock())
        config = self.options.regroup
        if config is not None and self._regroup_due and not moved:
            # Cleared before planning: an event that lands while the plan is made (in a
            # thread) asks for another round instead of being lost with this one's answer.
            self._regroup_due, self._waiting_room = False, False
            taken = self.clock()
            snapshot, view = copy.deepcopy(self.state.cluster), self.state.movable_view()
            progress = self.state.progress(view, taken)
            plan = await asyncio.to_thread(plan_regroup, view, config, self._regrouping, progress)
            self._round_s = self.clock() - taken
            self._planning_s += self._round_s
            if self._regrouping.last_round.exhausted:
                log.info(
                    "regrouping round stopped on its work budget, kept its best plan: %s", self._regrouping.last_round
                )
            movers = [self.state.jobs.get(spec.name) for spec in plan.moved] if plan is not None else []
            self._reseating = frozenset(job.name for job in movers if job is not None and job.unstarted)
            self._examined(taken)  # before its new nodes are readied: that may take Ray many seconds
            planned, started, readying = self.clock(), list[str](), False
            try:
                if plan is not None and self.state.still_movable(plan, snapshot):
                    readying = True
                    started = await self._start_readied(plan, snapshot)
            finally:
                self._reseating = frozenset()
                self._examined(taken)
                self._log_round(taken, self.clock() - planned if readying else 0.0, len(started))
            moved += started
            if plan is not None and not moved and not self._waiting_room:
                self._regroup_due = True  # not carried out: planned again (its groups are re-examined)
        if moved:
            log.info("moving %s", ", ".join(moved))
            await self._persist()

    def _log_round(self, taken: float, ready_s: float, moves: int) -> None:
        self._rounds_planned += 1
        self._round_log.append(RoundTiming(self._rounds_planned, taken, self._round_s, ready_s, moves))

    def rounds(self, after: int, limit: int) -> list[dict[str, Any]]:
        """The kept regrouping rounds' timings, in order (after round ``after``)."""
        kept = (r for r in self._round_log if r.id > after)
        return [dataclasses.asdict(r) for r in itertools.islice(kept, limit)]

    def _examined(self, taken: float) -> None:
        """Jobs placed before ``taken`` were offered to a regrouping: their drivers may start
        (one placed later waits for the next round, which may re-seat it for free, as the
        simulator regroups an arriving job at once)."""
        waiting = any(job.unstarted and not self._settled(job) for job in self.state.jobs.values())
        self._examined_at = taken
        for job in list(self.state.jobs.values()):
            if job.managed and job.unstarted and self._settled(job):
                # Its seat is final now, not once reconciling reaches it (Ray may take
                # seconds to sync nodes): a later round moves it only once it runs, as
                # under the virtual clock.
                self.state.claim(job.name)
        if waiting and self._changed is not None:
            self._changed.set()  # reconcile only when a placed job may start now

    def _settled(self, job: Job) -> bool:
        """The job may start: regrouping is off, or a round has seen it placed and does not
        seat it elsewhere."""
        if self.options.regroup is None or not job.unstarted:
            return True
        return job.seen_by_round(self._examined_at) and job.name not in self._reseating

    async def _start_readied(self, plan: RegroupPlan, snapshot: Cluster) -> list[str]:
        """Ready the plan's new nodes (placement groups, workers) on ids set aside for them
        before its jobs stop, so a move pauses a job only for its state's transfer; then
        start the moves, if the plan's groups did not change meanwhile."""
        pools = new_node_pools(snapshot, plan)
        short = self.state.shortfall(pools)
        if short:
            # Its jobs would stop at their boundaries and wait for nodes only moves free:
            # planned again once nodes are given back.
            log.info("regrouping waits: %s", short)
            self._waiting_room = True
            return []
        first = self.state.reserve_node_ids(len(pools))
        ids = range(first, first + len(pools))
        self._warming = dict(zip(ids, pools, strict=True))
        ready: asyncio.Future | None = None
        try:
            await self._persist()
            await self._sync_nodes()
            failpoint("regroup:readying")
            ready = asyncio.ensure_future(self.executor.wait_nodes(tuple(ids)))
            done, _ = await asyncio.wait({ready}, timeout=NODES_PATIENCE_S)
            if done and ready.exception() is not None:
                log.warning("the new nodes of a regrouping did not come up: %s", describe(ready.exception()))
                return []
            if not self.state.still_movable(plan, snapshot):
                return []
            return self.state.start_regroup(plan, self.clock(), ids)
        finally:
            self._warming = {}
            if ready is not None:
                abandon(ready)  # still readying (Ray slow, or shutting down): the moves' carriers wait

    def _carry(self, names: Iterable[str]) -> None:
        """Carry over the state of moving jobs that reached their phase boundary."""
        for name in names:
            if name not in self._carrying:
                task = spawn(
                    self._carry_one(name),
                    f"carrying job {name}'s state to its new nodes",
                    lambda error, name=name: self._carry_failed(name, error),
                )
                self._carrying[name] = task
                task.add_done_callback(lambda _, name=name: self._carrying.pop(name, None))

    async def _carry_failed(self, name: str, error: BaseException) -> None:
        """A carrier raised what it does not expect: the job is not left half-moved."""
        job = self.state.jobs.get(name)
        if job is not None and job.move is not None:
            await self._lose(name, f"its move failed: {describe(error)}")

    async def _carry_one(self, name: str) -> None:
        job = self.state.jobs.get(name)
        seat = self.state.seat(name)
        if job is None or job.move is None or seat is None:
            return
        move, epoch = job.move, job.epoch
        pairs = [
            *((ROLLOUT, old, new) for old, new in zip(move.rollout_from, seat.rollout_nodes, strict=True)),
            *((TRAIN, old, new) for old, new in zip(move.train_from, seat.train_nodes, strict=True)),
        ]
        failpoint("move:before-transfer")
        try:
            await self._sync_nodes()
            moved = await self.executor.transfer(name, epoch, pairs) if job.managed else 0
        except Exception as error:  # noqa: BLE001 - whatever broke, the job's state did not land
            job = self.state.jobs.get(name)
            if job is None or job.move != move or job.epoch != epoch:
                log.info("the move of %s ended with it (cancelled or restarted meanwhile): %s", name, error)
                return
            log.warning("moving %s failed: %s", name, error)
            await self._lose(name, f"its state did not reach its new nodes: {error}")
            return
        failpoint("move:after-transfer")
        if self.state.finish_move(name, epoch, move.decided_at, moved, self.clock()):
            await self._persist()

    async def _sync_nodes(self) -> dict[int, Pool]:
        """Provision the nodes of the groups and keep those draining; release the rest. One
        at a time, each with the nodes held when it runs (an older list would release a
        node placed meanwhile). Returns the nodes it provisioned: a job placed while it ran
        may have nodes the executor does not know yet."""
        async with self._syncing:
            held = {**self._warming, **self.state.draining(), **self.state.cluster.node_pool}
            await self.executor.sync_nodes(held)
            self.buddies = self._buddies()
            await self.executor.name_buddies(self.buddies)
            return held

    def _buddies(self) -> dict[str, str]:
        """Where each job with replicas keeps its trainer's copy: the core's buddy plan
        (the simulator charges failures with the same one)."""
        replicated = [name for name, job in self.state.jobs.items() if job.program.get("replicas")]
        plan = plan_buddies(self.state.cluster, replicated, self.state.capacity.standby)
        return {job: buddy.key for job, buddy in plan.buddies.items()}

    def roles_at(self, name: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """The rollout and training nodes the job's roles are on: its old seat while it is
        moving (it is granted phases there only), else its seat."""
        job = self.state.jobs.get(name)
        if job is not None and job.move is not None:
            return job.move.rollout_from, job.move.train_from
        seat = self.state.seat(name)
        return (seat.rollout_nodes, seat.train_nodes) if seat else ((), ())

    async def moves(self, after: int, limit: int) -> list[dict[str, Any]]:
        return await asyncio.to_thread(self.store.moves, after, limit)

    async def _watch_capacity(self) -> None:
        while True:
            await asyncio.sleep(self.options.capacity_poll_s)
            try:
                capacity = await self.executor.capacity()
                if capacity is not None and capacity != self.state.capacity:
                    self.state.set_capacity(capacity, self.clock())
                    await self._persist()
            except Exception:  # noqa: BLE001 - Ray busy or restarting: the next poll asks again
                log.exception("reading the capacity failed; asking again at the next poll")


def steady_wall_clock() -> Callable[[], float]:
    """Wall-clock time that never jumps: the wall time at start plus a monotonic clock's
    progress. Leases measured on it survive an NTP step; logged times stay readable."""
    wall, steady = time.time(), time.monotonic()
    return lambda: wall + (time.monotonic() - steady)


def _record_view(record: JobRecord) -> dict[str, Any]:
    job = record.job
    return {
        "name": job.name,
        "state": job.state,
        "reason": job.reason,
        "kind": job.program.get("kind", "external"),
        "priority": job.priority,
        "group_id": record.group_id,
        "rollout_nodes": list(record.rollout_nodes),
        "train_nodes": list(record.train_nodes),
        "slo": job.spec.slo,
        "slowdown": None,
        "iterations": job.iteration,
        "epoch": job.epoch,
        "restarts": job.restarts,
        "max_restarts": job.max_restarts,
        "restart_at": job.restart_at,
        "unseat_at": job.unseat_at,
        "parked": job.parked,
        "phase": None,
        "metrics": None,
        "cost_usd": job.cost_usd,
        "submitted_at": job.submitted_at,
        "ended_at": job.ended_at,
    }
