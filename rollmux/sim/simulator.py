"""Trace-driven simulator: replays arrivals and departures against a placement policy.

The simulator is one of the two drivers of the core. It owns a virtual clock and an
event list; the cluster and the policy decide. Between two events the cluster is
constant, so every metric is an exact integral of piecewise-constant rates.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from rollmux.core.cluster import Cluster
from rollmux.core.placement import Policy, place
from rollmux.core.regroup import JobProgress, RegroupConfig, RegroupState, apply_regroup, plan_regroup
from rollmux.core.roundrobin import Seat, realised_periods
from rollmux.core.spec import DEFAULT_PLANNING, HOUR, CostModel, JobSpec, Planning, Pool, RolloutTail
from rollmux.inputs.trace import Trace, TraceJob
from rollmux.sim.failures import FailureAccount, FailureInjector, FailureModel, Interruption

_SLO_TOL = 1e-9


@dataclass(frozen=True)
class Event:
    time: float
    arrival: bool
    job: TraceJob

    def sort_key(self) -> tuple[float, int]:
        # Departures first at equal times: freed nodes are there for the arrival.
        return (self.time, 1 if self.arrival else 0)


def events(trace: Trace) -> list[Event]:
    out = [Event(j.arrival, True, j) for j in trace.jobs] + [Event(j.departure, False, j) for j in trace.jobs]
    return sorted(out, key=Event.sort_key)


@dataclass
class JobAccount:
    """What happened to one job: time held, solo-equivalent work done (migration pauses
    and failure losses subtracted), pauses, time lost to node failures, and time within SLO."""

    spec: JobSpec
    seconds: float = 0.0
    work_s: float = 0.0
    within_slo_s: float = 0.0
    paused_s: float = 0.0
    lost_s: float = 0.0
    """Seconds without progress after node failures: recovery downtime plus progress redone."""
    colocated_s: float = 0.0
    """Seconds seated co-located (both phases on training nodes)."""
    moves: int = 0
    """Migrations with a pause (a job moved before it started moves for free)."""

    @property
    def colocated_estimated(self) -> bool:
        """It ran co-located on times the planner estimated (its profile gave none)."""
        return self.colocated_s > 0 and self.spec.colocated is None

    @property
    def slowdown(self) -> float:
        """Lifetime slowdown: wall time over the solo time of the iterations it ran, so
        every pause counts; unbounded for a job that held time but kept no work."""
        if self.work_s > 0:
            return self.seconds / self.work_s
        return math.inf if self.seconds > 0 else 1.0

    @property
    def met_slo(self) -> bool:
        """Whether the job's lifetime slowdown, pauses included, is within its SLO."""
        return self.slowdown <= self.spec.slo * (1 + _SLO_TOL)

    @property
    def attained_s(self) -> float:
        """Time within the SLO: none if pauses pushed the lifetime slowdown past it."""
        return self.within_slo_s if self.met_slo else 0.0


@dataclass
class PoolAccount:
    node_seconds: float = 0.0
    busy_node_seconds: float = 0.0
    peak_nodes: int = 0


