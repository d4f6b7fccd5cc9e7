"""Node failures injected into the trace simulator, and what each recovery costs.

Every node a policy holds, in either pool, fails as a Poisson process of rate 1 / MTBF
for as long as it is held. Between two simulator events the cluster is constant, so the
failures of each node in that interval are drawn exactly, by exponential gaps, from a
generator seeded by the run's seed and the policy's name: the same seed gives the same
failures, and no wall clock is read. Idle standby nodes draw from a generator of their
own, so the held nodes fail at the same times whatever the standby count and recovery
options: runs that differ only in how they recover see the same failures.

A failed node interrupts every job with a role on it (in RollMux several jobs of a
group, in Solo one job). Its pool replaces it with an idle standby node if it has one,
else with a node provisioned cold: one standby per failed node, whatever the number of
its jobs. Each job then recovers on its own terms, from its replica if it has one, else
from its last checkpoint: it makes no progress for the recovery's downtime and, without a
replica, redoes the progress made since that checkpoint. Other jobs of the group keep
their turns; that they could run faster meanwhile is not counted (conservative). A used
standby is replaced in the background within ``restock_s``; idle standby nodes fail too
and are replaced the same way.

With replicas on, where each job's copy lives is the core's buddy plan
(rollmux.core.replicas, the function the live system uses), made afresh for every
interval from the cluster of that interval: a copy sits on another held training node or
on a training-pool standby, in the room the placement leaves, or nowhere (its job is then
unreplicated and recovers from its checkpoint). A job has a replica at a failure when its
buddy is not the failed node and is up: a standby buddy that failed or was used loses the
copies it kept until it is restocked, and a held buddy that failed keeps none until its
replacement is up from a checkpoint (the copies are written again after the next
training phase; that gap is not counted). A rollout node keeps no copy of its own (its
weights come back from the trainer), so a job interrupted by a rollout node failure has a
replica, and redoes nothing, exactly when its trainer's copy is intact by the same rule.
With a replica nothing is redone whatever the replacement: a cold restart from the
buddy's copy costs the cold downtime only.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from enum import Enum

from rollmux.core.cluster import Cluster
from rollmux.core.replicas import Buddy, BuddyPlan, plan_buddies
from rollmux.core.spec import HOUR, CostModel, Pool
from rollmux.inputs.trace import Trace

MIN_MTBF_HOURS = 1.0
"""A node failing more often than hourly is broken, not unreliable."""
MAX_MTBF_HOURS = 1_000_000.0
"""About 114 years per node: a longer MTBF is a typo, not a failure model (``math.inf``
is accepted: no failures)."""
MAX_STANDBY = 100
MAX_DOWNTIME_S = 86_400.0
MAX_CHECKPOINT_INTERVAL_S = 7 * 86_400.0
DEFAULT_CHECKPOINT_INTERVAL_S = 1800.0
"""Half an hour of progress between checkpoints: an assumption, not a measurement."""
DEFAULT_RESTOCK_S = 600.0
"""Ten minutes to provision and warm a replacement standby in the background: an assumption."""


class Recovery(str, Enum):
    """How a failed node's jobs come back."""

    STANDBY_BUDDY = "standby+buddy"
    STANDBY_CHECKPOINT = "standby+checkpoint"
    COLD = "cold"


@dataclass(frozen=True)
class RecoveryTimes:
    """Seconds a job makes no progress after a node under it fails, by recovery kind.

    - ``standby_buddy_s`` 20: a pre-warmed standby takes the node's place and pulls the
      job's state from a peer's host memory; interruption-resilient training systems
      report 16–21 s of downtime at 1,024 GPUs (design brief §6, issue 11).
    - ``standby_checkpoint_s`` 60: the same standby, but the state comes from the last
      storage checkpoint. An estimate, not a measurement: a 32B trainer's resident state
      (about 500 GB) read at about 10 GB/s, plus the re-wiring of the standby case.
    - ``cold_s`` 300: provision a replacement node, start processes, load the job's state
      (its checkpoint, or its replica: nothing is then redone); the figure the same papers
      report for checkpoint-restart at 1,024 GPUs (the brief quotes ~6.5 min at 16K GPUs).
    """

    standby_buddy_s: float = 20.0
    standby_checkpoint_s: float = 60.0
    cold_s: float = 300.0

    def of(self, kind: Recovery) -> float:
        return {
            Recovery.STANDBY_BUDDY: self.standby_buddy_s,
            Recovery.STANDBY_CHECKPOINT: self.standby_checkpoint_s,
            Recovery.COLD: self.cold_s,
        }[kind]


