"""The exact cheapest placement of a set of running jobs, for small instances.

Search space: a partition of the jobs into groups, each group in its cheapest complete
configuration (rollmux.core.configs: rollout and training bins chosen independently, so
trainers may share rollout nodes and groups may be of any size; optionally co-located
jobs). Only the cheapest feasible configuration of each subset of jobs can be part of an
optimal partition, so the problem becomes a set partitioning over subsets, solved
exactly as a MILP (scipy's HiGHS).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp

from rollmux.core.cluster import MAX_GROUP_JOBS, Member
from rollmux.core.configs import Config, cheapest_config, turn_key
from rollmux.core.errors import ProblemTooLarge
from rollmux.core.spec import DEFAULT_PLANNING, CostModel, JobSpec, Planning


@dataclass(frozen=True)
class GroupPlan:
    """One group of a placement: its jobs (indices), rollout bins and hourly cost.

    ``train_bins`` and ``colocated`` complete the configuration (indices as ``jobs``);
    ``periods`` are the members' planned steady-state periods.
    """

    jobs: tuple[int, ...]
    bins: tuple[tuple[int, ...], ...]
    cost_per_hour: float
    members: tuple[Member, ...]
    train_bins: tuple[tuple[int, ...], ...] = ()
    colocated: tuple[int, ...] = ()
    periods: tuple[float, ...] = ()

    @staticmethod
    def of(config: Config, subset: Sequence[int]) -> GroupPlan:
        """The plan of ``config`` whose k-th job is job ``subset[k]``."""

        def rename(bins: tuple[tuple[int, ...], ...]) -> tuple[tuple[int, ...], ...]:
            return tuple(tuple(subset[k] for k in block) for block in bins)

        return GroupPlan(
            tuple(subset),
            rename(config.rollout_bins),
            config.cost_per_hour,
            config.members,
            rename(config.train_bins),
            tuple(subset[k] for k in config.colocated),
            config.periods,
        )


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


def cheapest_group(
    jobs: Sequence[JobSpec], subset: Sequence[int], cost: CostModel, planning: Planning, colocate: bool = True
) -> GroupPlan | None:
    """The cheapest feasible connected configuration of exactly these jobs in their
    :func:`~rollmux.core.configs.turn_order` (the bound's and regrouping's), or None."""
    ordered = sorted(subset, key=lambda i: turn_key(jobs[i]))
    config = cheapest_config([jobs[i] for i in ordered], cost, planning, colocate)
    return None if config is None else GroupPlan.of(config, ordered)


MAX_OPTIMUM_JOBS = 12
"""The most jobs :func:`optimum` takes: it searches every subset of up to ``max_group``
of them (3,796 sets of at most 8 out of 12); beyond, use ``rollmux.core.bound``."""


def candidate_groups(
    jobs: Sequence[JobSpec],
    cost: CostModel,
    planning: Planning,
    colocate: bool = True,
    max_group: int = MAX_GROUP_JOBS,
) -> list[GroupPlan]:
    """The cheapest feasible configuration of every subset of at most ``max_group`` jobs."""
    plans = []
    for size in range(1, min(len(jobs), max_group) + 1):
        for subset in itertools.combinations(range(len(jobs)), size):
            plan = cheapest_group(jobs, subset, cost, planning, colocate)
            if plan is not None:
                plans.append(plan)
    return plans


def optimum(
    jobs: Sequence[JobSpec],
    cost: CostModel | None = None,
    planning: Planning = DEFAULT_PLANNING,
    colocate: bool = True,
    max_group: int = MAX_GROUP_JOBS,
) -> Optimum:
    """The cheapest partition of ``jobs`` into feasible groups of at most ``max_group``
    jobs (exact set-partitioning MILP), in the configuration space RollMux places in and
    :func:`rollmux.core.bound.lower_bound` bounds by default: co-located seats allowed,
    groups up to ``MAX_GROUP_JOBS``. Raises ProblemTooLarge beyond ``MAX_OPTIMUM_JOBS``
    jobs or ``MAX_GROUP_JOBS`` per group: its work grows with the number of subsets."""
    if len(jobs) > MAX_OPTIMUM_JOBS or not 1 <= max_group <= MAX_GROUP_JOBS:
        raise ProblemTooLarge(
            f"the exact optimum takes at most {MAX_OPTIMUM_JOBS} jobs in groups of 1 to {MAX_GROUP_JOBS}; "
            f"asked for {len(jobs)} jobs in groups of up to {max_group} (rollmux.core.bound bounds any number)"
        )
    cost = cost or CostModel()
    plans = candidate_groups(jobs, cost, planning, colocate, max_group)
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
