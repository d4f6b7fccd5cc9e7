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

Costs it charges that the fast simulator does not (:class:`HostCosts`, each named by its
source): a job's cold start before it first runs, readying a regrouping's new nodes, and
the transfer of a moved job's state. Nodes are paid from the moment the state machine holds
them to the moment it releases them (draining nodes that still keep a mover's state
included), so cost comes from the state machine's own node log, not from a model.

Pure of I/O and wall clock; the same inputs and seed give the same result.
"""

from __future__ import annotations

import copy
import heapq
import itertools
import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field

from rollmux.core.cluster import Cluster
from rollmux.core.configs import colocated_phases
from rollmux.core.control import RUNNING, ControlState, Delta, PhaseTiming
from rollmux.core.placement import Policy
from rollmux.core.regroup import RegroupConfig, RegroupPlan, RegroupState, apply_regroup, plan_regroup
from rollmux.core.roundrobin import ROLLOUT, TRAIN
from rollmux.core.spec import DEFAULT_PLANNING, CostModel, JobSpec, Planning, Pool
from rollmux.inputs.trace import Trace
from rollmux.sim.simulator import HOUR, JobAccount, SimResult

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
    (``ControlOptions.regroup_settle_s``). A move's transfer takes the time regrouping
    prices it at (``RegroupConfig.migration_s``: a fixed pause plus seconds per GB of the
    largest state one of its nodes holds), so the planner and the host agree."""

    job_start_s: float = 80.0
    node_ready_s: float = 5.1
    settle_s: float = 0.2

    def __post_init__(self) -> None:
        if min(self.job_start_s, self.node_ready_s, self.settle_s) < 0:
            raise ValueError("start-up, node and settle times must be >= 0")


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


@dataclass
class ControlRun:
    """A virtual-clock run: the result in the simulator's terms, plus what only the live
    plane's state machine produces (phases granted, moves carried out, plans dropped)."""

    result: SimResult
    phases: int = 0
    moves_started: int = 0
    moves_done: int = 0
    plans_dropped: int = 0
    guard_moves: int = 0
    events: int = 0
    node_log: list[tuple[float, int, str, bool]] = field(default_factory=list)