@dataclass(frozen=True)
class FailureModel:
    """Failures to inject and the means to recover from them.

    ``mtbf_hours`` is per node (``math.inf``: no failures). ``standby`` idle nodes per pool
    are paid while the pool holds any node (an empty pool keeps none). ``replicas``: every
    job asks for a copy of its trainer state in a buddy's host memory, kept where the buddy
    plan finds room (another held training node, else a training standby), so a job with
    a copy loses no progress and, with a standby, recovers the fast way; copies add no
    nodes. Jobs checkpoint every ``checkpoint_interval_s`` of progress since they started
    or last recovered. A used or failed standby is replaced within ``restock_s``.
    """

    mtbf_hours: float
    standby: int = 0
    replicas: bool = False
    checkpoint_interval_s: float = DEFAULT_CHECKPOINT_INTERVAL_S
    restock_s: float = DEFAULT_RESTOCK_S
    downtimes: RecoveryTimes = field(default_factory=RecoveryTimes)
    seed: int = 0

    def __post_init__(self) -> None:
        if not (MIN_MTBF_HOURS <= self.mtbf_hours <= MAX_MTBF_HOURS or self.mtbf_hours == math.inf):
            raise ValueError(
                f"MTBF must be in [{MIN_MTBF_HOURS:g}, {MAX_MTBF_HOURS:,.0f}] hours per node, got {self.mtbf_hours}"
            )
        if not 0 <= self.standby <= MAX_STANDBY:
            raise ValueError(f"standby nodes per pool must be in [0, {MAX_STANDBY}], got {self.standby}")
        if not 0 < self.checkpoint_interval_s <= MAX_CHECKPOINT_INTERVAL_S:
            raise ValueError(f"checkpoint interval must be in (0, 7 days], got {self.checkpoint_interval_s} s")
        for name, seconds in (
            ("restock time", self.restock_s),
            ("standby+buddy downtime", self.downtimes.standby_buddy_s),
            ("standby+checkpoint downtime", self.downtimes.standby_checkpoint_s),
            ("cold restart downtime", self.downtimes.cold_s),
        ):
            if not 0 <= seconds <= MAX_DOWNTIME_S:
                raise ValueError(f"{name} must be in [0, 1 day], got {seconds} s")

    @property
    def rate_per_s(self) -> float:
        """Failures per second of one held node."""
        return 1.0 / (self.mtbf_hours * HOUR)

    @staticmethod
    def recovery(standby_free: bool, replica: bool) -> Recovery:
        """How one job comes back: the kind names the replacement node and, with a
        standby, where the state comes from (a cold restart may also read a replica)."""
        if not standby_free:
            return Recovery.COLD
        return Recovery.STANDBY_BUDDY if replica else Recovery.STANDBY_CHECKPOINT


@dataclass
class FailureAccount:
    """What failures did to one policy's run, summed over the trace."""

    failures: int = 0
    """Failures of nodes that held jobs."""
    recoveries: dict[Recovery, int] = field(default_factory=lambda: dict.fromkeys(Recovery, 0))
    """Interrupted jobs by recovery kind (they sum to ``interruptions``, not ``failures``:
    the jobs of one failed node can recover differently, some from a replica, some not)."""
    standby_failures: int = 0
    downtime_s: float = 0.0
    """Job-seconds without progress while recovering."""
    redo_s: float = 0.0
    """Job-seconds of progress lost since the last checkpoint, to be done again."""
    wasted_node_s: float = 0.0
    """Node-seconds held for jobs that were down or redoing lost progress, each node's
    time split equally among the jobs seated on it."""
    standby_node_s: float = 0.0
    standby_usd: float = 0.0
    unreplicated_job_s: float = 0.0
    """Job-seconds (replicas on) of placed jobs that had no buddy: their copy fit on no
    other held training node nor a standby, or their trainer spans several nodes. Copies
    lost with a failed buddy, until it is back, are not counted here."""
    log: list[Interruption] = field(default_factory=list)
    """Every job interrupted, in time order: a failed node carrying three jobs interrupts three."""

    @property
    def interruptions(self) -> int:
        return len(self.log)

    @property
    def lost_s(self) -> float:
        return self.downtime_s + self.redo_s