@dataclass
class SimResult:
    """Everything one policy did over one trace."""

    policy: str
    span_s: float
    cost_usd: float = 0.0
    jobs: dict[str, JobAccount] = field(default_factory=dict)
    pools: dict[Pool, PoolAccount] = field(default_factory=lambda: {p: PoolAccount() for p in Pool})
    cost_rate: list[tuple[float, float]] = field(default_factory=list)
    migrations: int = 0
    migration_usd: float = 0.0
    nodes_over_time: list[tuple[float, int, int]] = field(default_factory=list)
    example_group: list[tuple[str, Seat]] = field(default_factory=list)
    """The largest group the policy formed (first seen), for a Gantt chart of its schedule."""
    failures: FailureAccount | None = None
    """What injected node failures cost (None: a fault-free run)."""
    regroup_rounds: int = 0
    regroup_rounds_exhausted: int = 0
    """Regrouping rounds run, and those that stopped on their work budget (each kept the
    best plan it had found)."""
    regroup_peak_cached: int = 0

    @property
    def cost_node_hours(self) -> float:
        return sum(p.node_seconds for p in self.pools.values()) / HOUR

    @property
    def work_efficiency(self) -> float:
        """Solo-equivalent job-hours of work per dollar."""
        work = sum(j.work_s for j in self.jobs.values()) / HOUR
        return work / self.cost_usd if self.cost_usd > 0 else 0.0

    @property
    def ettr(self) -> float:
        """Effective training time ratio: time with progress over time held, over all jobs
        (only node failures count as lost here; migration pauses count in slowdowns)."""
        held = sum(j.seconds for j in self.jobs.values())
        return 1.0 - sum(j.lost_s for j in self.jobs.values()) / held if held > 0 else 1.0

    @property
    def slo_attainment(self) -> float:
        """Share of job-time within the SLO, a job's time counting only if its lifetime
        slowdown (migration pauses included) also meets its SLO."""
        total = sum(j.seconds for j in self.jobs.values())
        return sum(j.attained_s for j in self.jobs.values()) / total if total > 0 else 1.0

    @property
    def jobs_over_slo(self) -> int:
        """Jobs whose lifetime slowdown, pauses included, exceeds their SLO."""
        return sum(1 for j in self.jobs.values() if j.seconds > 0 and not j.met_slo)

    def slowdowns(self) -> list[float]:
        return sorted(j.slowdown for j in self.jobs.values() if j.seconds > 0)

    def estimated_jobs(self) -> dict[str, JobAccount]:
        """Jobs that ran co-located on estimated times (see ``configs.colocated_phases``)."""
        return {name: j for name, j in self.jobs.items() if j.colocated_estimated}

    def summary(self) -> dict[str, float]:
        slow = self.slowdowns()
        hours = self.span_s / HOUR
        out = {
            "cost_node_hours": self.cost_node_hours,
            "cost_usd": self.cost_usd,
            "cost_usd_per_hour": self.cost_usd / hours if hours > 0 else 0.0,
            "work_efficiency": self.work_efficiency,
            "slo_attainment": self.slo_attainment,
            "mean_slowdown": sum(slow) / len(slow) if slow else 1.0,
            "p99_slowdown": _quantile(slow, 0.99),
            "max_slowdown": slow[-1] if slow else 1.0,
            "migrations": self.migrations,
            "migration_usd": self.migration_usd,
            "jobs_over_slo": self.jobs_over_slo,
            "regroup_rounds": self.regroup_rounds,
            "regroup_rounds_exhausted": self.regroup_rounds_exhausted,
            "regroup_peak_cached": self.regroup_peak_cached,
            "colocated_job_hours": sum(j.colocated_s for j in self.jobs.values()) / HOUR,
            "estimated_colocated_job_hours": sum(j.colocated_s for j in self.estimated_jobs().values()) / HOUR,
            "estimated_colocated_jobs": len(self.estimated_jobs()),
        }
        for pool, account in self.pools.items():
            out[f"{pool.value}_node_hours"] = account.node_seconds / HOUR
            out[f"{pool.value}_busy_fraction"] = (
                account.busy_node_seconds / account.node_seconds if account.node_seconds > 0 else 0.0
            )
            out[f"{pool.value}_peak_nodes"] = account.peak_nodes
        return out


