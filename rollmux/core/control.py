"""The control plane's state machine: admission, placement, leased sessions and fenced
phase grants in each group's round-robin order.

Pure (no I/O, no clock): every time is an argument. The service is its only host and adds
persistence, HTTP, waiting and Ray. Every change is collected as rows to write
(:meth:`ControlState.drain`), so the store holds a prefix of the changes made here, in
order, and :meth:`ControlState.restore` rebuilds the same state from it.

A job's life: ``pending`` (queued until the cluster has room) → ``placed`` (seated in a
group) → ``starting`` (a session began: a new epoch and a lease) → ``running`` (in its
group's turns) → ``done`` | ``failed`` | ``cancelled``. A running job may be *moved* to
another group (regrouping, or the SLO guard): its seat changes at once, it finishes the
phase it holds on its old nodes, leaves its old group's turns at that phase boundary, and
joins the new group's turns once the service has carried its state over (:class:`Move`). A session whose lease is not
renewed within ``lease_s`` is ``lost``: its grant is revoked, it leaves the turns and the
rest of its group goes on; a new session (the next epoch) brings it back. Every grant
carries the job's epoch and a fencing token that grows with every grant, so calls from an
expired incarnation are refused here and by the workers.

No job keeps nodes it does not use for long: one seated without a session (``placed`` and
never started, or ``lost``) for ``lost_grace_s`` is, if its owner runs it (``external``),
*unseated*: its nodes are released, its cost stops and it is ``pending`` again, but parked
out of the admission queue (re-seating it would bill it again for nothing) until its driver
asks for a session; if RollMux runs it, it is lost and restarted like any lost job, so its
``max_restarts`` bound it. A restart that follows another without the job having run in
between waits an exponential back-off (:func:`restart_delay`): a platform failing over and
over is not hammered, and a job that fails once in a while restarts at once each time.
"""

from __future__ import annotations

import copy
import statistics
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from rollmux.core.cluster import Candidate, Cluster, Group, Member, Removal
from rollmux.core.errors import JobExists, NoCapacity, PhaseOrderError, StaleEpoch, UnknownJob
from rollmux.core.placement import Policy, check_residency
from rollmux.core.regroup import (
    JobProgress,
    RegroupConfig,
    RegroupPlan,
    RegroupState,
    apply_regroup,
    plan_regroup,
)
from rollmux.core.roundrobin import ROLLOUT, TRAIN, fcfs_order
from rollmux.core.spec import HOUR, CostModel, JobSpec, PhaseTime, Planning, Pool
from rollmux.core.turns import CyclicTurns, JobNodes

PENDING, PLACED, STARTING, RUNNING, LOST = "pending", "placed", "starting", "running", "lost"
DONE, FAILED, CANCELLED = "done", "failed", "cancelled"
LIVE_STATES = (PENDING, PLACED, STARTING, RUNNING, LOST)
ENDED_STATES = (DONE, FAILED, CANCELLED)
SESSION_STATES = (STARTING, RUNNING)
PROFILE_WINDOW = 20
"""Measured phases kept per job and phase to re-estimate its profile."""
PROFILE_SAMPLES = 10
"""Measured phases of each kind a job's profile is re-estimated from at least. From two,
a job's first phases (slow while the jobs around it start) once set its profile a third
too slow, and with it the solo time its SLO is judged against, for good: it was then
planned into a group at 1.47 times its real solo time against an SLO of 1.34."""
GUARD_SAMPLES = 5
"""Iterations of every member measured in its group as it is before the SLO guard judges it."""
SLO_TOLERANCE = 0.02
"""The SLO guard acts on a planned slowdown beyond the SLO by more than this share."""
PROFILE_TOLERANCE = 0.05
"""A re-estimated profile replaces the planned one only when its mean or high quantile
moved by more than this share."""
ROBUST_SIGMA = 1.4826
"""The median absolute deviation times this is the standard deviation of normal samples."""
OUTLIER_SIGMAS = 3.0
"""Measured phases this many robust standard deviations from the median are stalls: the
mean of a re-estimated profile leaves them out."""
MIN_LOST_GRACE_S = 60.0
LEASES_OF_GRACE = 6
"""By default a job may sit seated without a session for this many leases (at least
``MIN_LOST_GRACE_S``): long enough for a driver to restart or reconnect after a lost lease,
short enough that nodes held for nobody are not paid for long."""
RESTART_BACKOFF_S = 1.0
MAX_RESTART_BACKOFF_S = 60.0
ROUND_EVENTS = frozenset({"placed", RUNNING, DONE, FAILED, CANCELLED, "unseated", "moved"})
"""Job events after which a regrouping round is due: what regrouping may move changed (a
job came, started, left, or its move landed and its group may be re-examined). Every host
asks :meth:`Delta.asks_for_round`, so the live plane and the virtual clock round alike."""


def default_lost_grace(lease_s: float) -> float:
    """How long a job may sit seated without a session when no grace is configured."""
    return max(MIN_LOST_GRACE_S, LEASES_OF_GRACE * lease_s)


def restart_delay(in_a_row: int) -> float:
    """Seconds a counted restart waits before its driver starts, the ``in_a_row``-th since the
    job last ran: none for the first (a dead worker or node is replaced at once, and a
    standby takes over in well under a second), then 1, 2, 4 … s, at most a minute, so a
    platform that keeps failing (memory pressure, a node going up and down) gets time to
    recover between attempts."""
    if in_a_row <= 1:
        return 0.0
    return min(RESTART_BACKOFF_S * 2 ** (in_a_row - 2), MAX_RESTART_BACKOFF_S)


@dataclass(frozen=True)
class Capacity:
    """How many nodes of each pool the cluster offers (None: unbounded), and how many more
    units of each it keeps for standby workers (not offered to jobs)."""

    rollout: int | None = None
    train: int | None = None
    standby: int = 0

    def limit(self, pool: Pool) -> int | None:
        return self.rollout if pool is Pool.ROLLOUT else self.train

    def offers(self, pool: Pool) -> str:
        """The limit in words, for messages."""
        kept = f" ({self.standby} more kept for standby workers)" if self.standby else ""
        return f"{self.limit(pool)}{kept}"


@dataclass(frozen=True)
class Grant:
    """A phase granted to one incarnation of a job: its nodes, its epoch, its fencing token.

    An elastic rollout's grant changes under way while keeping its token: ``nodes`` are
    the nodes it holds now; it was widened onto those in ``joined`` at the times given, and
    gave back those in ``shed``. A widened node's worker accepts the token, as no grant of
    that node came after it (the node was due to this job); a shed node's next grant has a
    higher token, which fences this one off it.
    """

    job: str
    phase: str
    nodes: tuple[int, ...]
    epoch: int
    token: int
    iteration: int
    requested_at: float
    granted_at: float
    joined: tuple[tuple[int, float], ...] = ()
    shed: tuple[int, ...] = ()
    tail_moved: bool = False
    """Its tail moved (onto the nodes it holds now): it is widened no more."""
    shed_node_s: float = 0.0
    """Node-seconds the nodes it shed were held, each from when it took it."""

    def node_seconds(self, now: float) -> float:
        """Node-seconds the grant held until ``now``, shed nodes included."""
        return self.shed_node_s + sum(now - self.held_since(node) for node in self.nodes)

    def held_since(self, node: int) -> float:
        """When the grant took ``node``: its start, or when it was widened onto it."""
        return dict(self.joined).get(node, self.granted_at)

    def ended(self, nodes: tuple[int, ...], now: float, timing: PhaseTiming, outcome: str) -> list[PhaseEntry]:
        """Phase-log lines for ``nodes`` leaving the grant at ``now``: one per time they
        joined it, so each line is the nodes' time in the phase. A release's first line
        (the earliest) carries the holder's timing and is the phase's line; nodes widened
        onto later are ``widened`` lines, shed ones ``shed`` lines, each busy throughout."""
        since: dict[float, list[int]] = {}
        for node in nodes:
            since.setdefault(self.held_since(node), []).append(node)
        lines = []
        for rank, (at, group) in enumerate(sorted(since.items())):
            primary = outcome == "revoked" or (outcome == "released" and rank == 0)
            kind = outcome if primary or outcome != "released" else "widened"
            held = timing if primary else PhaseTiming(busy_s=now - at)
            lines.append(PhaseEntry(replace(self, nodes=tuple(group), granted_at=at), now, held, kind))
        return lines


