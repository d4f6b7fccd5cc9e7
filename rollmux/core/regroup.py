"""Regrouping: re-solve the placement of all running jobs and migrate when it pays.

Online placement never moves a running job, so departures leave half-empty groups behind.
After each event the running jobs are re-partitioned by one set-partitioning MILP whose
columns are (a) every current group, kept as it is at its current price, and (b) the
cheapest feasible configuration (rollmux.core.optimum) of every set of up to
``max_group`` running jobs, at its price plus its migration amortised over
``horizon_s``. A move is therefore chosen only when its saving repays its migration
within the horizon. Moving a job costs ``pause_s`` plus ``s_per_gb`` per GB of its
resident state, during which it makes no progress and both its old and its new nodes are
paid. The cheapest configuration of each set of jobs is remembered across events (it
depends only on their specs). Pure code: the simulator applies the plan and charges it.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from rollmux.core.cluster import Cluster, Group
from rollmux.core.optimum import GroupPlan, cheapest_group, partition
from rollmux.core.spec import JobSpec

HOUR = 3600.0


@dataclass(frozen=True)
class RegroupConfig:
    s_per_gb: float = 0.25
    pause_s: float = 30.0
    horizon_s: float = 7200.0
    max_group: int = 3

    def migration_s(self, job: JobSpec) -> float:
        """Time the job makes no progress while its state moves to its new nodes."""
        state_gb = job.rollout_width * job.rollout_mem_gb + job.train_width * job.train_mem_gb
        return self.pause_s + self.s_per_gb * state_gb


@dataclass(frozen=True)
class RegroupPlan:
    groups_in: tuple[GroupPlan, ...]
    moved: tuple[JobSpec, ...]
    saving_per_hour: float
    migration_usd: float


@dataclass
class ConfigCache:
    """Cheapest feasible configuration per set of job names (None: infeasible)."""

    plans: dict[frozenset[str], GroupPlan | None] = field(default_factory=dict)

    def cheapest(self, cluster: Cluster, jobs: tuple[JobSpec, ...]) -> GroupPlan | None:
        key = frozenset(j.name for j in jobs)
        if key not in self.plans:
            self.plans[key] = cheapest_group(jobs, range(len(jobs)), cluster.cost, cluster.planning)
        return self.plans[key]


def _price(cluster: Cluster, group: Group) -> float:
    return sum(cluster.cost.price(cluster.node_pool[n]) for n in (*group.rollout_nodes, *group.train_nodes))


def plan_regroup(cluster: Cluster, config: RegroupConfig, cache: ConfigCache | None = None) -> RegroupPlan | None:
    """The cheapest re-partition of the running jobs, migrations amortised; None if keeping
    every group as it is is already cheapest."""
    cache = cache or ConfigCache()
    groups = list(cluster.groups.values())
    jobs = [m.job for g in groups for m in g.members]
    if len(groups) < 2:
        return None
    row = {job.name: k for k, job in enumerate(jobs)}
    current = {frozenset(m.job.name for m in g.members): g for g in groups}
    columns: list[tuple[frozenset[str], float, GroupPlan | None]] = [
        (names, _price(cluster, g), None) for names, g in current.items()
    ]
    for size in range(1, config.max_group + 1):
        for subset in itertools.combinations(jobs, size):
            plan = cache.cheapest(cluster, subset)
            if plan is None:
                continue
            longest = max(config.migration_s(j) for j in subset)
            amortised = 2 * plan.cost_per_hour * longest / config.horizon_s
            columns.append((frozenset(j.name for j in subset), plan.cost_per_hour + amortised, plan))
    picked = partition(len(jobs), [[row[n] for n in names] for names, _, _ in columns], [p for _, p, _ in columns])
    chosen = [columns[c] for c in picked]
    groups_in = tuple(plan for _, _, plan in chosen if plan is not None)
    if not groups_in:
        return None
    moved = tuple(m.job for plan in groups_in for m in plan.members)
    moved_names = {j.name for j in moved}
    left = [g for g in groups if any(m.job.name in moved_names for m in g.members)]
    saving = sum(_price(cluster, g) for g in left) - sum(p.cost_per_hour for p in groups_in)
    migration_usd = (
        sum(
            (_price(cluster, g) * max(config.migration_s(m.job) for m in g.members if m.job.name in moved_names))
            for g in left
        )
        / HOUR
        + sum(p.cost_per_hour * max(config.migration_s(m.job) for m in p.members) for p in groups_in) / HOUR
    )
    return RegroupPlan(groups_in, moved, saving, migration_usd)


def apply_regroup(cluster: Cluster, plan: RegroupPlan) -> None:
    """Move the plan's jobs out of their groups (releasing unused nodes) into new groups."""
    for job in plan.moved:
        cluster.remove(job.name)
    for group in plan.groups_in:
        cluster.add_group(group.members)
