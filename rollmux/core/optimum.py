"""The exact cheapest placement of a set of running jobs, for small instances.

Search space: a partition of the jobs into groups; each group has as many training nodes
as its widest job trains on, and its jobs are split into rollout bins, each bin a set of
rollout nodes its jobs share (as many as the widest job in it); a job narrower than its
bin or than the trainers may sit on any of their nodes.
A group is feasible when every member's steady-state period is within its SLO and every
node's resident state fits its host memory.

Only the cheapest feasible configuration of each subset of jobs can be part of an optimal
partition, so the problem becomes a set partitioning over subsets, solved exactly as a
MILP (scipy's HiGHS). Subsets whose lower bound (the average training load per trainer,
or a job's own chain) already exceeds the tightest SLO are skipped without losing a
feasible one.
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


def _layouts(
    jobs: Sequence[JobSpec], subset: Sequence[int], bins: Sequence[Sequence[int]]
) -> Iterator[tuple[Member, ...]]:
    """Every way to seat the jobs: a job narrower than its bin (or than the trainers) may
    use any of their nodes. Training nodes are numbered first, rollout bins after."""
    trainers = tuple(range(max(jobs[i].train_width for i in subset)))
    bin_nodes: dict[int, tuple[int, ...]] = {}
    node = len(trainers)
    for block in bins:
        width = max(jobs[i].rollout_width for i in block)
        for i in block:
            bin_nodes[i] = tuple(range(node, node + width))
        node += width
    choices = [
        itertools.product(
            itertools.combinations(bin_nodes[i], jobs[i].rollout_width),
            itertools.combinations(trainers, jobs[i].train_width),
        )
        for i in subset
    ]
    for layout in itertools.product(*choices):
        yield tuple(Member(jobs[i], rollout, train) for i, (rollout, train) in zip(subset, layout, strict=True))


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
    """Necessary: the longest chain and the average training load per trainer fit the SLOs."""
    budget = min(jobs[i].period_budget for i in subset)
    chain = max(jobs[i].planned_iteration(planning) for i in subset)
    trainers = max(jobs[i].train_width for i in subset)
    load = sum(jobs[i].train_width * jobs[i].train.planned(planning) for i in subset) / trainers
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
        for members in _layouts(jobs, subset, bins):
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
    picked = partition(len(jobs), [plan.jobs for plan in plans], [plan.cost_per_hour for plan in plans])
    chosen = tuple(plans[c] for c in picked)
    return Optimum(chosen, sum(plan.cost_per_hour for plan in chosen))


def partition(items: int, columns: Sequence[Sequence[int]], prices: Sequence[float]) -> list[int]:
    """The cheapest choice of columns covering every item exactly once (exact MILP, HiGHS).

    Raises if no choice exists; callers keep a singleton column per item to rule that out.
    """
    cover = np.zeros((items, len(columns)))
    for c, rows in enumerate(columns):
        cover[list(rows), c] = 1.0
    solution = milp(
        np.asarray(prices, dtype=float),
        constraints=LinearConstraint(cover, lb=np.ones(items), ub=np.ones(items)),
        integrality=np.ones(len(columns)),
        bounds=Bounds(0, 1),
        options={"presolve": False},
    )
    if not solution.success:
        raise RuntimeError(f"set partitioning failed: {solution.message}")
    return [int(c) for c in np.flatnonzero(solution.x > 0.5)]
