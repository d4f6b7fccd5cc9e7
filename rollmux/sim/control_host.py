"""The live control plane's state machine under a virtual clock: ``simulate --engine control``.

The fast simulator (:mod:`rollmux.sim.simulator`) books each group at its steady-state
rates and regroups at every event. This host instead drives the very
:class:`~rollmux.core.control.ControlState` the service hosts, phase by phase: jobs are
submitted and admitted, their drivers start after a start-up, every phase is asked for,
granted in its group's turns and released after a duration drawn from the job's profile,
regrouping rounds run a settle delay after arrivals, starts and departures over the groups
the live plane may move (:meth:`ControlState.movable_view`), a plan's new nodes are readied
before its moves start and it is dropped if its groups changed meanwhile
(:meth:`ControlState.still_movable`), a moving job pauses from its phase boundary until its
state has crossed, and the SLO guard runs after every measured iteration. What this host
adds is only what the service's asyncio tasks add: the waiting.

A job whose rollout moves its long tail (``JobSpec.tail``) is granted an *elastic* rollout
and driven as the live driver drives one (:func:`rollmux.jobs.long_tail.run_chunks`): its
head is work shared out over the nodes it holds, so each widening speeds it up; when the
head is done its tail moves onto the first ``tail.nodes`` nodes it holds and it sheds the
others (:meth:`ControlState.shed`), which go to the next rollout in turn at once. The
durations are the core's model of it (:func:`rollmux.core.roundrobin.elastic_visit`), so
the two engines price the same rollouts.

Costs it charges that the fast simulator does not (:class:`HostCosts`, each named by its
source): a job's cold start before it first runs, readying a regrouping's new nodes, and
the transfer of a moved job's state. Nodes are paid from the moment the state machine holds
them to the moment it releases them (draining nodes that still keep a mover's state
included), so cost comes from the state machine's own node log, not from a model.

With :class:`~rollmux.sim.faults.Faults`, seeded driver kills, lease losses, node failures
and control-plane restarts are injected (see :mod:`rollmux.sim.faults`): the journal is then
a real SQLite store in a temporary directory, written as the service writes it and read back
at each restart. Otherwise pure of I/O. No wall clock either way: the same inputs and seed
give the same result.
"""

from __future__ import annotations

import copy
import dataclasses
import heapq
import itertools
import math
import random
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from rollmux.core.cluster import Cluster
from rollmux.core.configs import colocated_phases
from rollmux.core.control import ENDED_STATES, RUNNING, Capacity, ControlState, Delta, Job, PhaseTiming
from rollmux.core.placement import Policy
from rollmux.core.regroup import RegroupConfig, RegroupPlan, RegroupState, new_node_pools, plan_regroup
from rollmux.core.roundrobin import ROLLOUT, TRAIN
from rollmux.core.spec import DEFAULT_PLANNING, HOUR, CostModel, JobSpec, Planning, Pool, RolloutTail
from rollmux.core.turns import JobNodes
from rollmux.inputs.trace import Trace
from rollmux.service.store import Store
from rollmux.sim.decisions import DECISION_KINDS
from rollmux.sim.faults import (
    DRIVER_KILL,
    LEASE_LOSS,
    NODE_FAILURE,
    PLANE_RESTART,
    Fault,
    FaultAccount,
    Faults,
    schedule,
)
from rollmux.sim.periods import CHANGES
from rollmux.sim.simulator import JobAccount, SimResult

MAX_PHASES = 2_000_000
"""Phases a run may grant at most (each job's life over its solo iteration, twice): the
production trace needs about 105,000 (90 s of CPU), so this bounds a run at about half an
hour; a trace beyond it is refused up front rather than left running."""
MANAGED = {"kind": "virtual"}
"""The program of every job here: RollMux runs it (restarted on loss, as a managed job)."""


@dataclass(frozen=True)
class HostCosts:
    """What the live system pays that a steady-state model does not, in seconds.

    ``job_start_s``: a job's cold start (process start, checkpoint load, engine init) before
    its first phase; the design brief gives 25–135 s for the published models, this is the
    middle of it. Solo pays it too, so a job's slowdown counts it once as work (see
    :func:`simulate_control`); every further start counts against the job.
    ``node_ready_s``: readying a regrouping's new nodes before its moves start (a worker
    process on a node of the pool: measured 5.1 s cold in this project's failover bench).
    ``settle_s``: the live plane's regrouping settle delay
    (``ControlOptions.regroup_settle_s``). ``plan_s``: a round's planning, from its
    snapshot to its plan: placed jobs start, and the plan is applied if its groups did not
    change, only then, and the next round waits for it, as live: 0.36 s, the mean planning
    of the live rounds in the busiest window of the production trace's busiest three days
    (hours 150-156, 40 rounds on this project's 2-core machine; 0.06-0.36 s in the
    twelve windows). Replaying a live run, whose phases are
    the trace's divided by its time scale, each round plans and readies its nodes as long
    as the live round of its number did (:class:`Recorded`), and these model the rest. A
    move's transfer takes the time regrouping prices it at (``RegroupConfig.migration_s``:
    a fixed pause plus seconds per GB of the largest state one of its nodes holds), so the
    planner and the host agree."""

    job_start_s: float = 80.0
    node_ready_s: float = 5.1
    settle_s: float = 0.2
    plan_s: float = 0.36

    def __post_init__(self) -> None:
        if min(self.job_start_s, self.node_ready_s, self.settle_s, self.plan_s) < 0:
            raise ValueError("start-up, node, settle and planning times must be >= 0")


