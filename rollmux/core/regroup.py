"""Regrouping: re-solve the placement of running jobs and migrate when it pays.

Online placement never moves a running job, so departures leave half-empty groups behind.
After each event, the jobs of the most wasteful groups (the most idle capacity, in
dollars per hour) are re-placed exactly (rollmux.core.optimum) as one neighbourhood of at
most ``max_jobs`` jobs. The move is made when the hourly saving, over ``horizon_s``,
repays the migration: every moved job pauses for ``pause_s`` plus ``s_per_gb`` per GB of
its resident state, and the old and new nodes of the moved groups are both paid during
the longest move.
Pure code: the simulator (and later the runtime) applies the plan and charges its cost.
"""

from __future__ import annotations

from dataclasses import dataclass

from rollmux.core.cluster import Cluster, Group
from rollmux.core.optimum import GroupPlan, optimum
from rollmux.core.spec import JobSpec

HOUR = 3600.0


@dataclass(frozen=True)
class RegroupConfig:
    s_per_gb: float = 0.5
    pause_s: float = 30.0
    horizon_s: float = 7200.0
    max_jobs: int = 10

    def migration_s(self, job: JobSpec) -> float:
        """Time the job makes no progress while its state moves to its new nodes."""
        state_gb = job.rollout_width * job.rollout_mem_gb + job.train_width * job.train_mem_gb
        return self.pause_s + self.s_per_gb * state_gb


@dataclass(frozen=True)
class RegroupPlan:
    groups_out: tuple[int, ...]
    groups_in: tuple[GroupPlan, ...]
    moved: tuple[JobSpec, ...]
    saving_per_hour: float
    migration_s: float
    migration_usd: float


def _idle_per_hour(cluster: Cluster, group: Group) -> float:
    """Price of the group's idle capacity."""
    return sum(
        cluster.cost.price(cluster.node_pool[n]) * (1 - group.schedule.busy_fraction(n))
        for n in (*group.rollout_nodes, *group.train_nodes)
    )


def _price(cluster: Cluster, group: Group) -> float:
    return sum(cluster.cost.price(cluster.node_pool[n]) for n in (*group.rollout_nodes, *group.train_nodes))


def neighbourhood(cluster: Cluster, max_jobs: int) -> list[Group]:
    """Whole groups, most idle capacity first, filled greedily up to ``max_jobs`` jobs.

    (Trying further, disjoint neighbourhoods after this one was measured: it migrates
    more and saves less on the production trace.)
    """
    chosen: list[Group] = []
    size = 0
    for group in sorted(cluster.groups.values(), key=lambda g: -_idle_per_hour(cluster, g)):
        if size + len(group.members) <= max_jobs:
            chosen.append(group)
            size += len(group.members)
    return chosen


def plan_regroup(cluster: Cluster, config: RegroupConfig) -> RegroupPlan | None:
    """The exact re-placement of the most wasteful groups' jobs, if it repays its migration
    within the horizon; None otherwise."""
    groups = neighbourhood(cluster, config.max_jobs)
    if len(groups) < 2:
        return None
    jobs = [m.job for g in groups for m in g.members]
    current = sum(_price(cluster, g) for g in groups)
    best = optimum(jobs, cluster.cost, cluster.planning)
    saving = current - best.cost_per_hour
    if saving <= 1e-9:
        return None
    # A group the optimum keeps (same jobs, same price to the cent) does not move.
    unchanged = {(frozenset(m.job.name for m in g.members), round(_price(cluster, g), 2)) for g in groups}
    moved_groups = [
        plan
        for plan in best.groups
        if (frozenset(m.job.name for m in plan.members), round(plan.cost_per_hour, 2)) not in unchanged
    ]
    moved = tuple(m.job for plan in moved_groups for m in plan.members)
    moved_names = {job.name for job in moved}
    left = [g for g in groups if any(m.job.name in moved_names for m in g.members)]
    longest = max(config.migration_s(job) for job in moved)
    both_paid = sum(_price(cluster, g) for g in left) + sum(plan.cost_per_hour for plan in moved_groups)
    migration_usd = both_paid * longest / HOUR
    if saving * config.horizon_s / HOUR <= migration_usd:
        return None
    out = tuple(g.id for g in left)
    return RegroupPlan(out, tuple(moved_groups), moved, saving, longest, migration_usd)


def apply_regroup(cluster: Cluster, plan: RegroupPlan) -> None:
    """Move the plan's jobs out of their groups (releasing unused nodes) into new groups."""
    for job in plan.moved:
        cluster.remove(job.name)
    for group in plan.groups_in:
        cluster.add_group(group.members)