class InvariantBroken(AssertionError):
    """The state machine broke what the host checks at every step: two jobs' phases held
    one node at once (its own fencing), or a node was still held after every job left."""


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
    ) -> None:
        self.state = ControlState(Cluster(cost=cost, planning=planning), policy, lease_s=math.inf)
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
        self.examined_at = -math.inf if regroup is not None else math.inf
        """When the last regrouping round took its snapshot: a job placed since waits for
        the next one before its driver starts, as in the live plane."""
        self.holders: dict[int, str] = {}
        self.held: dict[int, tuple[Pool, float]] = {}
        for j in trace.jobs:
            self.at(j.arrival, "arrive", j.spec.name)
            self.at(j.departure, "depart", j.spec.name)

    # --- the clock ------------------------------------------------------------------------

    def at(self, when: float, kind: str, *args: object) -> None:
        heapq.heappush(self.queue, (when, next(self.order), kind, args))

    def drive(self, on_event: Callable[[], None] | None) -> ControlRun:
        handlers = {
            "arrive": self.arrive,
            "depart": self.depart,
            "started": self.started,
            "phase_end": self.phase_end,
            "carried": self.carried,
            "round": self.round,
            "apply": self.apply,
        }
        while self.queue:
            when, _, kind, args = heapq.heappop(self.queue)
            self.now = when
            handlers[kind](*args)
            self.settle()
            self.run.events += 1
            if on_event and kind in ("arrive", "depart"):
                on_event()
        if self.held:
            raise InvariantBroken(f"nodes {sorted(self.held)} are still held after every job left")
        self.result.cost_rate.append((self.now, 0.0))
        return self.run

    def settle(self) -> None:
        """Act on what the last call changed: phases granted start, movers at their
        boundary send their state, and the node log is paid."""
        delta: Delta = self.state.drain()
        for entry in delta.phases:
            for node in entry.grant.nodes:
                if self.holders.get(node) == entry.grant.job:
                    del self.holders[node]
        for name in sorted(delta.wake):
            self.granted(name)
        for name in sorted(delta.movable):
            job = self.state.jobs.get(name)
            if job is not None and job.move is not None:
                move_s = self.move_model.migration_s(job.spec)
                self.at(self.now + move_s, "carried", name, job.epoch, job.move.decided_at)
        if delta.nodes:
            self.pay(delta)

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
        self.round_soon()
        if self.regroup is None:
            self.start_placed()

    def start_placed(self, except_: frozenset[str] = frozenset()) -> None:
        """Start the drivers of placed jobs not started yet that a regrouping round has
        seen (all, without regrouping) and that it does not re-seat (``except_``)."""
        for job in list(self.state.jobs.values()):
            seen = job.placed_at is not None and job.placed_at <= self.examined_at
            if job.unstarted and seen and job.name not in except_:
                self.state.claim(job.name)
                self.at(self.now + self.costs.job_start_s, "started", job.name)

    def started(self, name: str) -> None:
        tracked = self.jobs[name]
        if tracked.ended:
            return
        job = self.state.begin_session(name, self.now, "virtual")
        self.state.activate(name, job.epoch, None, self.now)
        tracked.started = True
        self.ask(name)
        self.round_soon()

    def ask(self, name: str) -> None:
        job = self.state.jobs[name]
        if job.state == RUNNING and job.grant is None and job.request is None and job.move is None:
            self.state.acquire(name, job.next_phase, job.epoch, self.now)

    def granted(self, name: str) -> None:
        job = self.state.jobs[name]
        grant = job.grant
        assert grant is not None
        for node in grant.nodes:
            other = self.holders.get(node)
            if other is not None and other != name:
                raise InvariantBroken(f"node {node} granted to {name} at {self.now} while {other} holds it")
            self.holders[node] = name
        tracked = self.jobs[name]
        seat = self.state.seat(name)
        true = colocated_phases(tracked.spec) if seat is not None and seat.colocated else None
        true = true or (tracked.spec.rollout, tracked.spec.train)
        time = (true[0] if grant.phase == ROLLOUT else true[1]).sample(tracked.rng)
        tracked.phase_started, tracked.phase_s = self.now, time
        self.at(self.now + time, "phase_end", name, grant.token)

    def phase_end(self, name: str, token: int) -> None:
        job = self.state.jobs.get(name)
        if job is None or job.grant is None or job.grant.token != token:
            return  # revoked meanwhile (ended, lost)
        phase, tracked = job.grant.phase, self.jobs[name]
        tracked.work_s += self.solo_share(tracked, phase)
        self.busy(job.grant.nodes, tracked.phase_s)
        seat = self.state.seat(name)
        if seat is not None and seat.colocated:
            tracked.colocated_s += tracked.phase_s
        self.state.release(name, phase, job.epoch, token, PhaseTiming(busy_s=tracked.phase_s), self.now)
        self.run.phases += 1
        if name in self.state.jobs:
            self.ask(name)
        if phase == TRAIN and self.slo_guard:
            self.guard()

    def busy(self, nodes: tuple[int, ...], seconds: float) -> None:
        """Book a phase's time on its nodes as busy (the pools' busy fractions)."""
        for node in nodes:
            self.result.pools[self.held[node][0]].busy_node_seconds += seconds

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
        if job is None:
            return
        if job.grant is not None and tracked.phase_s > 0:
            done = min(1.0, (self.now - tracked.phase_started) / tracked.phase_s)
            tracked.work_s += done * self.solo_share(tracked, job.grant.phase)
            self.busy(job.grant.nodes, self.now - tracked.phase_started)
        self.state.end(name, "done", self.now)
        tracked.moves, tracked.paused_s = job.moves, job.paused_s
        self.account(name)
        self.round_soon()

    def account(self, name: str) -> None:
        """The job's lifetime in the simulator's terms: its time from arrival to departure,
        and its work (its one cold start counted as work: Solo pays it too)."""
        tracked, account = self.jobs[name], self.result.jobs[name]
        account.seconds = tracked.departure - tracked.arrival
        account.work_s = tracked.work_s + (self.costs.job_start_s if tracked.started else 0.0)
        account.paused_s, account.moves, account.colocated_s = tracked.paused_s, tracked.moves, tracked.colocated_s
        self.result.migrations += tracked.moves
        account.within_slo_s = account.seconds if account.met_slo else 0.0

    # --- moves ----------------------------------------------------------------------------

    def round_soon(self) -> None:
        """A regrouping round a settle delay from now, unless one is already due by then."""
        if self.round_at is not None and self.round_at <= self.now + self.costs.settle_s:
            return
        self.round_at = self.now + self.costs.settle_s
        self.at(self.round_at, "round")

    def round(self) -> None:
        if self.round_at is None or self.now < self.round_at:
            return
        self.round_at = None
        if self.regroup is None:
            return
        snapshot, view = copy.deepcopy(self.state.cluster), self.state.movable_view()
        plan = self.plan(view)
        self.examined_at = self.now
        self.result.regroup_rounds = self.regrouping.rounds
        self.result.regroup_rounds_exhausted = self.regrouping.exhausted_rounds
        self.result.regroup_peak_cached = max(self.result.regroup_peak_cached, self.regrouping.cached)
        if plan is None:
            self.start_placed()
            return
        self.start_placed(frozenset(job.name for job in plan.moved))
        ready = self.costs.node_ready_s if self.new_nodes(plan, snapshot) else 0.0
        self.at(self.now + ready, "apply", plan, snapshot)

    def plan(self, view: Cluster) -> RegroupPlan | None:
        assert self.regroup is not None
        return plan_regroup(view, self.regroup, self.regrouping, self.state.progress(view, self.now))

    @staticmethod
    def new_nodes(plan: RegroupPlan, snapshot: Cluster) -> bool:
        trial = copy.deepcopy(snapshot)
        apply_regroup(trial, plan)
        return any(node not in snapshot.node_pool for node in trial.node_pool)

    def apply(self, plan: RegroupPlan, snapshot: Cluster) -> None:
        if not self.state.still_movable(plan, snapshot):
            self.run.plans_dropped += 1
            self.start_placed()
            self.round_soon()
            return
        moved = self.state.start_regroup(plan, self.now)
        self.run.moves_started += sum(1 for name in moved if self.jobs[name].started)
        self.start_placed()

    def carried(self, name: str, epoch: int, decided_at: float) -> None:
        if self.state.finish_move(name, epoch, decided_at, 0, self.now):
            self.run.moves_done += 1
            self.ask(name)
            self.round_soon()

    def guard(self) -> None:
        moved = self.state.guard(self.now)
        self.run.guard_moves += len(moved)


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
) -> ControlRun:
    """Replay ``trace`` through the control plane's state machine under a virtual clock.

    Each job is submitted at its arrival and ends at its departure; its phases take times
    drawn from its profile (seeded by ``seed`` and its name). A job's slowdown is its time
    from arrival to departure over its solo-equivalent work (completed phases at their
    solo mean, the phase in progress for its share, plus one cold start, which Solo pays
    too): queueing, further start-ups, moves and the turns it waited all count against it.
    ``on_event`` is called at every arrival and departure (progress)."""
    check_phase_budget(trace)
    host = _Host(trace, policy, cost or CostModel(), planning, regroup, costs or HostCosts(), seed, slo_guard)
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