@dataclass(frozen=True)
class PhaseTiming:
    """What the holder measured of its phase: warm-up, work, offload."""

    busy_s: float = 0.0
    wake_s: float = 0.0
    sleep_s: float = 0.0


@dataclass(frozen=True)
class PhaseEntry:
    """One line of the phase log: a grant and how it ended (``released`` or ``revoked``;
    an elastic rollout's nodes also ``shed`` before its end, or ``widened`` onto after its
    start: see :meth:`Grant.ended`)."""

    grant: Grant
    ended_at: float
    timing: PhaseTiming
    outcome: str


@dataclass(frozen=True)
class EventEntry:
    job: str
    at: float
    kind: str
    detail: str


@dataclass(frozen=True)
class NodeEntry:
    """A node the cluster took (``held``) or gave back, and when: its cost is the time between."""

    node: int
    pool: Pool
    at: float
    held: bool


@dataclass(frozen=True)
class MetricsEntry:
    job: str
    iteration: int
    values: dict[str, float]


@dataclass(frozen=True)
class Move:
    """A running job on its way to a new seat (already its seat in the cluster).

    The old nodes keep the job's state until the service has copied it to the new ones;
    those no one else holds are *draining*: still paid, not offered to anyone.
    """

    origin: tuple[tuple[int, Pool], ...]
    """The nodes of the seat it leaves: rollout nodes, then training nodes."""
    rollout_from: tuple[int, ...]
    train_from: tuple[int, ...]
    decided_at: float
    reason: str
    ready_at: float | None = None
    """When it reached a phase boundary (no grant held): from then on it only waits for its state."""


@dataclass(frozen=True)
class MoveEntry:
    """One carried-out (or abandoned) move, for the migrations log."""

    job: str
    epoch: int
    reason: str
    origin: tuple[int, ...]
    target: tuple[int, ...]
    decided_at: float
    ready_at: float
    done_at: float
    moved_bytes: int
    outcome: str

    @property
    def pause_s(self) -> float:
        """Time the job could not run because of the move: boundary reached to state landed."""
        return self.done_at - self.ready_at


@dataclass
class Job:
    """A live job as the control plane tracks it."""

    name: str
    seq: int
    spec: JobSpec
    program: dict[str, Any]
    """What runs the job (kind, entrypoint, arguments); opaque to the core."""
    submitted_at: float
    priority: int = 0
    max_restarts: int = 3
    state: str = PENDING
    reason: str = ""
    epoch: int = 0
    iteration: int = 0
    next_phase: str = ROLLOUT
    cycles: int = 0
    """Meta-iterations completed in its current group's turns (its place in their cycle)."""
    restarts: int = 0
    """Restarts charged to the job (its session was lost, or the platform failed under it)."""
    restarts_in_a_row: int = 0
    """Counted restarts since it last joined its turns: what its back-off grows with."""
    restart_at: float | None = None
    """Its driver is not started again before then (restart back-off; neither is persisted:
    a restarted control plane starts it at once)."""
    unseat_at: float | None = None
    """Seated without a session (placed or lost): when it stops holding its nodes unless a
    session begins (not persisted: a restarted control plane gives a full grace again, as it
    gives live sessions a fresh lease)."""
    parked: bool = False
    """Pending after it was unseated: out of the admission queue until its driver asks for a
    session."""
    launch: int = 0
    """How many times a driver was started again (charged or not): names each incarnation."""
    lease_until: float = 0.0
    grant: Grant | None = None
    request: tuple[str, float] | None = None
    """The phase the job is waiting for, and since when."""
    last_token: int = 0
    """Token of the last grant it released: a retried release of it is answered, not refused."""
    placed_at: float | None = None
    ended_at: float | None = None
    cost_usd: float = 0.0
    """Cost of the placements it already left; :meth:`ControlState.cost_so_far` adds the current one."""
    last_seat: tuple[int, tuple[int, ...], tuple[int, ...], bool] | None = None
    """Group, rollout and training nodes, co-located flag of its last seat (kept once it left)."""
    move: Move | None = None
    paused_s: float = 0.0
    """Time its moves kept it from running (boundary reached to state landed), in all."""
    moves: int = 0
    """Moves started after it started (its budget: ``RegroupConfig.moves_per_day``)."""
    claimed: bool = False
    """A driver is being started on its seat (not persisted: a restarted control plane
    starts it again)."""

    @property
    def managed(self) -> bool:
        """RollMux starts and restarts its driver (else its owner runs it): the one thing the
        core reads of its program, as the two are bounded differently when they idle."""
        return self.program.get("kind", "external") != "external"

    @property
    def in_turns(self) -> bool:
        """Running in its group's turns (a moving job is not, until its state has landed)."""
        return self.state == RUNNING and self.move is None

    def backing_off(self, now: float) -> bool:
        """Its restart waits out its back-off at ``now``: its driver is not started yet."""
        return self.restart_at is not None and now < self.restart_at

    @property
    def unstarted(self) -> bool:
        """Placed, never run and no driver on its way: it holds no state anywhere yet, so
        moving it is a re-seat."""
        return self.state == PLACED and self.epoch == 0 and not self.claimed

    def seen_by_round(self, examined_at: float) -> bool:
        """A regrouping round whose snapshot was taken at ``examined_at`` saw it placed: it
        may start where it is unless that round re-seats it. One placed at that very moment
        waits for the next round, on every host alike."""
        return self.placed_at is not None and self.placed_at < examined_at


@dataclass(frozen=True)
class JobRecord:
    """A job's row as persisted: the job and, once placed, its seat."""

    job: Job
    group_id: int | None = None
    rollout_nodes: tuple[int, ...] = ()
    train_nodes: tuple[int, ...] = ()
    colocated: bool = False


@dataclass(frozen=True)
class NodeRecord:
    id: int
    pool: Pool


@dataclass(frozen=True)
class GroupRecord:
    id: int
    nodes: tuple[NodeRecord, ...]


@dataclass
class Delta:
    """Rows to write for the changes made since the last drain, in one transaction."""

    jobs: dict[str, JobRecord] = field(default_factory=dict)
    groups: dict[int, GroupRecord | None] = field(default_factory=dict)
    """``None``: the group is gone (with its nodes)."""
    counters: dict[str, int] = field(default_factory=dict)
    phases: list[PhaseEntry] = field(default_factory=list)
    events: list[EventEntry] = field(default_factory=list)
    metrics: list[MetricsEntry] = field(default_factory=list)
    nodes: list[NodeEntry] = field(default_factory=list)
    moves: list[MoveEntry] = field(default_factory=list)
    wake: set[str] = field(default_factory=set)
    """Jobs granted a phase they were waiting for: wake them once this is durable."""
    movable: set[str] = field(default_factory=set)
    """Moving jobs that reached a phase boundary: carry their state over once this is durable."""

    def __bool__(self) -> bool:
        return bool(self.jobs or self.groups or self.phases or self.events or self.metrics or self.nodes or self.moves)

    def asks_for_round(self) -> bool:
        """Whether these changes call for a regrouping round (see ``ROUND_EVENTS``)."""
        return any(event.kind in ROUND_EVENTS for event in self.events)


