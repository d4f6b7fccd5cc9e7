"""The durable control plane: the core's ControlState, written through to the store.

Every accepted change happens under one lock: the core decides in memory, the store
commits the whole change in one transaction, and only then is the change acknowledged.
If the commit fails the in-memory change is undone, so memory and database never differ.
A restart rebuilds the same state from the database.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rollmux.core.cluster import Cluster
from rollmux.core.control import ControlState, JobStatus
from rollmux.core.errors import RollMuxError, UnknownJob
from rollmux.core.placement import make_policy
from rollmux.core.spec import DEFAULT_PLANNING, CostModel, JobSpec, Planning, Pool
from rollmux.service.store import LIVE_STATES, Store, StoredJob

HOUR = 3600.0


class JobExists(RollMuxError):
    """A job of that name was already accepted (names are never reused)."""


class JobEnded(RollMuxError):
    """The job is no longer running: it cannot be cancelled."""


class NoCapacity(RollMuxError):
    """The placement needs more nodes of a pool than the cluster offers."""


@dataclass(frozen=True)
class Capacity:
    """How many nodes of each pool the service may hold (None: unbounded)."""

    rollout: int | None = None
    train: int | None = None

    def allows(self, cluster: Cluster) -> Pool | None:
        """The first pool whose limit the cluster exceeds, if any."""
        for pool, limit in ((Pool.ROLLOUT, self.rollout), (Pool.TRAIN, self.train)):
            if limit is not None and cluster.nodes(pool) > limit:
                return pool
        return None


class DurableControl:
    def __init__(
        self,
        store: Store,
        cost: CostModel | None = None,
        planning: Planning = DEFAULT_PLANNING,
        policy: str = "rollmux",
        capacity: Capacity | None = None,
        clock: Callable[[], float] = time.time,
    ):
        self.store = store
        self.capacity = capacity or Capacity()
        self.clock = clock
        self.lock = threading.RLock()
        self.turn_changed = threading.Condition(self.lock)
        self.accepted = 0
        self._load(cost or CostModel(), planning, policy)

    def _load(self, cost: CostModel, planning: Planning, policy: str) -> None:
        """Take the state from the database, the truth after a start, a crash or a failed commit."""
        self.state = ControlState(self.store.load_cluster(cost, planning), make_policy(policy))
        self.names: set[str] = set()
        for job in self.store.jobs():
            self.names.add(job.name)
            if job.state in LIVE_STATES:
                self.state.status[job.name] = JobStatus(state=job.state)

    @property
    def cluster(self) -> Cluster:
        return self.state.cluster

    def submit(self, spec: JobSpec) -> dict[str, Any]:
        """Place and persist a job; returns its view once the transaction has committed."""
        with self.lock:
            if spec.name in self.names:
                raise JobExists(f"a job named {spec.name!r} was already submitted")
            placement = self.state.submit(spec)
            try:
                over = self.capacity.allows(self.cluster)
                if over is not None:
                    raise NoCapacity(f"no free {over.value} node: the cluster offers {self._limit(over)}")
                group = self.cluster.groups[placement.group_id]
                self.store.record_placement(self.state.member(spec.name), group, self.cluster, self.clock())
            except BaseException:
                self.state.undo_submit(spec.name)
                raise
            self.names.add(spec.name)
            self.accepted += 1
        return self.job(spec.name)

    def cancel(self, name: str) -> dict[str, Any]:
        """Stop a live job: it leaves its group, unused nodes are released, all in one commit."""
        return self._end(name, "cancelled")

    def complete(self, name: str) -> dict[str, Any]:
        """The job finished its iterations: it leaves like a cancelled one, marked done."""
        return self._end(name, "done")

    def activate(self, name: str) -> dict[str, Any]:
        """The job's processes are ready: it joins its group's turn-taking."""
        with self.turn_changed:
            self._live(name)
            if self.state.status[name].state != "running" or name not in self._active_jobs():
                self.state.activate(name)
                self.store.set_state(name, "running")
            self.turn_changed.notify_all()
        return self.job(name)

    def acquire(self, name: str, phase: str, wait_s: float) -> tuple[int, ...] | None:
        """The nodes of ``phase`` once the group's round-robin grants it, or None if the
        turn did not come within ``wait_s`` (the caller asks again)."""
        with self.turn_changed:
            self._live(name)
            self.state.check_order(name, phase)
            if not self.turn_changed.wait_for(lambda: self.state.may_start(name, phase), timeout=wait_s):
                return None
            return self.state.start(name, phase)

    def release(self, name: str, phase: str, busy_s: float) -> None:
        """The phase is over: record it, hand its nodes to the next job in turn."""
        with self.turn_changed:
            self._live(name)
            self.state.check_order(name, phase)
            iteration = self.state.status[name].iteration
            member = self.state.member(name)
            nodes = member.rollout_nodes if phase == "rollout" else member.train_nodes
            self.state.finish(name, phase, busy_s)
            if phase == "train":
                self.state.status[name].iteration = iteration + 1
            self.store.record_phase(name, phase, iteration, nodes, busy_s, self.clock())
            self.turn_changed.notify_all()

    def phases(self, name: str) -> list[dict[str, Any]]:
        if self.store.job(name) is None:
            raise UnknownJob(f"no job named {name!r}")
        return self.store.phases(name)

    def _live(self, name: str) -> StoredJob:
        stored = self.store.job(name)
        if stored is None:
            raise UnknownJob(f"no job named {name!r}")
        if stored.state not in LIVE_STATES:
            raise JobEnded(f"job {name!r} already ended ({stored.state})")
        return stored

    def _active_jobs(self) -> set[str]:
        return {job for jobs in self.state.active.values() for job in jobs}

    def _end(self, name: str, state: str) -> dict[str, Any]:
        with self.turn_changed:
            stored = self._live(name)
            cost = self._cost_so_far(stored)
            group_id = self.cluster.group_of(name).id
            removal = self.state.complete(name, state)
            gone = None if group_id in self.cluster.groups else group_id
            try:
                self.store.record_end(name, state, [n for n, _ in removal.released_nodes], gone, self.clock(), cost)
            except BaseException:
                self._load(self.cluster.cost, self.cluster.planning, self.state.policy.name)
                raise
            self.turn_changed.notify_all()
        return self.job(name)

    def job(self, name: str) -> dict[str, Any]:
        stored = self.store.job(name)
        if stored is None:
            raise UnknownJob(f"no job named {name!r}")
        return self._view(stored)

    def jobs(self) -> list[dict[str, Any]]:
        return [self._view(stored) for stored in self.store.jobs()]

    def groups(self) -> list[dict[str, Any]]:
        with self.lock:
            out = []
            for g in self.cluster.groups.values():
                slow = g.slowdowns()
                out.append(
                    {
                        "id": g.id,
                        "rollout_nodes": list(g.rollout_nodes),
                        "train_nodes": list(g.train_nodes),
                        "cycle_s": g.schedule.cycle,
                        "t1_s": g.schedule.t1,
                        "t2_s": g.schedule.t2,
                        "jobs": [
                            {"name": m.job.name, "slowdown": slow[m.job.name], "slo": m.job.slo} for m in g.members
                        ],
                    }
                )
            return out

    def nodes(self) -> list[dict[str, Any]]:
        with self.lock:
            return [
                {
                    "id": node,
                    "pool": pool.value,
                    "group_id": g.id,
                    "busy_fraction": g.schedule.busy_fraction(node),
                    "price_per_hour": self.cluster.cost.price(pool),
                }
                for g in self.cluster.groups.values()
                for node in (*g.rollout_nodes, *g.train_nodes)
                for pool in (self.cluster.node_pool[node],)
            ]

    def summary(self) -> dict[str, Any]:
        with self.lock:
            busy = {pool: self.cluster.busy_node_fraction(pool) for pool in Pool}
            total_busy = sum(b for b, _ in busy.values())
            total_nodes = sum(n for _, n in busy.values())
            states: dict[str, int] = {}
            for status in self.state.status.values():
                states[status.state] = states.get(status.state, 0) + 1
            return {
                "nodes": {pool.value: self.cluster.nodes(pool) for pool in Pool},
                "groups": len(self.cluster.groups),
                "jobs": states,
                "cost_usd_per_hour": self.cluster.cost_per_hour(),
                "busy_fraction": {pool.value: (b / n if n else 0.0) for pool, (b, n) in busy.items()},
                "bubble_fraction": 1.0 - total_busy / total_nodes if total_nodes else 0.0,
                "accepted_since_start": self.accepted,
            }

    def _view(self, stored: StoredJob) -> dict[str, Any]:
        live = stored.state in LIVE_STATES
        with self.lock:
            slowdown = self._slowdown(stored.name) if live else None
            status = self.state.status.get(stored.name)
            cost = self._cost_so_far(stored) if live else stored.cost_usd
        return {
            "name": stored.name,
            "state": status.state if (live and status) else stored.state,
            "group_id": stored.group_id,
            "rollout_nodes": list(stored.rollout_nodes),
            "train_nodes": list(stored.train_nodes),
            "slo": stored.spec.slo,
            "slowdown": slowdown,
            "iterations": status.iteration if status else 0,
            "cost_usd": cost,
            "submitted_at": stored.submitted_at,
            "ended_at": stored.ended_at,
        }

    def _slowdown(self, name: str) -> float | None:
        """The job's planned slowdown, from its own group only (listing stays linear)."""
        if name not in self.cluster.job_group:
            return None
        return self.cluster.group_of(name).slowdowns().get(name)

    def _cost_so_far(self, stored: StoredJob) -> float:
        """Estimate: time since submission × the job's equal share of its group's node price now."""
        if stored.name not in self.cluster.job_group:
            return stored.cost_usd
        group = self.cluster.group_of(stored.name)
        rate = sum(
            self.cluster.cost.price(self.cluster.node_pool[n]) for n in (*group.rollout_nodes, *group.train_nodes)
        )
        return (self.clock() - stored.submitted_at) / HOUR * rate / len(group.members)

    def _limit(self, pool: Pool) -> str:
        limit = self.capacity.rollout if pool is Pool.ROLLOUT else self.capacity.train
        return f"{limit} {pool.value} node(s)"
