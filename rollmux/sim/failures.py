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
else with a node provisioned cold; the job pulls its state from a buddy's host memory
(replicas on) or from its last checkpoint. The job makes no progress for the recovery's
downtime and, without a replica, redoes the progress made since its last checkpoint.
Other jobs of the group keep their turns; that they could run faster meanwhile is not
counted (conservative). A used standby is replaced in the background within
``restock_s``; idle standby nodes fail too and are replaced the same way.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from enum import Enum

from rollmux.core.cluster import Cluster
from rollmux.core.spec import CostModel, Pool
from rollmux.inputs.trace import Trace

HOUR = 3600.0
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
    - ``cold_s`` 300: provision a replacement node, start processes, load the checkpoint;
      the figure the same papers report for checkpoint-restart at 1,024 GPUs (the brief
      quotes ~6.5 min at 16K GPUs).
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
    job's state also lives in a buddy node's host memory, so a recovery loses no progress
    and, with a standby, is the fast kind; replicas sit in existing nodes' DRAM and add no
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

    def recovery(self, standby_free: bool) -> Recovery:
        if not standby_free:
            return Recovery.COLD
        return Recovery.STANDBY_BUDDY if self.replicas else Recovery.STANDBY_CHECKPOINT


@dataclass
class FailureAccount:
    """What failures did to one policy's run, summed over the trace."""

    failures: int = 0
    """Failures of nodes that held jobs."""
    recoveries: dict[Recovery, int] = field(default_factory=lambda: dict.fromkeys(Recovery, 0))
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
    replicas_unfit_s: float = 0.0
    """Seconds during which some pool's held DRAM could not hold a second copy of every
    resident state (replicas on): a bound the buddy copies would break, not checked by
    placement."""
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
        self.account = FailureAccount()

    def interval(self, cluster: Cluster, start: float, end: float) -> list[Interruption]:
        """Inject the failures of [start, end), during which ``cluster`` does not change."""
        if end <= start:
            return []
        self._charge_standby(cluster, end - start)
        self._check_replicas(cluster, end - start)
        seated = _jobs_per_node(cluster)
        hits: list[Interruption] = []
        for failure in sorted(self._draw(cluster, start, end), key=lambda f: f.time):
            if failure.node is None:
                self._standby_failed(failure)
            else:
                hits.extend(self._node_failed(failure, seated))
        return hits

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

    def _node_failed(self, failure: _Failure, seated: dict[int, list[str]]) -> list[Interruption]:
        kind = self.model.recovery(self._take_standby(failure.pool, failure.time))
        self.account.failures += 1
        self.account.recoveries[kind] += 1
        hits = [self._interrupt(job, failure.time, kind) for job in seated.get(failure.node, [])]
        for hit in hits:
            self.account.log.append(hit)
            self.account.downtime_s += hit.downtime_s
            self.account.redo_s += hit.redo_s
            self.account.wasted_node_s += hit.lost_s * _node_share(hit.job, seated)
        return hits

    def _take_standby(self, pool: Pool, time: float) -> bool:
        ready = self.standby_ready[pool]
        for slot, ready_at in enumerate(ready):
            if ready_at <= time:
                ready[slot] = time + self.model.restock_s
                return True
        return False

    def _interrupt(self, job: str, time: float, kind: Recovery) -> Interruption:
        """Stop ``job`` at ``time``: no progress until the recovery ends, and, without a
        replica, the progress since its last checkpoint lost. A failure during a recovery
        restarts the recovery and loses nothing more."""
        clock = self.jobs[job]
        back = min(time + self.model.downtimes.of(kind), clock.departure)
        if time < clock.up_at:
            downtime, redo = max(0.0, back - clock.up_at), 0.0
        else:
            downtime = back - time
            redo = 0.0 if self.model.replicas else (time - clock.up_at) % self.model.checkpoint_interval_s
        clock.up_at = max(clock.up_at, back)
        return Interruption(job, time, kind, downtime, redo)

    def _charge_standby(self, cluster: Cluster, dt: float) -> None:
        for pool in Pool:
            if cluster.nodes(pool) > 0:
                self.account.standby_node_s += self.model.standby * dt
                self.account.standby_usd += self.model.standby * self.cost.price(pool) * dt / HOUR

    def _check_replicas(self, cluster: Cluster, dt: float) -> None:
        if self.model.replicas and any(_replicas_unfit(cluster, pool) for pool in Pool):
            self.account.replicas_unfit_s += dt


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


def _replicas_unfit(cluster: Cluster, pool: Pool) -> bool:
    """Whether the pool's held DRAM lacks room for a second copy of every resident state
    (a necessary condition for buddy replicas, summed over the pool: not per node)."""
    used = sum(
        group.mem_used_gb(node)
        for group in cluster.groups.values()
        for node in (group.rollout_nodes if pool is Pool.ROLLOUT else group.train_nodes)
    )
    return 2 * used > cluster.nodes(pool) * cluster.cost.usable_dram_gb(pool)