@dataclass(frozen=True)
class Interruption:
    """One job stopped by one node failure: ``lost_s`` seconds without progress."""

    job: str
    time: float
    kind: Recovery
    downtime_s: float
    redo_s: float
    replica: bool = False
    """Whether the job recovered from its replica (then nothing is redone)."""

    @property
    def lost_s(self) -> float:
        return self.downtime_s + self.redo_s


@dataclass
class _JobClock:
    """When the job is productive again (its arrival, or the end of its last recovery),
    and when it leaves: a recovery does not outlast the job."""

    up_at: float
    departure: float


@dataclass(frozen=True)
class _Failure:
    time: float
    pool: Pool
    node: int | None = None
    """The held node that failed; None for an idle standby (its index in ``slot``)."""
    slot: int = 0


class FailureInjector:
    """Draws the failures of one policy's run, interval by interval, and keeps its account."""

    def __init__(self, model: FailureModel, trace: Trace, cost: CostModel, stream: str) -> None:
        self.model = model
        self.cost = cost
        self.node_rng = random.Random(f"failures:{model.seed}:{stream}")
        self.standby_rng = random.Random(f"standby-failures:{model.seed}:{stream}")
        self.jobs = {j.spec.name: _JobClock(j.arrival, j.departure) for j in trace.jobs}
        self.standby_ready = {pool: [0.0] * model.standby for pool in Pool}
        """Per pool and standby slot: when that slot holds an idle standby again."""
        self.node_back: dict[int, float] = {}
        """Per held node that failed: when its replacement is up from a checkpoint (the
        earliest a buddy keeps copies again)."""
        self.account = FailureAccount()

    def interval(self, cluster: Cluster, start: float, end: float) -> list[Interruption]:
        """Inject the failures of [start, end), during which ``cluster`` does not change."""
        if end <= start:
            return []
        self._charge_standby(cluster, end - start)
        plan = self._plan(cluster)
        self.account.unreplicated_job_s += len(plan.unplaced) * (end - start)
        seated = _jobs_per_node(cluster)
        hits: list[Interruption] = []
        for failure in sorted(self._draw(cluster, start, end), key=lambda f: f.time):
            if failure.node is None:
                self._standby_failed(failure)
            else:
                hits.extend(self._node_failed(failure, failure.node, seated, plan))
        return hits

    def _plan(self, cluster: Cluster) -> BuddyPlan:
        """The core's buddy plan for every placed job (replicas on), else no copies at all."""
        if not self.model.replicas:
            return BuddyPlan({}, ())
        return plan_buddies(cluster, set(cluster.job_group), self.model.standby)

    def _draw(self, cluster: Cluster, start: float, end: float) -> Iterator[_Failure]:
        for node, pool in sorted(cluster.node_pool.items()):
            for time in self._times(self.node_rng, start, end):
                yield _Failure(time, pool, node)
        for pool in Pool:
            if cluster.nodes(pool) > 0:
                for slot in range(self.model.standby):
                    for time in self._times(self.standby_rng, start, end):
                        yield _Failure(time, pool, None, slot)

    def _times(self, rng: random.Random, start: float, end: float) -> Iterator[float]:
        """Failure times of one node held over [start, end): exponential gaps."""
        rate = self.model.rate_per_s
        if rate == 0:
            return
        time = start + rng.expovariate(rate)
        while time < end:
            yield time
            time += rng.expovariate(rate)

    def _standby_failed(self, failure: _Failure) -> None:
        """An idle standby fails: it is replaced in the background. One still restocking
        is not there to fail (thinning of a memoryless process: exact)."""
        ready = self.standby_ready[failure.pool]
        if ready[failure.slot] <= failure.time:
            ready[failure.slot] = failure.time + self.model.restock_s
            self.account.standby_failures += 1

    def _node_failed(
        self, failure: _Failure, node: int, seated: dict[int, list[str]], plan: BuddyPlan
    ) -> list[Interruption]:
        """Replace the failed ``node`` (one standby, or cold) and recover each of its jobs.
        Whether a job has a replica is decided before the standby is taken: the standby
        taken may be the very one that keeps the copy (it then becomes the job's node)."""
        jobs = seated.get(node, [])
        replicas = [self._has_replica(job, node, failure.time, plan) for job in jobs]
        standby_free = self._take_standby(failure.pool, failure.time)
        self.account.failures += 1
        self.node_back[node] = failure.time + self.model.downtimes.of(self.model.recovery(standby_free, replica=False))
        hits = [
            self._interrupt(job, failure.time, self.model.recovery(standby_free, replica), replica)
            for job, replica in zip(jobs, replicas, strict=True)
        ]
        for hit in hits:
            self.account.recoveries[hit.kind] += 1
            self.account.log.append(hit)
            self.account.downtime_s += hit.downtime_s
            self.account.redo_s += hit.redo_s
            self.account.wasted_node_s += hit.lost_s * _node_share(hit.job, seated)
        return hits

    def _has_replica(self, job: str, failed: int, time: float, plan: BuddyPlan) -> bool:
        """Whether ``job``'s copy survives the failure of node ``failed`` at ``time``: its
        buddy is another node, and up (a standby restocking, or a held node not yet
        replaced, keeps no copies)."""
        if not plan.replicated(job, failed=Buddy(node=failed)):
            return False
        buddy = plan.buddies[job]
        if buddy.standby is not None:
            return self.standby_ready[Pool.TRAIN][buddy.standby] <= time
        return self.node_back.get(buddy.node, 0.0) <= time

    def _take_standby(self, pool: Pool, time: float) -> bool:
        ready = self.standby_ready[pool]
        for slot, ready_at in enumerate(ready):
            if ready_at <= time:
                ready[slot] = time + self.model.restock_s
                return True
        return False

    def _interrupt(self, job: str, time: float, kind: Recovery, replica: bool) -> Interruption:
        """Stop ``job`` at ``time``: no progress until the recovery ends, and, without a
        replica, the progress since its last checkpoint lost. A failure during a recovery
        restarts the recovery and loses nothing more."""
        clock = self.jobs[job]
        back = min(time + self.model.downtimes.of(kind), clock.departure)
        if time < clock.up_at:
            downtime, redo = max(0.0, back - clock.up_at), 0.0
        else:
            downtime = back - time
            redo = 0.0 if replica else (time - clock.up_at) % self.model.checkpoint_interval_s
        clock.up_at = max(clock.up_at, back)
        return Interruption(job, time, kind, downtime, redo, replica)

    def _charge_standby(self, cluster: Cluster, dt: float) -> None:
        for pool in Pool:
            if cluster.nodes(pool) > 0:
                self.account.standby_node_s += self.model.standby * dt
                self.account.standby_usd += self.model.standby * self.cost.price(pool) * dt / HOUR


def _jobs_per_node(cluster: Cluster) -> dict[int, list[str]]:
    """The jobs with a role on each held node (a co-located job's two roles share nodes)."""
    seated: dict[int, list[str]] = {}
    for group in cluster.groups.values():
        for member in group.members:
            for node in sorted({*member.rollout_nodes, *member.train_nodes}):
                seated.setdefault(node, []).append(member.job.name)
    return seated


def _node_share(job: str, seated: dict[int, list[str]]) -> float:
    """Nodes attributed to ``job``: each node it sits on, split equally among its jobs."""
    return sum(1.0 / len(jobs) for jobs in seated.values() if job in jobs)