@dataclass(frozen=True)
class Snapshot:
    """Everything :meth:`ControlState.restore` needs: live jobs (in submission order),
    groups with their nodes, and the id counters."""

    jobs: list[JobRecord]
    groups: list[GroupRecord]
    counters: dict[str, int]


class ControlState:
    """Jobs, groups and who may run which phase now, for the one control plane."""

    def __init__(
        self,
        cluster: Cluster,
        policy: Policy,
        lease_s: float = 10.0,
        capacity: Capacity | None = None,
        lost_grace_s: float | None = None,
    ):
        self.cluster = cluster
        self.policy = policy
        self.lease_s = lease_s
        self.capacity = capacity or Capacity()
        self.lost_grace_s = default_lost_grace(lease_s) if lost_grace_s is None else lost_grace_s
        """How long a job may sit seated without a session (see the module's docstring)."""
        self.jobs: dict[str, Job] = {}
        self.queue: list[str] = []
        self.turns: dict[int, CyclicTurns] = {}
        self.measured: dict[tuple[str, str], list[float]] = {}
        self.periods: dict[str, list[float]] = {}
        """Recent iteration periods (training release to training release) of each job in
        its group as it is now (a change of the group's turns starts them anew)."""
        self._trained_at: dict[str, float] = {}
        self.next_seq = 0
        self.next_token = 0
        self._delta = Delta()
        self._dirty_jobs: set[str] = set()
        self._dirty_groups: set[int] = set()
        self._written: dict[str, int] = {}
        """The id counters as last drained: only those that moved are written again."""

    # --- admission ---------------------------------------------------------------------

    def validate(self, spec: JobSpec) -> None:
        """Raise what :meth:`submit` would refuse, changing nothing (a plan checks every job
        before it submits any)."""
        if spec.name in self.jobs:
            raise JobExists(f"a job named {spec.name!r} is already live")
        check_residency(self.cluster, spec)
        if self.policy.name == "colocated" and spec.colocated is None:
            raise ValueError(f"job {spec.name}: the co-located policy needs co-located phase times")
        for pool in Pool:
            limit = self.capacity.limit(pool)
            if limit is not None and spec.width(pool) > limit:
                raise NoCapacity(
                    f"job {spec.name} needs {spec.width(pool)} {pool.value} node(s) at once; "
                    f"the cluster offers {self.capacity.offers(pool)}"
                )

    def submit(
        self, spec: JobSpec, program: dict[str, Any], now: float, priority: int = 0, max_restarts: int = 3
    ) -> Job:
        """Accept a job: it is placed now if the cluster has room, else queued (``pending``)."""
        self.validate(spec)
        job = Job(spec.name, self.next_seq, spec, dict(program), now, priority, max_restarts)
        self.next_seq += 1
        self.jobs[spec.name] = job
        self.queue.append(spec.name)
        self.queue.sort(key=lambda name: (-self.jobs[name].priority, self.jobs[name].seq))
        self._touch(job)
        self._event(job.name, now, "submitted", f"priority {priority}")
        self.admit(now)
        return job

    def admit(self, now: float) -> list[str]:
        """Place queued jobs in order while the cluster has room; the first that does not fit
        waits at the head (strict FIFO within a priority). Returns the jobs placed."""
        placed = []
        while self.queue:
            job = self.jobs[self.queue[0]]
            candidate = self.policy.choose(self.cluster, job.spec)
            short = self._shortfall(candidate)
            if short:
                if job.reason != short:
                    job.reason = short
                    self._touch(job)
                break
            placement = self.cluster.commit(candidate)
            self._nodes_changed(placement.added_nodes, now, held=True)
            self.queue.pop(0)
            job.state, job.placed_at, job.unseat_at = PLACED, now, now + self.lost_grace_s
            job.reason = "" if job.managed else self._awaiting_driver()
            self._touch(job)
            self._touch_group(self.cluster.group_of(job.name).id)
            self._event(job.name, now, "placed", f"group {self.cluster.group_of(job.name).id} ({candidate.kind.value})")
            placed.append(job.name)
        return placed

    def _awaiting_driver(self) -> str:
        """Why a placed external job does not run (shown from submission on: nothing here
        will ever start it)."""
        return (
            "waiting for its driver: an external job runs only when its owner opens a session "
            f"(its nodes are released if none begins within {self.lost_grace_s:g} s)"
        )

    def set_capacity(self, capacity: Capacity, now: float) -> list[str]:
        """The cluster offers a different number of nodes; queued jobs may now fit."""
        self.capacity = capacity
        return self.admit(now)

    # --- sessions and turns ------------------------------------------------------------

    def begin_session(self, name: str, now: float, driver: str = "") -> Job:
        """A new incarnation of the job (its driver started or restarted): the next epoch
        and a fresh lease. Whatever an older incarnation held is revoked."""
        job = self._live(name)
        if job.parked:
            self._requeue(job, now)
        if job.state == PENDING:
            raise PhaseOrderError(f"job {name} is pending ({job.reason or 'queued'}): it is not placed yet")
        self._leave_turns(job, now, STARTING, "superseded by a new session")
        job.epoch += 1
        job.lease_until = now + self.lease_s
        job.reason, job.unseat_at, job.restart_at = "", None, None
        self._touch(job)
        self._event(name, now, "session", f"epoch {job.epoch} {driver}".strip())
        return job

    def _requeue(self, job: Job, now: float) -> None:
        """An unseated job's driver asks for a session: it re-enters admission in its place
        (priority, then submission order), and is seated now if the cluster has room."""
        job.parked = False
        job.reason = "queued: its driver asked for a session; it is placed when the cluster has room"
        self.queue.append(job.name)
        self.queue.sort(key=lambda name: (-self.jobs[name].priority, self.jobs[name].seq))
        self._touch(job)
        self._event(job.name, now, "requeued", "its driver asked for a session")
        self.admit(now)

    def activate(self, name: str, epoch: int, iteration: int | None, now: float, restored: str | None = None) -> Job:
        """The job's roles are loaded: it joins its group's turns, resuming at ``iteration``
        (its last checkpoint; None keeps the count the control plane has); ``restored`` says
        where its trainer came from, for the event."""
        job = self._session(name, epoch, now)
        if job.state == RUNNING:
            return job
        if iteration is not None:
            job.iteration = iteration
        job.state, job.next_phase, job.restarts_in_a_row = RUNNING, ROLLOUT, 0
        group = self.cluster.group_of(name)
        self._rebuild_turns(group)
        self._touch(job)
        source = f" (trainer: {restored})" if restored else ""
        self._event(name, now, "running", f"epoch {epoch} from iteration {job.iteration}{source}")
        self._grant_due(group, now)
        return job

    def claim(self, name: str) -> None:
        """Its driver is about to start on its seat, which regrouping no longer changes."""
        self._live(name).claimed = True

    def launching(self, name: str, now: float) -> None:
        """The launch of a placed job's driver made progress (its nodes are ready, its
        driver started): its grace counts from now, so a launch that is slow but moving (a
        worker replaced, a driver process started, on a busy host) is not taken for one
        that hangs."""
        job = self._live(name)
        if job.state == PLACED:
            job.unseat_at = now + self.lost_grace_s

    def explain(self, name: str, reason: str) -> None:
        """Say why a job is not progressing (shown with its state) without changing it."""
        job = self._live(name)
        if job.reason != reason:
            job.reason = reason
            self._touch(job)

    def heartbeat(self, name: str, epoch: int, now: float) -> Job:
        """Renew the session's lease."""
        return self._session(name, epoch, now)

    def acquire(self, name: str, phase: str, epoch: int, now: float) -> Grant | None:
        """The grant of ``phase`` if the group's round-robin gives it now (asking again
        returns the grant already held), else None: the job waits and is granted as soon as
        its turn comes (see :attr:`Delta.wake`)."""
        job = self._session(name, epoch, now)
        if job.state != RUNNING:
            raise PhaseOrderError(f"job {name} is not active: activate it before asking for phases")
        if job.grant is not None:
            if job.grant.phase == phase:
                return job.grant
            raise PhaseOrderError(f"job {name} asked for {phase} while it holds its {job.grant.phase} grant")
        if phase != job.next_phase:
            raise PhaseOrderError(f"job {name} asked for its {phase} phase, but its {job.next_phase} phase comes first")
        if job.request is None:
            job.request = (phase, now)
        self._grant_due(self.cluster.group_of(name), now, (name,))
        return job.grant

    def release(self, name: str, phase: str, epoch: int, token: int, timing: PhaseTiming, now: float) -> None:
        """The phase is over: its nodes go to the next job in turn, its duration is learnt.
        A retried release of the grant last released is answered without a change."""
        job = self._live(name)
        if job.grant is None and token == job.last_token and epoch == job.epoch:
            return
        self._session(name, epoch, now)
        if job.grant is None or job.grant.phase != phase:
            raise PhaseOrderError(f"job {name} released {phase} without holding it")
        if job.grant.token != token:
            raise StaleEpoch(f"job {name}: grant {token} is not the one it holds ({job.grant.token})")
        if job.move is not None:
            self._release_moving(job, timing, now)
            return
        group = self.cluster.group_of(name)
        freed, held_s = job.grant.nodes, now - job.grant.granted_at
        if self.turns[group.id].elastic(name, phase):  # its time depends on when it got its nodes
            held_s = job.spec.rollout_from_node_seconds(job.grant.node_seconds(now))
        self.turns[group.id].finish(name, phase)
        self._delta.phases.extend(job.grant.ended(freed, now, timing, "released"))
        job.next_phase = TRAIN if phase == ROLLOUT else ROLLOUT
        job.cycles = self.turns[group.id].cycles[name]
        if phase == TRAIN:
            job.iteration += 1
            self._count_period(name, now)
        job.grant, job.last_token = None, token
        self._touch(job)  # its group's row (its nodes) is unchanged: a phase switch writes one row
        self._learn(job, phase, held_s)
        turns = self.turns[group.id]
        self._grant_due(group, now, {turns.due(node) for node in freed})

    def shed(self, name: str, phase: str, epoch: int, token: int, keep: Collection[int], now: float) -> Grant:
        """An elastic rollout's tail moved onto ``keep``: every other node it holds goes to
        the next job in turn at once, and it is widened no more. Returns the grant as it
        is now. Once a tail moved, a shed changes nothing (a retry is answered); a moving
        job keeps its nodes until its phase ends (they are its old group's, which it
        leaves at that boundary)."""
        job = self._session(name, epoch, now)
        grant = job.grant
        if grant is None or grant.phase != phase:
            raise PhaseOrderError(f"job {name} shed nodes of {phase} without holding it")
        if grant.token != token:
            raise StaleEpoch(f"job {name}: grant {token} is not the one it holds ({grant.token})")
        kept = tuple(n for n in grant.nodes if n in set(keep))
        if not kept or len(kept) != len(set(keep)):
            raise PhaseOrderError(f"job {name} keeps {sorted(keep)}: it must keep at least one of {grant.nodes}")
        gone = tuple(n for n in grant.nodes if n not in kept)
        if grant.tail_moved or job.move is not None:
            return grant
        group = self.cluster.group_of(name)
        turns = self.turns[group.id]
        if not turns.elastic(name, phase):
            if not gone:
                return grant  # it keeps every node it holds: nothing to shed
            raise PhaseOrderError(f"job {name}: its {phase} has no tail to move, so it holds its nodes to the end")
        turns.give_back(name, gone)
        self._delta.phases.extend(grant.ended(gone, now, PhaseTiming(), "shed"))
        shed_node_s = grant.shed_node_s + sum(now - grant.held_since(node) for node in gone)
        job.grant = replace(grant, nodes=kept, shed=grant.shed + gone, tail_moved=True, shed_node_s=shed_node_s)
        self._touch(job)
        self._touch_group(group.id)
        self._grant_due(group, now, {turns.due(node) for node in turns.shed[name]})
        return job.grant

    def report(self, name: str, epoch: int, iteration: int, metrics: dict[str, float], now: float) -> None:
        """Metrics of one iteration (kept per iteration: a repeated report replaces it)."""
        self._session(name, epoch, now)
        self._delta.metrics.append(MetricsEntry(name, iteration, dict(metrics)))

    def expire(self, now: float) -> list[str]:
        """The deadlines that passed by ``now``: sessions whose lease ran out are lost
        (grants revoked, out of the turns); jobs seated without a session for
        ``lost_grace_s`` stop holding their nodes — an external one is unseated and parked,
        a managed one is lost (its host restarts it, counted, as after any loss). Returns
        the jobs lost now."""
        lost = [j.name for j in self.jobs.values() if j.state in SESSION_STATES and j.lease_until < now]
        for name in lost:
            self.lose(name, now, f"lease expired: no heartbeat for {self.lease_s:g} s (epoch {self.jobs[name].epoch})")
        idle = [j for j in self.jobs.values() if j.state in (PLACED, LOST) and j.unseat_at is not None]
        for job in [j for j in idle if j.unseat_at < now]:
            if not job.managed:
                self._park(job, now)
                continue
            if job.state == PLACED:
                waiting = f" ({job.reason})" if job.reason else ""
                self.lose(job.name, now, f"no session began within {self.lost_grace_s:g} s{waiting}")
            lost.append(job.name)
        return lost

    def renew_deadlines(self, now: float) -> None:
        """Every live session gets a full lease from ``now``, and every job seated without
        one a full grace: after a restart, from when the control plane answers again. Its
        host may spend many seconds rebuilding, reconnecting to Ray and warming workers
        before any driver can reach it; a lease counted from the rebuild would be lost for
        that wait, and the job charged a restart for the control plane's own crash."""
        for job in self.jobs.values():
            if job.state in SESSION_STATES:
                job.lease_until = now + self.lease_s
            if job.state in (PLACED, LOST):
                job.unseat_at = now + self.lost_grace_s

    def _park(self, job: Job, now: float) -> None:
        """Unseat an external job nobody runs: its nodes are released and its cost stops; it
        is pending, out of the admission queue, until its driver asks for a session."""
        grace = f"{self.lost_grace_s:g} s"
        why = f"lost for {grace} ({job.reason})" if job.state == LOST else f"no driver came within {grace}"
        job.cost_usd = self.cost_so_far(job, now)
        self._unseat(job, now, PENDING)
        job.parked, job.placed_at, job.unseat_at = True, None, None
        job.reason = f"{why}: unseated, its nodes released; it is placed again when its driver opens a session"
        self._event(job.name, now, "unseated", job.reason)
        self.admit(now)

    def lose(self, name: str, now: float, reason: str) -> None:
        """The job's session is gone (lease expired, or its driver is known dead): its grant
        is revoked and it leaves the turns; the rest of its group goes on. It keeps its seat
        for ``lost_grace_s`` (see :meth:`expire`)."""
        job = self._live(name)
        self._leave_turns(job, now, LOST, reason)
        job.reason, job.unseat_at = reason, now + self.lost_grace_s
        self._event(name, now, "lost", reason)

    def restart(self, name: str, now: float, counted: bool = True) -> bool:
        """A lost job gets a new driver, if it has restarts left, after its back-off
        (:func:`restart_delay` of its restarts since it last ran; :attr:`Job.restart_at`);
        else it fails (and leaves).
        ``counted=False``: the job is not at fault (the control plane itself restarted), and
        starts again at once."""
        job = self._live(name)
        job.restarts += int(counted)
        job.launch += 1
        if job.restarts > job.max_restarts:
            self.end(name, FAILED, now, f"lost {job.restarts} times (max_restarts {job.max_restarts}): {job.reason}")
            return False
        job.restarts_in_a_row += int(counted)
        delay = restart_delay(job.restarts_in_a_row) if counted else 0.0
        job.restart_at = now + delay if delay else None
        job.unseat_at = now + delay + self.lost_grace_s
        wait = f" in {delay:g} s" if delay else ""
        job.state, job.reason = PLACED, f"restart {job.restarts}/{job.max_restarts}{wait} after: {job.reason}"
        self._touch(job)
        self._event(name, now, "restart", job.reason)
        return True

    def end(self, name: str, state: str, now: float, error: str = "") -> Removal | None:
        """The job finished, failed or was cancelled: it leaves its turns and its group;
        nodes no one uses are released and queued jobs may take them."""
        job = self._live(name)
        removal = None
        if job.state == PENDING:
            if name in self.queue:  # a parked job is not queued
                self.queue.remove(name)
        else:
            job.cost_usd = self.cost_so_far(job, now)
            removal = self._unseat(job, now, state)
        job.state, job.reason, job.ended_at = state, error, now
        job.grant = job.request = None
        self._touch(job)
        self._event(name, now, state, error)
        self.admit(now)
        return removal

    def end_session(self, name: str, epoch: int, state: str, now: float, error: str = "") -> Removal | None:
        """The job's own driver ends it (done, or failed with ``error``): fenced by epoch."""
        self._session(name, epoch, now)
        return self.end(name, state, now, error)

    # --- moving running jobs --------------------------------------------------------------

    def regroup(self, config: RegroupConfig, cache: RegroupState, now: float) -> list[str]:
        """Run the core's regrouping (the simulator's very code) over the settled groups
        and start the moves it decides; the jobs moved."""
        view = self.movable_view()
        return self.start_regroup(plan_regroup(view, config, cache, self.progress(view, now)), now)

    def movable_view(self) -> Cluster:
        """A copy of the cluster with only the groups whose jobs all run in their turns or
        have not started yet: a job still loading its roles, or already on its way, cannot
        be moved, nor can the jobs it shares nodes with (their turns include it)."""
        view = copy.deepcopy(self.cluster)
        for group in list(view.groups.values()):
            if not all(self._movable(m.job.name) for m in group.members):
                for member in list(group.members):
                    view.remove(member.job.name)
        return view

    def progress(self, view: Cluster, now: float) -> dict[str, JobProgress]:
        """Every job's progress in ``view`` as the simulator books it, for regrouping's
        lifetime SLO check: time since it was placed, solo-equivalent work at its group's
        planned rate less the pauses of its moves, and, for a job that says how many
        iterations it runs, its remaining ones at its group's period. A job not started yet has none:
        it moves without a pause, as an arriving job does in the simulator."""
        found = {}
        for group in view.groups.values():
            for member, period in zip(group.members, group.schedule.periods, strict=True):
                job = self.jobs[member.job.name]
                if job.unstarted or job.placed_at is None:
                    found[job.name] = JobProgress(0.0, 0.0)
                    continue
                elapsed = max(now - job.placed_at, 0.0)
                rate = member.seat(view.planning).solo_s / period if period > 0 else 1.0
                left = None if job.spec.iterations is None else max(job.spec.iterations - job.iteration, 0) * period
                found[job.name] = JobProgress(elapsed, max(elapsed * rate - job.paused_s, 0.0), job.moves, left)
        return found

    def _movable(self, name: str) -> bool:
        job = self.jobs[name]
        return job.in_turns or job.unstarted

    def reserve_node_ids(self, count: int) -> int:
        """Set aside node ids for a regrouping whose new nodes are readied first; the first id."""
        return self.cluster.reserve_ids(count)

    def start_regroup(self, plan: RegroupPlan | None, now: float, node_ids: Sequence[int] | None = None) -> list[str]:
        """Start the moves of a regrouping planned on the groups its jobs are in now;
        ``node_ids``: ids set aside (:meth:`reserve_node_ids`) for its new nodes, readied
        beforehand."""
        if plan is None:
            return []
        if not all(self._movable(job.name) for job in plan.moved):
            raise PhaseOrderError("regrouping moves only jobs running in their turns or not started yet")
        reseated = [job.name for job in plan.moved if self.jobs[job.name].unstarted]
        origins = {job.name: self._origin(job.name) for job in plan.moved if job.name not in reseated}
        left = {self.cluster.job_group[job.name] for job in plan.moved}
        before = dict(self.cluster.node_pool)
        apply_regroup(self.cluster, plan, iter(node_ids) if node_ids is not None else None)
        for name in reseated:
            group = self.cluster.group_of(name)
            left.add(group.id)
            self._touch(self.jobs[name])
            self._event(name, now, "reseated", f"group {group.id} (regroup, before it started)")
        self._start_moves(origins, before, left, now, "regroup")
        return [job.name for job in plan.moved]

    def still_movable(self, plan: RegroupPlan, snapshot: Cluster) -> bool:
        """Whether a plan made on ``snapshot`` may still be carried out: its jobs still run
        in their turns (or have still not started), in the groups they were in when it was
        made, with the same partners, and the groups it seats jobs in or builds anew in
        place are as they were (other groups may have changed meanwhile). Every host asks
        this before :meth:`start_regroup`, since planning takes time (live) or new nodes
        are readied first (both)."""
        groups = self.cluster.groups

        def unchanged(was: Group) -> bool:
            return was.id in groups and [m.job.name for m in groups[was.id].members] == [
                m.job.name for m in was.members
            ]

        for spec in plan.moved:
            job = self.jobs.get(spec.name)
            if job is None or not (job.in_turns or job.unstarted) or not unchanged(snapshot.group_of(spec.name)):
                return False
        kept = [join.group_id for join in plan.joins] + [place.group_id for _, place in plan.built() if place]
        return all(unchanged(snapshot.groups[group_id]) for group_id in kept if group_id is not None)

    def guard(self, now: float) -> list[str]:
        """The SLO guard. A group is re-planned when a member's measured slowdown (the
        median of its last iteration periods in the group over its measured solo time)
        exceeds its SLO, and the core's schedule with the measured phase times agrees
        that the group breaks it (the member's planned period beyond SLO × its own
        disaggregated phases planned alike: a job's own spread is not its partners' doing;
        a co-located member is judged, as its SLO is, against itself alone on disaggregated
        nodes). The member
        with the longest iteration (the one stretching the others most) is then placed
        anew, as an arriving job would be, and moved there. Returns the jobs moved (at
        most one per group and call: the next call sees the new schedule)."""
        moved = []
        for group in list(self.cluster.groups.values()):
            if len(group.members) < 2 or any(not self._guardable(m.job.name) for m in group.members):
                continue
            planned = max(
                period / (m.job.slo * m.job.planned_iteration(self.cluster.planning))
                for m, period in zip(group.members, group.schedule.periods, strict=True)
            )
            if planned <= 1 + SLO_TOLERANCE:
                continue  # within every SLO by plan: measuring is not needed (it runs every phase)
            measured = max(self._measured_slowdown(m.job.name) / m.job.slo for m in group.members)
            if measured <= 1 + SLO_TOLERANCE:
                continue
            spec = max((m.job for m in group.members), key=lambda job: job.solo_iteration())
            name = spec.name
            trial = copy.deepcopy(self.cluster)
            for member in group.members:  # not back into the group that broke: elsewhere
                trial.remove(member.job.name)
            candidate = self.policy.choose(trial, spec)
            short = self._shortfall(candidate)
            if short:
                self.explain(name, f"its group runs at {measured:.2f}× an SLO; {short}")
                continue
            origins = {name: self._origin(name)}
            before = dict(self.cluster.node_pool)
            self.cluster.remove(name)
            self.cluster.commit(candidate)
            self._start_moves(origins, before, {group.id}, now, f"slo guard: group ran at {measured:.2f}× an SLO")
            moved.append(name)
        return moved

    def _guardable(self, name: str) -> bool:
        """Running in its turns, with a few iterations measured in its group as it is now."""
        return self.jobs[name].in_turns and len(self.periods.get(name, ())) >= GUARD_SAMPLES

    def _measured_slowdown(self, name: str) -> float:
        """Median of the job's recent iteration periods over its solo iteration as measured.
        The SLO is relative to the job alone on disaggregated nodes; a co-located member's
        phases run slower where it sits, so its solo iteration is its planned one scaled by
        how its measured phases compare with those planned where it sits (for a
        disaggregated member: its measured phases)."""
        seat = self.seat(name)
        assert seat is not None
        measured = sum(statistics.fmean(self.measured[(name, phase)]) for phase in (ROLLOUT, TRAIN))
        planned_here = sum(phase.mean for phase in seat.phases())
        solo = seat.job.solo_iteration() * measured / planned_here if planned_here > 0 else measured
        return statistics.median(self.periods[name][-GUARD_SAMPLES:]) / solo

    def moving(self) -> list[str]:
        return [j.name for j in self.jobs.values() if j.move is not None]

    def movable(self) -> list[str]:
        """Moving jobs at a phase boundary: their state can be carried over now."""
        return [j.name for j in self.jobs.values() if j.move is not None and j.move.ready_at is not None]

    def draining(self) -> dict[int, Pool]:
        """Nodes no group holds any more that still keep a moving job's state."""
        return {
            node: pool
            for job in self.jobs.values()
            if job.move is not None
            for node, pool in job.move.origin
            if node not in self.cluster.node_pool
        }

    def finish_move(self, name: str, epoch: int, decided_at: float, moved_bytes: int, now: float) -> bool:
        """The job's state is on its new nodes: it joins its new group's turns. False if
        that move is no longer the job's (it was lost, ended or restarted meanwhile)."""
        job = self.jobs.get(name)
        if job is None or job.move is None or job.epoch != epoch or job.move.decided_at != decided_at:
            return False
        if job.move.ready_at is None:
            raise PhaseOrderError(f"job {name} still holds its {job.grant.phase if job.grant else ''} grant")
        self._close_move(job, moved_bytes, "moved", now)
        for phase in (ROLLOUT, TRAIN):  # its phases run elsewhere now, perhaps co-located
            self.measured.pop((name, phase), None)
        group = self.cluster.group_of(name)
        self._rebuild_turns(group)
        self._grant_due(group, now)
        return True

    def _origin(self, name: str) -> Move:
        seat = self.seat(name)
        assert seat is not None
        nodes = dict.fromkeys((*seat.rollout_nodes, *seat.train_nodes))
        origin = tuple((n, self.cluster.node_pool[n]) for n in nodes)
        return Move(origin, seat.rollout_nodes, seat.train_nodes, 0.0, "")

    def _start_moves(
        self, origins: dict[str, Move], before: dict[int, Pool], left: set[int], now: float, reason: str
    ) -> None:
        """Book-keeping of a changed seating: new nodes are paid from now, old nodes once no
        moving job's state is left on them; turns rebuilt; jobs at a boundary may go."""
        added = tuple((n, p) for n, p in self.cluster.node_pool.items() if n not in before)
        keeping = {n for origin in origins.values() for n, _ in origin.origin}
        keeping |= set(self.draining())
        gone = tuple((n, p) for n, p in before.items() if n not in self.cluster.node_pool and n not in keeping)
        self._nodes_changed(added, now, held=True)
        self._nodes_changed(gone, now, held=False)
        for name, origin in origins.items():
            job = self.jobs[name]
            job.move = replace(origin, decided_at=now, reason=reason, ready_at=None if job.grant else now)
            job.moves += 1
            self._touch(job)
            group = self.cluster.group_of(name)
            self._event(name, now, "moving", f"to group {group.id} ({reason})")
            if job.grant is None:
                self._delta.movable.add(name)
        for group_id in left - set(self.cluster.groups):
            self.turns.pop(group_id, None)
            self._touch_group(group_id)
        for group_id in (left | {self.cluster.job_group[name] for name in origins}) & set(self.cluster.groups):
            group = self.cluster.groups[group_id]
            self._rebuild_turns(group)
            self._grant_due(group, now)

    def _release_moving(self, job: Job, timing: PhaseTiming, now: float) -> None:
        """A moving job hands back the phase it held on its old nodes: its boundary."""
        grant = job.grant
        assert grant is not None and job.move is not None
        self._delta.phases.extend(grant.ended(grant.nodes, now, timing, "released"))
        job.next_phase = TRAIN if grant.phase == ROLLOUT else ROLLOUT
        if grant.phase == TRAIN:
            job.iteration += 1
        job.grant, job.last_token = None, grant.token
        job.move = replace(job.move, ready_at=now)
        self._touch(job)
        self._unhold(job.name, grant.nodes, now)
        self._delta.movable.add(job.name)

    def _unhold(self, name: str, nodes: tuple[int, ...], now: float) -> None:
        """Free nodes a moving job held in the turns of a group it left."""
        for group_id, turns in self.turns.items():
            freed = [n for n in nodes if turns.holder.get(n) == name]
            for node in freed:
                del turns.holder[node]
            if freed:
                self._touch_group(group_id)
                self._grant_due(self.cluster.groups[group_id], now, {turns.due(n) for n in freed})

    def _close_move(self, job: Job, moved_bytes: int, outcome: str, now: float, why: str = "") -> None:
        """End the job's move (carried out, or abandoned): log it; release old nodes no one
        holds and no other move still needs."""
        move = job.move
        assert move is not None
        job.move = None
        seat = self.seat(job.name)
        target = (*seat.rollout_nodes, *seat.train_nodes) if seat else ()
        ready = move.ready_at if move.ready_at is not None else now
        job.paused_s += now - ready
        entry = MoveEntry(
            job.name,
            job.epoch,
            move.reason,
            tuple(n for n, _ in move.origin),
            tuple(dict.fromkeys(target)),
            move.decided_at,
            ready,
            now,
            moved_bytes,
            outcome,
        )
        self._delta.moves.append(entry)
        still = self.draining()
        gone = tuple((n, p) for n, p in move.origin if n not in self.cluster.node_pool and n not in still)
        self._nodes_changed(gone, now, held=False)
        self._touch(job)
        self._event(job.name, now, outcome, why or f"pause {entry.pause_s:.3f} s, {moved_bytes} bytes")

    # --- views ---------------------------------------------------------------------------

    def job(self, name: str) -> Job:
        return self._live(name)

    def seat(self, name: str) -> Member | None:
        if name not in self.cluster.job_group:
            return None
        return next(m for m in self.cluster.group_of(name).members if m.job.name == name)

    def record(self, name: str) -> JobRecord:
        """The job's row as the store keeps it (a copy)."""
        job = self._live(name)
        seat = self.seat(job.name)
        if seat is not None:
            group_id = self.cluster.job_group[job.name]
            return JobRecord(replace(job), group_id, seat.rollout_nodes, seat.train_nodes, seat.colocated)
        if job.last_seat is not None and job.state in ENDED_STATES:
            return JobRecord(replace(job), *job.last_seat)
        return JobRecord(replace(job))

    def cost_so_far(self, job: Job, now: float) -> float:
        """Time since placement × the job's equal share of its group's node price now."""
        if job.placed_at is None or job.name not in self.cluster.job_group:
            return job.cost_usd
        group = self.cluster.group_of(job.name)
        rate = sum(
            self.cluster.cost.price(self.cluster.node_pool[n]) for n in (*group.rollout_nodes, *group.train_nodes)
        )
        return job.cost_usd + (now - job.placed_at) / HOUR * rate / len(group.members)

    # --- persistence ---------------------------------------------------------------------

    def drain(self) -> Delta:
        """The rows changed since the last drain; ended jobs leave memory here."""
        delta, self._delta = self._delta, Delta()
        for name in self._dirty_jobs:
            delta.jobs[name] = self.record(name)
        for group_id in self._dirty_groups:
            delta.groups[group_id] = self._group_record(group_id)
        counters = {"next_seq": self.next_seq, "next_token": self.next_token}
        counters["next_node"], counters["next_group"] = self.cluster.next_ids
        delta.counters = {name: value for name, value in counters.items() if self._written.get(name) != value}
        self._written.update(delta.counters)
        for name in self._dirty_jobs:
            if self.jobs[name].state in ENDED_STATES:
                del self.jobs[name]
                for phase in (ROLLOUT, TRAIN):
                    self.measured.pop((name, phase), None)
                self.periods.pop(name, None)
                self._trained_at.pop(name, None)
        self._dirty_jobs, self._dirty_groups = set(), set()
        return delta

    @classmethod
    def restore(
        cls,
        snapshot: Snapshot,
        cost: CostModel,
        planning: Planning,
        policy: Policy,
        now: float,
        lease_s: float = 10.0,
        capacity: Capacity | None = None,
        lost_grace_s: float | None = None,
    ) -> ControlState:
        """The state as the store holds it. Live sessions get a fresh lease (their holders
        may be alive and reconnecting), and jobs seated without one a full grace (no driver
        could reach a control plane that was down); held grants stay held, so nothing is
        granted twice; unseated jobs stay parked."""
        records = sorted(snapshot.jobs, key=lambda r: r.job.seq)
        members: dict[int, list[Member]] = {}
        for r in records:
            if r.group_id is not None and r.job.state != PENDING:
                members.setdefault(r.group_id, []).append(
                    Member(r.job.spec, r.rollout_nodes, r.train_nodes, r.colocated)
                )
        groups = [
            (
                g.id,
                [n.id for n in g.nodes if n.pool is Pool.ROLLOUT],
                [n.id for n in g.nodes if n.pool is Pool.TRAIN],
                members.get(g.id, []),
            )
            for g in sorted(snapshot.groups, key=lambda g: g.id)
        ]
        node_pool = {n.id: n.pool for g in snapshot.groups for n in g.nodes}
        counters = snapshot.counters
        cluster = Cluster.restore(
            cost, planning, groups, node_pool, counters.get("next_node", 0), counters.get("next_group", 0)
        )
        state = cls(cluster, policy, lease_s, capacity, lost_grace_s)
        state.next_seq = counters.get("next_seq", 0)
        state.next_token = counters.get("next_token", 0)
        for r in records:
            job = replace(r.job, request=None, restart_at=None, unseat_at=None, restarts_in_a_row=0)
            state.jobs[job.name] = job
            if job.state == PENDING and not job.parked:
                state.queue.append(job.name)
        state.queue.sort(key=lambda n: (-state.jobs[n].priority, state.jobs[n].seq))
        state.renew_deadlines(now)
        cycles = {name: job.cycles for name, job in state.jobs.items()}  # rebuilding turns resets them
        for group in cluster.groups.values():
            state._rebuild_turns(group)
            turns = state.turns.get(group.id)
            if turns is not None:
                holders = {
                    node: job.name
                    for job in (state.jobs[name] for name in turns.jobs)
                    if job.grant is not None
                    for node in job.grant.nodes
                }
                jobs = [state.jobs[name] for name in turns.jobs]
                shed = {
                    j.name: set(turns.nodes[j.name].rollout) - set(j.grant.nodes)
                    for j in jobs
                    if j.grant is not None and j.grant.tail_moved
                }
                turns.resume(
                    {j.name: j.next_phase for j in jobs}, {j.name: cycles[j.name] for j in jobs}, holders, shed
                )
                for job in jobs:
                    job.cycles = cycles[job.name]
                state._hold_for_movers(turns)
        return state

    # --- internals -----------------------------------------------------------------------

    def _live(self, name: str) -> Job:
        if name not in self.jobs:
            raise UnknownJob(f"no live job named {name!r}")
        return self.jobs[name]

    def _session(self, name: str, epoch: int, now: float) -> Job:
        """The job if ``epoch`` is its current session and that session is alive; renews the lease."""
        job = self._live(name)
        if epoch != job.epoch:
            raise StaleEpoch(f"job {name}: epoch {epoch} is stale, the job is at epoch {job.epoch}")
        if job.state == LOST or job.parked:
            raise StaleEpoch(f"job {name}: session {epoch} is over ({job.reason}); begin a new one")
        if job.state not in SESSION_STATES:
            raise PhaseOrderError(f"job {name} is not active ({job.state}): begin a session and activate it first")
        job.lease_until = now + self.lease_s
        return job

    def _shortfall(self, candidate: Candidate) -> str:
        """Why the candidate does not fit the cluster's capacity now ('' if it does)."""
        return self.shortfall([p for _, p in candidate.new_nodes])

    def shortfall(self, new_nodes: Sequence[Pool]) -> str:
        """Why nodes of these pools do not fit the capacity on top of those held now (seats,
        and old nodes moving jobs' state is still on); '' if they do."""
        draining = self.draining()
        for pool in Pool:
            limit = self.capacity.limit(pool)
            adds = sum(1 for p in new_nodes if p is pool)
            used = self.cluster.nodes(pool) + sum(1 for p in draining.values() if p is pool)
            if limit is not None and adds and used + adds > limit:
                return f"waiting for {adds} free {pool.value} node(s): {used} of {limit} are in use"
        return ""

    def _unseat(self, job: Job, now: float, state: str) -> Removal:
        """Take the job out of its turns (now in ``state``) and its group."""
        self._leave_turns(job, now, state, f"job {job.name} is {state}")
        seat = self.seat(job.name)
        group_id = self.cluster.group_of(job.name).id
        job.last_seat = (group_id, seat.rollout_nodes, seat.train_nodes, seat.colocated)
        removal = self.cluster.remove(job.name)
        draining = self.draining()  # a moving job's state still there: paid until it leaves
        self._nodes_changed(tuple(n for n in removal.released_nodes if n[0] not in draining), now, held=False)
        self._touch_group(group_id)
        group = self.cluster.groups.get(group_id)
        if group is None:
            self.turns.pop(group_id, None)
        else:
            self._rebuild_turns(group)
            self._grant_due(group, now)
        return removal

    def _leave_turns(self, job: Job, now: float, state: str, why: str) -> None:
        """Revoke the job's grant (logged as revoked) and take it out of its group's turns."""
        if job.grant is not None:
            self._delta.phases.extend(job.grant.ended(job.grant.nodes, now, PhaseTiming(), "revoked"))
            self._event(job.name, now, "revoked", f"{job.grant.phase} grant {job.grant.token}: {why}")
            job.grant = None
        job.request = None
        was_running = job.in_turns
        if job.move is not None:
            self._unhold(job.name, tuple(n for n, _ in job.move.origin), now)
            self._close_move(job, 0, "abandoned", now, why)
        job.state = state
        self._touch(job)
        if was_running:
            group = self.cluster.group_of(job.name)
            self._rebuild_turns(group)
            self._touch_group(group.id)
            self._grant_due(group, now)

    def _grant_due(self, group: Group, now: float, candidates: Collection[str] | None = None) -> None:
        """Grant every waiting job of the group whose turn has come. ``candidates``: the only
        jobs that can have become startable (the asking job; the jobs due next on freed
        nodes), so a phase switch costs the same whatever the group's size."""
        turns = self.turns.get(group.id)
        if turns is None:
            return
        order = (
            turns.jobs
            if candidates is None
            else sorted((j for j in candidates if j in turns.nodes), key=turns.jobs.index)
        )
        for name in order:
            job = self.jobs[name]
            if job.grant is not None and job.move is None:
                self._widen(job, turns, group, now)
            if job.request is None or job.grant is not None or not turns.may_start(name, job.request[0]):
                continue
            phase, asked = job.request
            nodes = turns.start(name, phase)
            self.next_token += 1
            job.grant = Grant(name, phase, nodes, job.epoch, self.next_token, job.iteration, asked, now)
            job.request = None
            self._touch(job)
            self._touch_group(group.id)
            self._delta.wake.add(name)

    def _widen(self, job: Job, turns: CyclicTurns, group: Group, now: float) -> None:
        """An elastic rollout under way takes the nodes that came due and free to it."""
        added = turns.widen(job.name)
        if not added:
            return
        assert job.grant is not None
        grant = job.grant
        job.grant = replace(grant, nodes=grant.nodes + added, joined=grant.joined + tuple((n, now) for n in added))
        self._touch(job)
        self._touch_group(group.id)
        self._delta.wake.add(job.name)

    def _rebuild_turns(self, group: Group) -> None:
        """Turns of the group's running jobs in the core's FCFS cyclic order."""
        self._touch_group(group.id)
        active = [m for m in group.members if self.jobs[m.job.name].in_turns]
        if not active:
            self.turns.pop(group.id, None)
            return
        seats = [m.seat(self.cluster.planning) for m in active]
        nodes = {
            m.job.name: JobNodes(m.rollout_nodes, m.train_nodes, seat.elastic)
            for m, seat in zip(active, seats, strict=True)
        }
        jobs = [m.job.name for m in active]
        turns = CyclicTurns.build(jobs, nodes, fcfs_order(seats), self.turns.get(group.id))
        for name in jobs:
            turns.next_phase[name] = self.jobs[name].next_phase
            self.jobs[name].cycles = turns.cycles[name]
            self.periods.pop(name, None)
            self._trained_at.pop(name, None)
        self._hold_for_movers(turns)
        self.turns[group.id] = turns

    def _count_period(self, name: str, now: float) -> None:
        if name in self._trained_at:
            window = self.periods.setdefault(name, [])
            window.append(now - self._trained_at[name])
            del window[:-PROFILE_WINDOW]
        self._trained_at[name] = now

    def _hold_for_movers(self, turns: CyclicTurns) -> None:
        """Nodes of the group that a job moving away still holds stay its until it releases."""
        for job in self.jobs.values():
            if job.move is not None and job.grant is not None:
                for node in job.grant.nodes:
                    if node in turns.sequence:
                        turns.holder[node] = job.name

    def _learn(self, job: Job, phase: str, held_s: float) -> None:
        """Feed measured phase durations back into the job's profile in the core: how long
        the phase held its nodes, grant to release (its switching included, as the
        schedule must count it)."""
        window = self.measured.setdefault((job.name, phase), [])
        window.append(held_s)
        del window[:-PROFILE_WINDOW]
        times = [self.measured.get((job.name, p), []) for p in (ROLLOUT, TRAIN)]
        if phase != TRAIN or min(len(t) for t in times) < PROFILE_SAMPLES:
            return
        rollout, train = _profile(times[0]), _profile(times[1])
        planned = self.seat(job.name).phases()
        if _close(rollout, planned[0]) and _close(train, planned[1]):
            return  # rescheduling a group costs its steady state: only for a real change
        self.cluster.update_phase_times(job.name, rollout, train)
        job.spec = self.seat(job.name).job

    def _nodes_changed(self, nodes: tuple[tuple[int, Pool], ...], now: float, held: bool) -> None:
        self._delta.nodes += [NodeEntry(node, pool, now, held) for node, pool in nodes]

    def _touch(self, job: Job) -> None:
        self._dirty_jobs.add(job.name)

    def _touch_group(self, group_id: int) -> None:
        self._dirty_groups.add(group_id)

    def _event(self, job: str, at: float, kind: str, detail: str) -> None:
        self._delta.events.append(EventEntry(job, at, kind, detail))

    def _group_record(self, group_id: int) -> GroupRecord | None:
        group = self.cluster.groups.get(group_id)
        if group is None:
            return None
        held = (*group.rollout_nodes, *group.train_nodes)
        return GroupRecord(group_id, tuple(NodeRecord(node, self.cluster.node_pool[node]) for node in held))