@dataclass(frozen=True)
class Recorded:
    """Times a live run measured, fed back so that the virtual clock meets the moments the
    live plane met (``rollmux replay`` compares their decisions): each granted phase's time
    by (job, phase, iteration), when each job's first session began (its start-up lasts
    until then), and the transfer of each of a job's moves, in order. What is not recorded
    is drawn from the profile or modelled (:class:`HostCosts`) as without it. So is each
    regrouping round's planning and readying of new nodes, by the round's number."""

    phases: Mapping[tuple[str, str, int], float] = field(default_factory=dict)
    running_at: Mapping[str, float] = field(default_factory=dict)
    transfers: Mapping[str, tuple[float, ...]] = field(default_factory=dict)
    rounds: Mapping[int, tuple[float, float]] = field(default_factory=dict)
    """Each regrouping round's planning and readying seconds, by its number from 1."""


@dataclass
class _Elastic:
    """An elastic rollout under way, as its driver would see it. Its head is ``width * (1 -
    share) * R`` node-seconds of work for a rollout of ``R`` seconds on its whole seat, done
    at one node-second per second on each node it holds (engines pulling requests from one
    queue: a widening raises the rate from that moment); its tail then takes ``share * R``
    seconds plus the resumption on the nodes it kept. Times are booked per *segment* (since
    the nodes it holds last changed), so busy time lands on the nodes that worked."""

    token: int
    share: float
    keep: int
    """Nodes its tail moves onto (the first it holds; all of them when it holds fewer)."""
    head_s: float
    """Node-seconds of head work in all."""
    left_s: float
    """Node-seconds of head work left at ``since``."""
    tail_s: float
    nodes: tuple[int, ...]
    since: float
    tail_at: float | None = None
    """When its tail moved (None: its head is still running)."""
    generation: int = 0
    """Of its head-end event: a widening puts the head's end earlier and the earlier event stale."""

    @staticmethod
    def begin(
        tail: RolloutTail, width: int, rollout_s: float, token: int, nodes: tuple[int, ...], now: float
    ) -> _Elastic:
        """A rollout of ``rollout_s`` on a seat ``width`` nodes wide, begun at ``now`` on ``nodes``."""
        head_s = width * (1 - tail.share) * rollout_s
        tail_s = tail.share * rollout_s + tail.resume_s
        return _Elastic(token, tail.share, tail.nodes, head_s, head_s, tail_s, nodes, now)

    def done(self, now: float) -> float:
        """The share of the rollout done by ``now``: the head's by its work, the tail's by its time."""
        if self.tail_at is None:
            left = max(0.0, self.left_s - len(self.nodes) * (now - self.since))
            return (1 - self.share) * (1 - left / self.head_s) if self.head_s > 0 else 1 - self.share
        tail = min(1.0, (now - self.tail_at) / self.tail_s) if self.tail_s > 0 else 1.0
        return 1 - self.share + self.share * tail


@dataclass
class _Tracked:
    """What the host knows of one job beyond the state machine: its trace entry (its spec as
    it submits itself, see ``TraceJob.submitted``), its phase in progress and its
    solo-equivalent work so far."""

    spec: JobSpec
    arrival: float
    departure: float
    rng: random.Random
    phase_started: float = 0.0
    phase_s: float = 0.0
    work_s: float = 0.0
    started: bool = False
    ended: bool = False
    moves: int = 0
    paused_s: float = 0.0
    colocated_s: float = 0.0
    dead: bool = False
    """Its driver was killed: what it was doing is not reported (until a new one starts)."""
    fault_at: float | None = None
    """When a fault last took its session (until its new session begins)."""
    lost_s: float = 0.0
    elastic: _Elastic | None = None
    """Its elastic rollout under way (None: its phase in progress, if any, holds its nodes to the end)."""


@dataclass
class ControlRun:
    """A virtual-clock run: the result in the simulator's terms, plus what only the live
    plane's state machine produces (phases granted, moves carried out, plans dropped)."""

    result: SimResult
    phases: int = 0
    moves_started: int = 0
    moves_done: int = 0
    plans_dropped: int = 0
    plans_waiting: int = 0
    """Plans whose new nodes did not fit the capacity: planned again once nodes were given back."""
    guard_moves: int = 0
    events: int = 0
    node_log: list[tuple[float, int, str, bool]] = field(default_factory=list)
    faults: FaultAccount | None = None
    decision_events: list[dict[str, object]] = field(default_factory=list)
    """The job events that record decisions (:data:`~rollmux.sim.decisions.DECISION_KINDS`)."""
    train_ends: dict[str, list[float]] = field(default_factory=dict)
    """Each job's training releases: its iteration periods (:mod:`rollmux.sim.periods`)."""
    turn_changes: list[float] = field(default_factory=list)
    """Moments a job joined or left its group's turns (:data:`~rollmux.sim.periods.CHANGES`)."""


