"""The exact cheapest placement of a set of running jobs, for small instances.

Search space: a partition of the jobs into groups; in each group every job uses the
group's first training nodes (as many as its width) and the jobs are split into rollout
bins, each bin a set of rollout nodes its jobs share (as many as the widest job in it).
A group is feasible when every member's steady-state period is within its SLO and every
node's resident state fits its host memory.

Only the cheapest feasible configuration of each subset of jobs can be part of an optimal
partition, so the problem becomes a set partitioning over subsets, solved exactly as a
MILP (scipy's HiGHS). Subsets whose lower bound (the training load on the shared trainer,
or a job's own chain) already exceeds the tightest SLO are skipped; the bound only grows
with more jobs, so no feasible subset is lost.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp

from rollmux.core.cluster import Member
from rollmux.core.roundrobin import steady_state
from rollmux.core.spec import DEFAULT_PLANNING, CostModel, JobSpec, Planning, Pool

_TOL = 1e-9


@dataclass(frozen=True)
class GroupPlan:
    """One group of the optimum: its jobs (indices), rollout bins and hourly cost."""

    jobs: tuple[int, ...]
    bins: tuple[tuple[int, ...], ...]
    cost_per_hour: float
    members: tuple[Member, ...]


@dataclass(frozen=True)
class Optimum:
    groups: tuple[GroupPlan, ...]
    cost_per_hour: float


def set_partitions(items: Sequence[int]) -> Iterator[list[list[int]]]:
    """Every partition of ``items`` into non-empty blocks."""
    if not items:
        yield []
        return
    first, *rest = items
    for partition in set_partitions(rest):
        for k in range(len(partition)):
            yield [*partition[:k], [first, *partition[k]], *partition[k + 1 :]]
        yield [[first], *partition]


def _members(jobs: Sequence[JobSpec], subset: Sequence[int], bins: Sequence[Sequence[int]]) -> tuple[Member, ...]:
    trainers = max(jobs[i].train_width for i in subset)
    train_ids = tuple(range(trainers))
    node = trainers
    nodes_of: dict[int, tuple[int, ...]] = {}
    for block in bins:
        width = max(jobs[i].rollout_width for i in block)
        ids = tuple(range(node, node + width))
        node += width
        for i in block:
            nodes_of[i] = ids[: jobs[i].rollout_width]
    return tuple(Member(jobs[i], nodes_of[i], train_ids[: jobs[i].train_width]) for i in subset)


def _fits_memory(members: Sequence[Member], cost: CostModel) -> bool:
    used: dict[tuple[Pool, int], float] = {}
    for m in members:
        for node in m.rollout_nodes:
            used[(Pool.ROLLOUT, node)] = used.get((Pool.ROLLOUT, node), 0.0) + m.job.rollout_mem_gb
        for node in m.train_nodes:
            used[(Pool.TRAIN, node)] = used.get((Pool.TRAIN, node), 0.0) + m.job.train_mem_gb
    return all(gb <= cost.usable_dram_gb(pool) + _TOL for (pool, _), gb in used.items())


def _feasible(members: Sequence[Member], planning: Planning) -> bool:
    seats = [m.seat(planning) for m in members]
    periods = steady_state(seats).periods
    return all(p <= m.job.period_budget * (1 + _TOL) for m, p in zip(members, periods, strict=True))


def _trainer_bound_ok(jobs: Sequence[JobSpec], subset: Sequence[int], planning: Planning) -> bool:
    budget = min(jobs[i].period_budget for i in subset)
    chain = max(jobs[i].planned_iteration(planning) for i in subset)
    load = sum(jobs[i].train.planned(planning) for i in subset)
    return max(chain, load) <= budget * (1 + _TOL)


def cheapest_group(
    jobs: Sequence[JobSpec], subset: Sequence[int], cost: CostModel, planning: Planning
) -> GroupPlan | None:
    """The cheapest feasible configuration of exactly these jobs, or None."""
    if not _trainer_bound_ok(jobs, subset, planning):
        return None
    trainers = max(jobs[i].train_width for i in subset)
    options = []
    for bins in set_partitions(list(subset)):
        rollout_nodes = sum(max(jobs[i].rollout_width for i in block) for block in bins)
        options.append((rollout_nodes, bins))
    options.sort(key=lambda option: option[0])
    for rollout_nodes, bins in options:
        members = _members(jobs, subset, bins)
        if _fits_memory(members, cost) and _feasible(members, planning):
            price = rollout_nodes * cost.price(Pool.ROLLOUT) + trainers * cost.price(Pool.TRAIN)
            return GroupPlan(tuple(subset), tuple(tuple(b) for b in bins), price, members)
    return None


def candidate_groups(jobs: Sequence[JobSpec], cost: CostModel, planning: Planning) -> list[GroupPlan]:
    """The cheapest feasible configuration of every subset of the jobs."""
    plans = []
    for size in range(1, len(jobs) + 1):
        for subset in itertools.combinations(range(len(jobs)), size):
            plan = cheapest_group(jobs, subset, cost, planning)
            if plan is not None:
                plans.append(plan)
    return plans


def optimum(jobs: Sequence[JobSpec], cost: CostModel | None = None, planning: Planning = DEFAULT_PLANNING) -> Optimum:
    """The cheapest partition of ``jobs`` into feasible groups (exact set-partitioning MILP)."""
    cost = cost or CostModel()
    plans = candidate_groups(jobs, cost, planning)
    cover = np.zeros((len(jobs), len(plans)))
    for column, plan in enumerate(plans):
        cover[list(plan.jobs), column] = 1.0
    prices = np.array([plan.cost_per_hour for plan in plans])
    solution = milp(
        prices,
        constraints=LinearConstraint(cover, lb=np.ones(len(jobs)), ub=np.ones(len(jobs))),
        integrality=np.ones(len(plans)),
        bounds=Bounds(0, 1),
    )
    if not solution.success:
        raise RuntimeError(f"set partitioning failed: {solution.message}")
    chosen = tuple(plan for plan, x in zip(plans, solution.x, strict=True) if x > 0.5)
    return Optimum(chosen, sum(plan.cost_per_hour for plan in chosen))