def _close(measured: PhaseTime, known: PhaseTime, tolerance: float = PROFILE_TOLERANCE) -> bool:
    """Whether a re-measured profile is within ``tolerance`` of the one the core plans with."""
    known_high = known.high if known.high is not None else known.mean
    measured_high = measured.high if measured.high is not None else measured.mean
    return abs(measured.mean - known.mean) <= tolerance * known.mean and abs(
        measured_high - known_high
    ) <= tolerance * max(known_high, 1e-9)


def _profile(values: list[float]) -> PhaseTime:
    """Mean and 95th percentile of measured durations. The percentile is the median plus
    1.645 robust standard deviations (1.4826 × the median absolute deviation), so a stall
    of the host in a sample or two of the window does not make a job look slow for the
    window's length; a job whose phases really are longer or spread moves the median and
    the deviation. (The maximum of the window used to stand for it: in a replay 2 % of
    phases overran by more than a quarter, in bursts, and the planner then saw a tenth of
    the jobs 40–90 % slower than they were, and seated them on more nodes.) The mean leaves
    out samples beyond ``OUTLIER_SIGMAS`` robust standard deviations from the median, for
    the same reason: it is the solo time the job's SLO is judged against."""
    median = statistics.median(values)
    spread = ROBUST_SIGMA * statistics.median(abs(value - median) for value in values)
    mean = statistics.fmean(value for value in values if abs(value - median) <= OUTLIER_SIGMAS * spread)
    high = median + statistics.NormalDist().inv_cdf(0.95) * spread
    return PhaseTime(mean=mean, high=max(high, mean), high_quantile=0.95)