class InvariantBroken(AssertionError):
    """The state machine broke what the host checks at every step: two jobs' phases held
    one node at once (its own fencing), a node was still held after every job left, and
    with faults: a placed job in no group or in two, an accepted job or a completed
    iteration missing after a control-plane restart."""


class _Journal:
    """The control plane's rows in a real store, written as the service writes them (the
    drained deltas, in order, in batches: group commit) and read back at a restart."""

    BATCH = 2_000

    def __init__(self) -> None:
        self.directory = tempfile.TemporaryDirectory(prefix="rollmux-journal-")
        self.store = Store(f"sqlite:///{Path(self.directory.name) / 'state.db'}")
        self.pending: list[Delta] = []

    def append(self, delta: Delta) -> None:
        self.pending.append(delta)
        if len(self.pending) >= self.BATCH:
            self.flush()

    def flush(self) -> None:
        if self.pending:
            self.store.apply(self.pending)
            self.pending = []

    def close(self) -> None:
        self.store.engine.dispose()
        self.directory.cleanup()


class _Host:
    def __init__(
        self,
        trace: Trace,
        policy: Policy,
        cost: CostModel,
        planning: Planning,
        regroup: RegroupConfig | None,
        costs: HostCosts,
        seed: int,
        slo_guard: bool,
        faults: Faults | None = None,
        recorded: Recorded | None = None,
        capacity: Capacity | None = None,
    ) -> None:
        self.policy, self.faults, self.recorded = policy, faults, recorded or Recorded()
        self.state = ControlState(Cluster(cost=cost, planning=planning), policy, lease_s=math.inf)
        if capacity is not None:
            self.state.set_capacity(capacity, 0.0)
        self.regroup, self.costs, self.slo_guard = regroup, costs, slo_guard
        self.move_model = regroup or RegroupConfig()
        self.regrouping = RegroupState()
        self.jobs = {
            j.spec.name: _Tracked(j.submitted, j.arrival, j.departure, random.Random(f"{seed}:{j.spec.name}"))
            for j in trace.jobs
        }
        self.result = SimResult(policy=policy.name, span_s=trace.end)
        self.result.jobs = {name: JobAccount(t.spec) for name, t in self.jobs.items()}
        self.run = ControlRun(self.result)
        self.queue: list[tuple[float, int, str, tuple]] = []
        self.order = itertools.count()
        self.now = 0.0
        self.round_at: float | None = None
        self.planning = False
        """A round is planning or readying its new nodes: a round due meanwhile follows it."""
        self.round_after_plan = False
        self.waiting_room = False
        """The last round's plan did not fit the capacity: planned again once nodes are given back."""
        self.rounds_planned = 0
        self.examined_at = -math.inf if regroup is not None else math.inf
        """When the last regrouping round took its snapshot: a job placed since waits for
        the next one before its driver starts, as in the live plane."""
        self.holders: dict[int, str] = {}
        self.held: dict[int, tuple[Pool, float]] = {}
        self.generation = 0
        """The control plane's incarnation: rounds and plans of an earlier one are dropped."""
        self.starting: set[str] = set()
        """Jobs whose driver is on its way (a restarted control plane does not start it twice)."""
        for j in trace.jobs:
            self.at(j.arrival, "arrive", j.spec.name)
            self.at(j.departure, "depart", j.spec.name)
        self.journal = _Journal() if faults else None
        if faults:
            self.run.faults = FaultAccount()
            for fault in schedule(faults, trace):
                self.at(fault.at, "fault", fault)

    # --- the clock ------------------------------------------------------------------------

    def at(self, when: float, kind: str, *args: object) -> None:
        heapq.heappush(self.queue, (when, next(self.order), kind, args))

    def drive(self, on_event: Callable[[], None] | None) -> ControlRun:
        handlers = {
            "arrive": self.arrive,
            "depart": self.depart,
            "started": self.started,
            "phase_end": self.phase_end,
            "head_end": self.head_end,
            "carried": self.carried,
            "round": self.round,
            "planned": self.planned,
            "apply": self.apply,
            "fault": self.fault,
            "lost": self.lost,
        }
        try:
            while self.queue:
                when, _, kind, args = heapq.heappop(self.queue)
                self.now = when
                handlers[kind](*args)
                self.settle()
                self.run.events += 1
                if self.faults:
                    self.check_seats()
                if on_event and kind in ("arrive", "depart"):
                    on_event()
        finally:
            if self.journal:
                self.journal.close()
        if self.held:
            raise InvariantBroken(f"nodes {sorted(self.held)} are still held after every job left")
        self.result.cost_rate.append((self.now, 0.0))
        if self.run.faults:
            self.charge_standby()
        return self.run

    def settle(self) -> None:
        """Act on what the last call changed: phases granted start, movers at their
        boundary send their state, the node log is paid, and a regrouping round is due
        after the events the live plane rounds after (:meth:`Delta.asks_for_round`)."""
        delta: Delta = self.state.drain()
        if self.journal:
            self.journal.append(delta)
        self.run.decision_events += [dataclasses.asdict(e) for e in delta.events if e.kind in DECISION_KINDS]
        self.run.turn_changes += [e.at for e in delta.events if e.kind in CHANGES]
        for entry in delta.phases:
            if entry.grant.phase == TRAIN and entry.outcome == "released":
                self.run.train_ends.setdefault(entry.grant.job, []).append(entry.ended_at)
            for node in entry.grant.nodes:
                if self.holders.get(node) == entry.grant.job:
                    del self.holders[node]
        for name in sorted(delta.wake):
            self.granted(name)
        for name in sorted(delta.movable):
            job = self.state.jobs.get(name)
            if job is not None and job.move is not None:
                move_s = self.transfer_s(name, job.moves, job.spec)
                self.at(self.now + move_s, "carried", name, job.epoch, job.move.decided_at)
        if delta.nodes:
            self.pay(delta)
        room = self.waiting_room and any(not entry.held for entry in delta.nodes)
        if room:
            self.waiting_room = False
        if delta.asks_for_round() or room:
            self.round_soon()

    def transfer_s(self, name: str, moves: int, spec: JobSpec) -> float:
        """The transfer of a job's ``moves``-th move: as recorded, else as regrouping prices it."""
        recorded = self.recorded.transfers.get(name, ())
        return recorded[moves - 1] if 0 < moves <= len(recorded) else self.move_model.migration_s(spec)

    def pay(self, delta: Delta) -> None:
        for entry in delta.nodes:
            self.run.node_log.append((entry.at, entry.node, entry.pool.value, entry.held))
            if entry.held:
                self.held[entry.node] = (entry.pool, entry.at)
                continue
            pool, since = self.held.pop(entry.node)
            seconds = entry.at - since
            self.result.pools[pool].node_seconds += seconds
            self.result.cost_usd += self.state.cluster.cost.price(pool) * seconds / HOUR
        rate = sum(self.state.cluster.cost.price(pool) for pool, _ in self.held.values())
        self.result.cost_rate.append((self.now, rate))
        counts = {pool: sum(1 for p, _ in self.held.values() if p is pool) for pool in Pool}
        self.result.nodes_over_time.append((self.now, counts[Pool.ROLLOUT], counts[Pool.TRAIN]))
        for pool in Pool:
            self.result.pools[pool].peak_nodes = max(self.result.pools[pool].peak_nodes, counts[pool])

    # --- jobs -----------------------------------------------------------------------------

    def arrive(self, name: str) -> None:
        self.state.submit(self.jobs[name].spec, MANAGED, self.now)
        if self.regroup is None:
            self.start_placed()

    def start_placed(self, except_: frozenset[str] = frozenset()) -> None:
        """Start the drivers of placed jobs not started yet that a regrouping round has
        seen (all, without regrouping) and that it does not re-seat (``except_``)."""
        for job in list(self.state.jobs.values()):
            seen = job.seen_by_round(self.examined_at)
            if job.unstarted and seen and job.name not in except_ and job.name not in self.starting:
                self.state.claim(job.name)
                self.starting.add(job.name)
                self.at(self.now + self.start_s(job.name), "started", job.name)

    def start_s(self, name: str) -> float:
        """A job's first start-up: until its recorded first session, else the modelled one."""
        recorded = self.recorded.running_at.get(name)
        return self.costs.job_start_s if recorded is None else max(recorded - self.now, 0.0)

    def started(self, name: str) -> None:
        tracked = self.jobs[name]
        self.starting.discard(name)
        if tracked.ended or name not in self.state.jobs:
            return
        tracked.dead = False
        self.down(tracked)
        job = self.state.begin_session(name, self.now, "virtual")
        self.state.activate(name, job.epoch, None, self.now)
        tracked.started = True
        self.ask(name)

    def ask(self, name: str) -> None:
        job = self.state.jobs[name]
        if job.state == RUNNING and job.grant is None and job.request is None and job.move is None:
            self.state.acquire(name, job.next_phase, job.epoch, self.now)

    def granted(self, name: str) -> None:
        """A phase granted, or an elastic rollout under way widened (the same token again)."""
        job = self.state.jobs.get(name)
        grant = job.grant if job is not None else None
        if job is None or grant is None:
            return  # revoked in the same step (its session lost to a fault)
        for node in grant.nodes:
            other = self.holders.get(node)
            if other is not None and other != name:
                raise InvariantBroken(f"node {node} granted to {name} at {self.now} while {other} holds it")
            self.holders[node] = name
        tracked = self.jobs[name]
        if tracked.dead:
            return  # granted to a killed driver: the nodes idle until its lease runs out
        run = tracked.elastic
        if run is not None and run.token == grant.token:
            self.widened(name, run, grant.nodes)
            return
        seat = self.state.seat(name)
        true = colocated_phases(tracked.spec) if seat is not None and seat.colocated else None
        true = true or (tracked.spec.rollout, tracked.spec.train)
        time = self.recorded.phases.get((name, grant.phase, job.iteration))
        if time is None:
            time = (true[0] if grant.phase == ROLLOUT else true[1]).sample(tracked.rng)
        tracked.phase_started, tracked.phase_s = self.now, time
        tail = job.spec.tail
        granting = self.granting_seat(job) if grant.phase == ROLLOUT and tail is not None else None
        if tail is not None and granting is not None and granting.elastic:
            tracked.elastic = _Elastic.begin(tail, len(granting.rollout), time, grant.token, grant.nodes, self.now)
            self.head_due(name, tracked.elastic)
        else:
            self.at(self.now + time, "phase_end", name, grant.token)

    def granting_seat(self, job: Job) -> JobNodes:
        """The nodes of the seat whose turns granted the job its phase, and whether its
        rollout is elastic: as its group's turns have it, or, for a job that began to move
        in the same step (it left them), as its old seat makes it (a co-located seat names
        its training nodes for its rollout and moves no tail)."""
        if job.move is None:
            return self.state.turns[self.state.cluster.group_of(job.name).id].nodes[job.name]
        move, tail = job.move, job.spec.tail
        colocated = move.rollout_from == move.train_from
        elastic = tail is not None and not colocated and tail.applies(len(move.rollout_from))
        return JobNodes(move.rollout_from, move.train_from, elastic)

    def head_due(self, name: str, run: _Elastic) -> None:
        """The head's end at the rate of the nodes it holds now (an earlier one goes stale)."""
        run.generation += 1
        self.at(self.now + run.left_s / len(run.nodes), "head_end", name, run.token, run.generation)

    def segment(self, run: _Elastic) -> None:
        """Book the nodes' work since the last change of the nodes held: busy, and head work done."""
        self.busy(run.nodes, self.now - run.since)
        if run.tail_at is None:
            run.left_s = max(0.0, run.left_s - len(run.nodes) * (self.now - run.since))
        run.since = self.now

    def widened(self, name: str, run: _Elastic, nodes: tuple[int, ...]) -> None:
        """More nodes joined the rollout: its head goes on faster from now."""
        self.segment(run)
        run.nodes = nodes
        if run.tail_at is None:
            self.head_due(name, run)

    def head_end(self, name: str, token: int, generation: int) -> None:
        """The head's work is done: its tail moves onto the first nodes it holds, as the live
        driver does at its threshold, and the others are shed; it ends a tail later."""
        job, tracked = self.state.jobs.get(name), self.jobs[name]
        run = tracked.elastic
        if job is None or job.grant is None or job.grant.token != token or tracked.dead:
            return  # revoked meanwhile (ended, lost), or its driver was killed
        if run is None or run.token != token or run.generation != generation or run.tail_at is not None:
            return  # put earlier by a widening
        self.segment(run)
        keep = job.grant.nodes[: run.keep]
        run.nodes = self.state.shed(name, ROLLOUT, job.epoch, token, keep, self.now).nodes
        run.tail_at = self.now
        self.at(self.now + run.tail_s, "phase_end", name, token)

    def phase_end(self, name: str, token: int) -> None:
        job = self.state.jobs.get(name)
        if job is None or job.grant is None or job.grant.token != token or self.jobs[name].dead:
            return  # revoked meanwhile (ended, lost), or its driver was killed
        phase, tracked = job.grant.phase, self.jobs[name]
        tracked.work_s += self.solo_share(tracked, phase)
        held_s = tracked.phase_s
        if tracked.elastic is not None:
            self.segment(tracked.elastic)
            tracked.elastic, held_s = None, self.now - tracked.phase_started
        else:
            self.busy(job.grant.nodes, tracked.phase_s)
        seat = self.state.seat(name)
        if seat is not None and seat.colocated:
            tracked.colocated_s += tracked.phase_s
        self.state.release(name, phase, job.epoch, token, PhaseTiming(busy_s=held_s), self.now)
        self.run.phases += 1
        if name in self.state.jobs:
            self.ask(name)
        if phase == TRAIN and self.slo_guard:
            self.guard()

    def busy(self, nodes: tuple[int, ...], seconds: float) -> None:
        """Book a phase's time on its nodes as busy (the pools' busy fractions)."""
        for node in nodes:
            self.result.pools[self.held[node][0]].busy_node_seconds += seconds

    def cut_short(self, tracked: _Tracked, nodes: tuple[int, ...], seconds: float) -> float:
        """The phase in progress stops now: its time so far (``seconds``; an elastic
        rollout's since its last segment) is booked busy. Returns the share of it done."""
        run, tracked.elastic = tracked.elastic, None
        if run is None:
            self.busy(nodes, seconds)
            return min(1.0, (self.now - tracked.phase_started) / tracked.phase_s)
        self.segment(run)
        return run.done(self.now)

    @staticmethod
    def solo_share(tracked: _Tracked, phase: str) -> float:
        """The solo-equivalent work of one completed phase: its mean alone."""
        return tracked.spec.rollout.mean if phase == ROLLOUT else tracked.spec.train.mean

    def depart(self, name: str) -> None:
        """The job's work is done at its trace departure (as in the fast simulator): it ends
        and leaves, its nodes freed; a phase in progress counts for its share done."""
        tracked = self.jobs[name]
        tracked.ended = True
        job = self.state.jobs.get(name)
        self.down(tracked)
        if job is None:  # it failed (out of restarts) before its end
            self.account(name)
            return
        if job.grant is not None and tracked.phase_s > 0 and not tracked.dead:
            done = self.cut_short(tracked, job.grant.nodes, self.now - tracked.phase_started)
            tracked.work_s += done * self.solo_share(tracked, job.grant.phase)
        self.state.end(name, "done", self.now)
        tracked.moves, tracked.paused_s = job.moves, job.paused_s
        self.account(name)

    def account(self, name: str) -> None:
        """The job's lifetime in the simulator's terms: its time from arrival to departure,
        and its work (its one cold start counted as work: Solo pays it too)."""
        tracked, account = self.jobs[name], self.result.jobs[name]
        account.seconds = tracked.departure - tracked.arrival
        account.work_s = tracked.work_s + (self.costs.job_start_s if tracked.started else 0.0)
        account.paused_s, account.moves, account.colocated_s = tracked.paused_s, tracked.moves, tracked.colocated_s
        account.lost_s = tracked.lost_s
        self.result.migrations += tracked.moves
        account.within_slo_s = account.seconds if account.met_slo else 0.0

    # --- moves ----------------------------------------------------------------------------

    def round_soon(self) -> None:
        """A regrouping round a settle delay after the last of a burst of events: as the
        live plane does, each event puts the round due off to a settle delay from it."""
        self.round_at = self.now + self.costs.settle_s
        self.at(self.round_at, "round", self.generation)

    def round(self, generation: int) -> None:
        if generation != self.generation or self.round_at != self.now:
            return  # put off by a later event (or planned by an earlier incarnation)
        self.round_at = None
        if self.regroup is None:
            return
        if self.planning:
            self.round_after_plan = True  # one round at a time: this one follows it
            return
        self.waiting_room = False
        plan = self.plan(self.state.movable_view())
        snapshot = copy.deepcopy(self.state.cluster) if plan is not None else None
        self.rounds_planned += 1
        plan_s, ready_s = self.round_times(self.rounds_planned)
        self.planning = True
        if plan_s > 0:
            self.at(self.now + plan_s, "planned", plan, snapshot, self.now, self.generation, ready_s)
            return
        self.planned(plan, snapshot, self.now, self.generation, ready_s)

    def round_times(self, number: int) -> tuple[float, float]:
        """A round's planning, and readying of its new nodes: as recorded, else modelled."""
        return self.recorded.rounds.get(number, (self.costs.plan_s, self.costs.node_ready_s))

    def planned(
        self, plan: RegroupPlan | None, snapshot: Cluster | None, taken: float, generation: int, ready_s: float
    ) -> None:
        """A round's plan is ready: the jobs placed before its snapshot may start (except
        those it re-seats), and its moves start once their new nodes are ready. The round
        lasts until then, as live: a round due meanwhile follows it."""
        if generation != self.generation:
            return  # planned by a control plane that has restarted since
        self.examined_at = taken
        self.result.regroup_rounds = self.regrouping.rounds
        self.result.regroup_rounds_exhausted = self.regrouping.exhausted_rounds
        self.result.regroup_peak_cached = max(self.result.regroup_peak_cached, self.regrouping.cached)
        if plan is None or snapshot is None:
            self.start_placed()
            self.round_over()
            return
        if not self.state.still_movable(plan, snapshot):
            self.drop()
            return
        pools = new_node_pools(snapshot, plan)
        if self.state.shortfall(pools):
            # As live: its jobs would stop and wait for nodes only moves free; planned
            # again once nodes are given back.
            self.run.plans_waiting += 1
            self.waiting_room = True
            self.start_placed()
            self.round_over()
            return
        self.start_placed(frozenset(job.name for job in plan.moved))
        self.at(self.now + (ready_s if pools else 0.0), "apply", plan, snapshot, self.generation)

    def round_over(self) -> None:
        self.planning = False
        if self.round_after_plan:
            self.round_after_plan = False
            self.round_soon()

    def drop(self) -> None:
        """Its groups changed while it was made or its nodes readied: planned again."""
        self.run.plans_dropped += 1
        self.start_placed()
        self.round_over()
        self.round_soon()

    def plan(self, view: Cluster) -> RegroupPlan | None:
        assert self.regroup is not None
        return plan_regroup(view, self.regroup, self.regrouping, self.state.progress(view, self.now))

    def apply(self, plan: RegroupPlan, snapshot: Cluster, generation: int) -> None:
        if generation != self.generation:
            return  # planned by a control plane that has restarted since
        if not self.state.still_movable(plan, snapshot):
            self.drop()
            return
        moved = self.state.start_regroup(plan, self.now)
        self.run.moves_started += sum(1 for name in moved if self.jobs[name].started)
        self.start_placed()
        self.round_over()

    def carried(self, name: str, epoch: int, decided_at: float) -> None:
        if self.state.finish_move(name, epoch, decided_at, 0, self.now):
            self.run.moves_done += 1
            self.ask(name)

    def guard(self) -> None:
        moved = self.state.guard(self.now)
        self.run.guard_moves += len(moved)

    # --- faults ---------------------------------------------------------------------------

    def fault(self, fault: Fault) -> None:
        assert self.faults is not None and self.run.faults is not None
        account = self.run.faults
        if fault.kind == PLANE_RESTART:
            self.restart_plane()
        elif fault.kind == NODE_FAILURE:
            if not self.fail_node(fault.pick):
                account.missed += 1
                return
        elif not self.running(fault.job):
            account.missed += 1
            return
        elif fault.kind == DRIVER_KILL:
            self.interrupt(fault.job)
            self.jobs[fault.job].dead = True
            reason = f"lease expired: no heartbeat for {self.faults.lease_s:g} s (driver killed)"
            self.at(self.now + self.faults.lease_s, "lost", fault.job, reason, True, 0.0)
        else:
            assert fault.kind == LEASE_LOSS
            self.interrupt(fault.job)
            self.lost(fault.job, f"lease expired: no heartbeat for {self.faults.lease_s:g} s (partition)", True, 0.0)
        account.injected[fault.kind] += 1

    def running(self, name: str) -> bool:
        """Whether a fault of the job strikes something: its driver runs in its turns."""
        job = self.state.jobs.get(name)
        return job is not None and job.in_turns and not self.jobs[name].ended and not self.jobs[name].dead

    def interrupt(self, name: str) -> None:
        """The job's session is about to go: what it was doing is lost and done again from
        its last checkpoint (each iteration): the phase in progress, and the rollout of an
        iteration whose training had not ended."""
        assert self.run.faults is not None
        job, tracked = self.state.jobs[name], self.jobs[name]
        redo = 0.0
        if job.grant is not None and tracked.phase_s > 0:
            spent = min(self.now - tracked.phase_started, tracked.phase_s)
            redo += self.cut_short(tracked, job.grant.nodes, spent) * self.solo_share(tracked, job.grant.phase)
        training = job.grant.phase == TRAIN if job.grant is not None else job.next_phase == TRAIN
        if training:
            tracked.work_s -= tracked.spec.rollout.mean
            redo += tracked.spec.rollout.mean
        tracked.lost_s += redo
        self.run.faults.redo_s += redo
        self.run.faults.interruptions += 1
        tracked.fault_at = self.now

    def down(self, tracked: _Tracked) -> None:
        """The job's time from its last fault to now (its new session, or its end) was lost."""
        if tracked.fault_at is None or self.run.faults is None:
            return
        tracked.lost_s += self.now - tracked.fault_at
        self.run.faults.down_s += self.now - tracked.fault_at
        tracked.fault_at = None

    def lost(self, name: str, reason: str, counted: bool, resume_after_s: float) -> None:
        """The control plane loses the job's session (``reason``) and restarts it: after its
        back-off, ``resume_after_s`` (a standby taking a failed node over) and a cold start."""
        assert self.run.faults is not None
        tracked, job = self.jobs[name], self.state.jobs.get(name)
        if job is None or tracked.ended or job.state != RUNNING:
            return
        self.state.lose(name, self.now, reason)
        if not self.state.restart(name, self.now, counted):
            self.run.faults.failed_jobs.append(name)
            return
        job = self.state.jobs[name]
        backoff = max(0.0, (job.restart_at or self.now) - self.now)
        self.state.claim(name)
        self.starting.add(name)
        self.at(self.now + backoff + resume_after_s + self.costs.job_start_s, "started", name)

    def fail_node(self, pick: float) -> bool:
        """A held node fails: every running job seated on it loses its session now (not
        counted against it) and resumes once a standby has taken the node over."""
        assert self.faults is not None
        nodes = sorted(self.held)
        if not nodes:
            return False
        node = nodes[int(pick * len(nodes))]
        group = next(
            (g for g in self.state.cluster.groups.values() if node in (*g.rollout_nodes, *g.train_nodes)), None
        )
        seated = [m.job.name for m in group.members if node in (*m.rollout_nodes, *m.train_nodes)] if group else []
        struck = [name for name in seated if self.running(name)]
        for name in struck:
            self.interrupt(name)
            self.lost(name, f"node {node} failed: a standby takes it over", False, self.faults.failover_s)
        return bool(struck)

    def restart_plane(self) -> None:
        """Drop the state machine and rebuild it from the journal's rows, as the service does
        on start; check that no accepted job and no completed iteration was lost."""
        assert self.journal is not None and self.faults is not None
        self.journal.flush()
        before = {name: job.iteration for name, job in self.state.jobs.items()}
        cluster = self.state.cluster
        capacity = self.state.capacity
        self.state = ControlState.restore(
            self.journal.store.load(),
            cluster.cost,
            cluster.planning,
            self.policy,
            self.now,
            lease_s=math.inf,
            capacity=capacity,
        )
        missing = sorted(set(before) - set(self.state.jobs))
        if missing:
            raise InvariantBroken(
                f"jobs {missing} were accepted but are gone after the control plane restarted at {self.now}"
            )
        behind = sorted(name for name, iteration in before.items() if self.state.jobs[name].iteration < iteration)
        if behind:
            raise InvariantBroken(
                f"jobs {behind} lost completed iterations when the control plane restarted at {self.now}"
            )
        self.generation += 1
        self.regrouping, self.round_at = RegroupState(), None
        self.planning = self.round_after_plan = self.waiting_room = False
        for job in list(self.state.jobs.values()):
            if job.name in self.starting:
                self.state.claim(job.name)
            elif job.state == RUNNING and job.grant is None and not self.jobs[job.name].dead:
                self.ask(job.name)
        self.round_soon()

    def check_seats(self) -> None:
        """Every placed job sits in exactly one group, as the state machine records it."""
        assert self.run.faults is not None
        seen: dict[str, int] = {}
        for group in self.state.cluster.groups.values():
            for member in group.members:
                name = member.job.name
                if name in seen:
                    raise InvariantBroken(f"job {name} sits in groups {seen[name]} and {group.id} at {self.now}")
                seen[name] = group.id
        for job in self.state.jobs.values():
            if job.state not in ENDED_STATES and job.placed_at is not None and job.name not in seen:
                raise InvariantBroken(f"job {job.name} is {job.state} but in no group at {self.now}")
        self.run.faults.checked_steps += 1

    def charge_standby(self) -> None:
        """The standby nodes kept for failed nodes, paid over the whole run."""
        assert self.faults is not None and self.run.faults is not None
        cost = self.state.cluster.cost
        hourly = self.faults.standby_per_pool * sum(cost.price(pool) for pool in Pool)
        self.run.faults.standby_usd = hourly * self.result.span_s / HOUR
        self.result.cost_usd += self.run.faults.standby_usd