def _quantile(sorted_values: Sequence[float], q: float) -> float:
    """Linear-interpolated quantile of already sorted values."""
    if not sorted_values:
        return 1.0
    pos = q * (len(sorted_values) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (pos - lo) * (sorted_values[hi] - sorted_values[lo])


@dataclass(frozen=True)
class _Rates:
    """The cluster's rates between two events."""

    cost_per_hour: float
    slowdowns: dict[str, float]
    nodes: dict[Pool, int]
    busy_nodes: dict[Pool, float]
    colocated: frozenset[str]


@dataclass(frozen=True)
class Realisation:
    """Draw every phase of every iteration from its distribution, and account slowdowns
    and SLOs on the realised periods instead of the planned ones."""

    seed: int = 0
    rounds: int = 400


def _realised(cluster: Cluster, realise: Realisation, cache: dict) -> tuple[dict[str, float], dict[Pool, float]]:
    """Realised slowdown of every job and busy node count per pool.

    Each group composition is sampled once, with a generator seeded by the run's seed and
    the composition, so runs are reproducible. A node is busy for the mean phase times it
    serves per meta-iteration, over the realised period of the jobs it serves.
    """
    slowdowns: dict[str, float] = {}
    busy = dict.fromkeys(Pool, 0.0)
    for group in cluster.groups.values():
        key = tuple((m.job.name, m.rollout_nodes, m.train_nodes) for m in group.members)
        if key not in cache:
            rng = random.Random(f"{realise.seed}:{key}")
            phases = [m.phases() for m in group.members]
            periods = realised_periods(group.seats(cluster.planning), phases, rng, realise.rounds)
            slow = {m.job.name: p / m.job.solo_iteration() for m, p in zip(group.members, periods, strict=True)}
            pool_busy = dict.fromkeys(Pool, 0.0)
            for node in (*group.rollout_nodes, *group.train_nodes):
                served = [
                    (m, p)
                    for m, p in zip(group.members, periods, strict=True)
                    if node in (*m.rollout_nodes, *m.train_nodes)
                ]
                load = sum(
                    (m.phases()[0].mean if node in m.rollout_nodes else 0.0)
                    + (m.phases()[1].mean if node in m.train_nodes else 0.0)
                    for m, _ in served
                )
                pool_busy[cluster.node_pool[node]] += load / max(p for _, p in served)
            cache[key] = (slow, pool_busy)
        slow, pool_busy = cache[key]
        slowdowns.update(slow)
        for pool in Pool:
            busy[pool] += pool_busy[pool]
    return slowdowns, busy


def _rates(cluster: Cluster, realise: Realisation | None, cache: dict) -> _Rates:
    if realise:
        slowdowns, busy = _realised(cluster, realise, cache)
    else:
        slowdowns, busy = cluster.slowdowns(), {pool: cluster.busy_node_fraction(pool)[0] for pool in Pool}
    colocated = frozenset(m.job.name for group in cluster.groups.values() for m in group.members if m.colocated)
    return _Rates(cluster.cost_per_hour(), slowdowns, {pool: cluster.nodes(pool) for pool in Pool}, busy, colocated)


def simulate(
    trace: Trace,
    policy: Policy,
    cost: CostModel | None = None,
    planning: Planning = DEFAULT_PLANNING,
    on_event: Callable[[Cluster], None] | None = None,
    realise: Realisation | None = None,
    regroup: RegroupConfig | None = None,
    failures: FailureModel | None = None,
) -> SimResult:
    """Replay ``trace`` under ``policy``; ``on_event`` sees the cluster after every event.

    With ``realise``, slowdowns and SLOs are those of sampled phase times (see Realisation).
    With ``regroup``, running jobs are re-placed after each event when it pays (once
    after events at the same instant: jobs leaving together are not re-placed between
    their departures); each migration is charged in dollars and in the moved jobs' lost
    progress.
    With ``failures``, held nodes fail and recover (see rollmux.sim.failures); standby
    nodes are charged and each interrupted job's lost time counts against its work.
    """
    cluster = Cluster(cost=cost or CostModel(), planning=planning)
    injector = FailureInjector(failures, trace, cluster.cost, policy.name) if failures else None
    cache: dict = {}
    state = RegroupState()
    result = SimResult(policy=policy.name, span_s=trace.end)
    result.jobs = {j.spec.name: JobAccount(j.spec) for j in trace.jobs}
    rates = _rates(cluster, realise, cache)
    now = 0.0
    timeline = events(trace)
    for index, event in enumerate(timeline):
        _accrue(result, rates, event.time - now)
        if injector:
            _fail(result, rates, injector.interval(cluster, now, event.time))
        now = event.time
        if event.arrival:
            place(cluster, policy, event.job.submitted)
        else:
            cluster.remove(event.job.spec.name)
        last_at_this_time = index + 1 == len(timeline) or timeline[index + 1].time > now
        if regroup and last_at_this_time:
            _regroup(cluster, regroup, result, state, {j.spec.name: j.departure - now for j in trace.jobs})
        rates = _rates(cluster, realise, cache)
        result.cost_rate.append((now, rates.cost_per_hour))
        result.nodes_over_time.append((now, rates.nodes[Pool.ROLLOUT], rates.nodes[Pool.TRAIN]))
        for pool in Pool:
            result.pools[pool].peak_nodes = max(result.pools[pool].peak_nodes, rates.nodes[pool])
        _remember_largest_group(cluster, result)
        if on_event:
            on_event(cluster)
    if injector:
        result.failures = injector.account
        result.cost_usd += injector.account.standby_usd
    return result


def _remember_largest_group(cluster: Cluster, result: SimResult) -> None:
    largest = max(cluster.groups.values(), key=lambda g: len(g.members), default=None)
    if largest is not None and len(largest.members) > len(result.example_group):
        seats = largest.seats(cluster.planning)
        result.example_group = [(m.job.name, seat) for m, seat in zip(largest.members, seats, strict=True)]


def _regroup(
    cluster: Cluster, config: RegroupConfig, result: SimResult, state: RegroupState, remaining: dict[str, float]
) -> None:
    """Re-place running jobs when it pays; charge the migration in dollars and each moved
    job's pause as lost work (a job not started yet moves without a pause). A job's time
    left is its trace departure less now, as a live job's is the iterations it said it runs
    less those done, at its group's period."""
    progress = {
        j.name: JobProgress(
            result.jobs[j.name].seconds, result.jobs[j.name].work_s, result.jobs[j.name].moves, remaining[j.name]
        )
        for j in cluster.jobs()
    }
    plan = plan_regroup(cluster, config, state, progress)
    result.regroup_rounds, result.regroup_rounds_exhausted = state.rounds, state.exhausted_rounds
    result.regroup_peak_cached = max(result.regroup_peak_cached, state.cached)
    if plan is None:
        return
    apply_regroup(cluster, plan)
    result.cost_usd += plan.migration_usd
    result.migration_usd += plan.migration_usd
    for job, pause in zip(plan.moved, plan.pauses_s, strict=True):
        result.migrations += int(pause > 0)
        result.jobs[job.name].moves += int(pause > 0)
        result.jobs[job.name].work_s -= pause
        result.jobs[job.name].paused_s += pause


def _fail(result: SimResult, rates: _Rates, hits: list[Interruption]) -> None:
    """Charge each interrupted job the work of its lost seconds at its rate at the failure.

    Exact while the job's group does not change over those seconds: its lifetime slowdown
    is then its fault-free one over its ETTR. (A migration pause is charged at face value,
    a second of solo work per second, which overstates it by the job's slowdown.)"""
    for hit in hits:
        account = result.jobs[hit.job]
        account.lost_s += hit.lost_s
        account.work_s -= hit.lost_s / rates.slowdowns[hit.job]


def _accrue(result: SimResult, rates: _Rates, dt: float) -> None:
    if dt <= 0:
        return
    result.cost_usd += rates.cost_per_hour * dt / HOUR
    for pool in Pool:
        result.pools[pool].node_seconds += rates.nodes[pool] * dt
        result.pools[pool].busy_node_seconds += rates.busy_nodes[pool] * dt
    for name, slowdown in rates.slowdowns.items():
        account = result.jobs[name]
        account.seconds += dt
        account.work_s += dt / slowdown
        if name in rates.colocated:
            account.colocated_s += dt
        if slowdown <= account.spec.slo * (1 + _SLO_TOL):
            account.within_slo_s += dt


def fluid_lower_bound_usd(trace: Trace, cost: CostModel | None = None) -> float:
    """Cost if every job held exactly its average demand of each pool, slowed to its SLO.

    Fractional nodes and no residency limit: no real placement can be cheaper.
    """
    cost = cost or CostModel()
    total = 0.0
    for j in trace.jobs:
        spec = j.spec
        period = spec.period_budget
        rate = (
            spec.rollout_node_seconds(spec.rollout.mean) * cost.price(Pool.ROLLOUT)
            + spec.train_width * spec.train.mean * cost.price(Pool.TRAIN)
        ) / period
        total += rate * (j.departure - j.arrival) / HOUR
    return total


LONG_TAIL_THRESHOLD = 0.8
"""Share of a rollout's requests done when its tail moves: the published design's ~80 %."""
LONG_TAIL_RESUME_S = 5.0
"""Seconds the moved requests take to resume on the tail nodes (their prompts and tokens so
far prefilled again): an assumption, not measured, named wherever it is used."""


def with_long_tail(trace: Trace, share: float, resume_s: float = LONG_TAIL_RESUME_S) -> Trace:
    """The same jobs with long-tail rollout migration: the last ``share`` of each rollout's
    time (its last 20 % of requests) runs on a fifth of its rollout nodes (at least one),
    the others free for the next rollout; only rollouts of two nodes or more move any."""
    jobs = tuple(replace(j, spec=replace(j.spec, tail=_tail_of(j.spec, share, resume_s))) for j in trace.jobs)
    return replace(trace, jobs=jobs)


def _tail_of(spec: JobSpec, share: float, resume_s: float) -> RolloutTail:
    nodes = max(1, math.ceil((1 - LONG_TAIL_THRESHOLD) * spec.rollout_width - 1e-9))
    return RolloutTail(share=share, nodes=nodes, threshold=LONG_TAIL_THRESHOLD, resume_s=resume_s)


def with_rollout_cv(trace: Trace, cv: float) -> Trace:
    """The same jobs with lognormal rollout times of coefficient of variation ``cv``."""
    jobs = tuple(replace(j, spec=replace(j.spec, rollout=j.spec.rollout.with_cv(cv))) for j in trace.jobs)
    return replace(trace, jobs=jobs)