def simulate_control(
    trace: Trace,
    policy: Policy,
    cost: CostModel | None = None,
    planning: Planning = DEFAULT_PLANNING,
    regroup: RegroupConfig | None = None,
    costs: HostCosts | None = None,
    seed: int = 0,
    slo_guard: bool = True,
    on_event: Callable[[], None] | None = None,
    faults: Faults | None = None,
    recorded: Recorded | None = None,
    capacity: Capacity | None = None,
) -> ControlRun:
    """Replay ``trace`` through the control plane's state machine under a virtual clock.

    Each job is submitted at its arrival and ends at its departure; its phases take times
    drawn from its profile (seeded by ``seed`` and its name). A job's slowdown is its time
    from arrival to departure over its solo-equivalent work (completed phases at their
    solo mean, the phase in progress for its share, plus one cold start, which Solo pays
    too): queueing, further start-ups, moves and the turns it waited all count against it.
    ``on_event`` is called at every arrival and departure (progress). ``faults`` injects
    seeded faults (:mod:`rollmux.sim.faults`) and checks the invariants at every step.
    ``recorded``: a live run's measured times, used instead of drawn and modelled ones.
    ``capacity``: the nodes the cluster offers (None: as many as asked for); a job that
    does not fit waits in the queue, and a round whose new nodes do not fit waits for room,
    as live."""
    check_phase_budget(trace)
    host = _Host(
        trace,
        policy,
        cost or CostModel(),
        planning,
        regroup,
        costs or HostCosts(),
        seed,
        slo_guard,
        faults,
        recorded,
        capacity,
    )
    return host.drive(on_event)


def check_phase_budget(trace: Trace, limit: int = MAX_PHASES) -> None:
    """Refuse a trace whose phases the control engine could not replay in bounded time:
    a job with no phase time at all (its phases would follow each other without end at
    one instant), or more than ``limit`` phases in all, counted at each job's solo pace
    (a job in a group runs fewer)."""
    total = 0.0
    for j in trace.jobs:
        iteration = j.spec.solo_iteration()
        if iteration <= 0:
            raise ValueError(f"job {j.spec.name}: rollout and training take 0 s; the control engine cannot replay it")
        total += 2 * (j.departure - j.arrival) / iteration
    if total > limit:
        raise ValueError(
            f"the trace has about {total:,.0f} phases at its jobs' solo pace, more than the control engine's "
            f"{limit:,} (rollmux.sim.control_host.MAX_PHASES); replay it with --engine fast"
        )
