"""Inter-group placement policies: RollMux's least-marginal-cost greedy and the baselines.

Every policy answers one question, ``choose(cluster, job) -> Candidate``, and the cluster
commits the answer. Baselines are other policies behind the same interface, so the
simulator compares them on equal terms and the runtime can run any of them.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Protocol

from rollmux.core.cluster import MAX_GROUP_JOBS, Candidate, Cluster, Group, Member, PlacementKind
from rollmux.core.configs import with_colocated_times
from rollmux.core.errors import ResidencyExceeded
from rollmux.core.roundrobin import SteadyState
from rollmux.core.spec import JobSpec, Pool

_SLO_TOL = 1e-9
_MAX_NODE_CHOICES = 6


class Policy(Protocol):
    """A placement policy: picks where an arriving job goes; never moves running jobs."""

    name: str

    def choose(self, cluster: Cluster, job: JobSpec) -> Candidate: ...


def _new_nodes(pool: Pool, width: int, first: int) -> tuple[tuple[int, Pool], ...]:
    """Placeholders (negative ids) for ``width`` nodes to be added to ``pool``."""
    return tuple((first - k, pool) for k in range(width))


def isolate(cluster: Cluster, job: JobSpec) -> Candidate:
    """A new group with the job's own rollout and training nodes (Solo-disaggregated)."""
    rollout = _new_nodes(Pool.ROLLOUT, job.rollout_width, -1)
    train = _new_nodes(Pool.TRAIN, job.train_width, -1 - job.rollout_width)
    delta = job.rollout_width * cluster.cost.price(Pool.ROLLOUT) + job.train_width * cluster.cost.price(Pool.TRAIN)
    member = Member(job, tuple(n for n, _ in rollout), tuple(n for n, _ in train))
    return Candidate(PlacementKind.ISOLATE, None, member, rollout + train, delta)


def _nodes_with_room(cluster: Cluster, group: Group, job: JobSpec, pool: Pool) -> list[int]:
    """The group's nodes of ``pool`` whose host DRAM still holds the job's state, least loaded first."""
    nodes = group.rollout_nodes if pool is Pool.ROLLOUT else group.train_nodes
    limit = cluster.cost.usable_dram_gb(pool) - job.mem_gb(pool)
    load = group.schedule.busy_s
    room = [n for n in nodes if group.mem_used_gb(n) <= limit + _SLO_TOL]
    return sorted(room, key=lambda n: (load.get(n, 0.0), n))


def _node_choices(cluster: Cluster, group: Group, job: JobSpec, pool: Pool) -> list[tuple[int, ...]]:
    room = _nodes_with_room(cluster, group, job, pool)
    return list(itertools.islice(itertools.combinations(room, job.width(pool)), _MAX_NODE_CHOICES))


def _full(group: Group) -> bool:
    """A group of ``MAX_GROUP_JOBS`` takes no one else, however loose the SLOs."""
    return len(group.members) >= MAX_GROUP_JOBS


def pack_candidates(cluster: Cluster, group: Group, job: JobSpec) -> Iterator[Candidate]:
    """The job on the group's existing nodes (marginal cost 0), least loaded nodes first."""
    if _full(group):
        return
    train_choices = _node_choices(cluster, group, job, Pool.TRAIN)
    for rollout in _node_choices(cluster, group, job, Pool.ROLLOUT):
        for train in train_choices:
            yield Candidate(PlacementKind.PACK, group.id, Member(job, rollout, train), (), 0.0)


def scale_rollout_candidates(cluster: Cluster, group: Group, job: JobSpec) -> Iterator[Candidate]:
    """The job on new rollout nodes of its own, sharing the group's trainers.

    Scaling the training side instead was tried and dropped: on the production trace it
    lowered the Solo/RollMux cost ratio.
    """
    if _full(group):
        return
    new_rollout = _new_nodes(Pool.ROLLOUT, job.rollout_width, -1)
    delta = job.rollout_width * cluster.cost.price(Pool.ROLLOUT)
    for train in _node_choices(cluster, group, job, Pool.TRAIN):
        member = Member(job, tuple(n for n, _ in new_rollout), train)
        yield Candidate(PlacementKind.SCALE_ROLLOUT, group.id, member, new_rollout, delta)


def colocated_pack_candidates(cluster: Cluster, group: Group, job: JobSpec) -> Iterator[Candidate]:
    """The job co-located on the group's training nodes (marginal cost 0): both its phases
    there, on its co-located times (measured, else the documented estimate, reported as
    such by the simulator)."""
    if _full(group):
        return
    colocated = with_colocated_times(job)
    for train in _node_choices(cluster, group, job, Pool.TRAIN):
        yield Candidate(PlacementKind.PACK, group.id, Member(colocated, train, train, colocated=True), (), 0.0)


def isolate_colocated(cluster: Cluster, job: JobSpec) -> Candidate:
    """A new group of training nodes only, the job running both phases there (veRL style)."""
    train = _new_nodes(Pool.TRAIN, job.train_width, -1)
    ids = tuple(n for n, _ in train)
    member = Member(with_colocated_times(job), ids, ids, colocated=True)
    return Candidate(PlacementKind.ISOLATE, None, member, train, job.train_width * cluster.cost.price(Pool.TRAIN))


def group_candidates(cluster: Cluster, group: Group, job: JobSpec) -> Iterator[Candidate]:
    """Every residency-respecting candidate in one group, cheapest kind first."""
    yield from pack_candidates(cluster, group, job)
    yield from scale_rollout_candidates(cluster, group, job)


def _group_may_host(cluster: Cluster, group: Group, job: JobSpec) -> bool:
    """Cheap group-level prune: the job's chain and its training on the least loaded trainer
    must fit the tightest SLO in the group. Saturated groups fail here and are skipped."""
    budget = min(group.budget_s, job.period_budget)
    if job.planned_iteration(cluster.planning) > budget * (1 + _SLO_TOL):
        return False
    load = group.schedule.busy_s
    least = min((load.get(n, 0.0) for n in group.train_nodes), default=float("inf"))
    return least + job.train.planned(cluster.planning) <= budget * (1 + _SLO_TOL)


def _may_fit(cluster: Cluster, group: Group | None, candidate: Candidate) -> bool:
    """Cheap necessary condition: the lower bounds with the job added stay within every SLO."""
    job = candidate.member.job
    budget = job.period_budget
    if group is not None:
        budget = min(budget, group.budget_s)
        load = group.schedule.busy_s
        seat = candidate.member.seat(cluster.planning)
        for nodes, extra in ((seat.rollout_nodes, seat.rollout_s), (seat.train_nodes, seat.train_s)):
            if any(load.get(n, 0.0) + extra > budget * (1 + _SLO_TOL) for n in nodes):
                return False
    return True


def _within_slo(cluster: Cluster, group: Group | None, candidate: Candidate, state: SteadyState) -> bool:
    members = (group.members if group else []) + [candidate.member]
    return all(
        period <= m.job.period_budget * (1 + _SLO_TOL) for m, period in zip(members, state.periods, strict=False)
    )


COLOCATE_ALONE_ROLLOUT_SHARE = 0.45
"""A job starts a co-located group of its own only if its rollout is at most this share of
its iteration: a balanced job isolated co-located takes a trainer that later jobs could
have packed around, while a training-bound one would leave a rollout node of its own
mostly idle. Chosen by measurement (bench/online_placement.py)."""


def _training_bound(cluster: Cluster, job: JobSpec) -> bool:
    rollout = job.rollout.planned(cluster.planning)
    return rollout <= COLOCATE_ALONE_ROLLOUT_SHARE * job.planned_iteration(cluster.planning)


@dataclass
class RollMuxPolicy:
    """Least marginal cost placement within every touched job's SLO and the residency limit.

    Candidates are tried by marginal cost, cheapest first: pack into an existing group (no
    new node), disaggregated, then co-located on its training nodes; then whichever of
    scaling a group's rollout side (new rollout nodes only) and a co-located group of its
    own (new training nodes only) adds the cheaper nodes; then isolate (a new disaggregated
    group). Within a level, groups are tried oldest first and the first feasible candidate
    wins (first fit). Feasibility is the exact steady state of the group's round-robin
    schedule with the job added, so groups bound by a shared node (T2 > T1) are used as
    long as every member's SLO holds. ``scale_rollout=False`` gives the pack-or-isolate
    ablation; ``colocate=False`` never co-locates (placement before 2026-12-03).
    """

    name: str = "rollmux"
    scale_rollout: bool = True
    colocate: bool = True

    def choose(self, cluster: Cluster, job: JobSpec) -> Candidate:
        check_residency(cluster, job)
        hosts = [g for g in cluster.groups.values() if _group_may_host(cluster, g, job)]
        for level in self._levels(cluster, job):
            if level is isolate_colocated:
                alone = isolate_colocated(cluster, job)
                if _training_bound(cluster, job) and _within_slo(
                    cluster, None, alone, cluster.evaluate(None, alone.member)
                ):
                    return alone
                continue
            for group in hosts:
                for candidate in level(cluster, group, job):
                    if _may_fit(cluster, group, candidate) and _within_slo(
                        cluster, group, candidate, cluster.evaluate(group, candidate.member)
                    ):
                        return candidate
        return isolate(cluster, job)

    def join(self, cluster: Cluster, group: Group, job: JobSpec) -> Candidate | None:
        """The cheapest feasible candidate for ``job`` in ``group`` as it is (pack, then
        co-located pack, then new rollout nodes of its own), or None: regrouping moves a
        running job into another group this way, without moving that group's jobs."""
        if not _group_may_host(cluster, group, job):
            return None
        for level in self._levels(cluster, job):
            if level is isolate_colocated:
                continue
            for candidate in level(cluster, group, job):
                if _may_fit(cluster, group, candidate) and _within_slo(
                    cluster, group, candidate, cluster.evaluate(group, candidate.member)
                ):
                    return candidate
        return None

    def _levels(self, cluster: Cluster, job: JobSpec) -> list:
        """The candidate kinds in order of the nodes they add (stable for equal prices)."""
        levels: list = [pack_candidates]
        priced = []
        if self.colocate:
            levels.append(colocated_pack_candidates)
            priced.append((job.train_width * cluster.cost.price(Pool.TRAIN), 1, isolate_colocated))
        if self.scale_rollout:
            priced.append((job.rollout_width * cluster.cost.price(Pool.ROLLOUT), 0, scale_rollout_candidates))
        return levels + [level for _, _, level in sorted(priced, key=lambda p: (p[0], p[1]))]


def check_residency(cluster: Cluster, job: JobSpec) -> None:
    """Refuse a job whose state alone overflows a node's usable host memory."""
    for pool in Pool:
        if job.mem_gb(pool) > cluster.cost.usable_dram_gb(pool):
            raise ResidencyExceeded(
                f"job {job.name}: {pool.value} state of {job.mem_gb(pool):.0f} GB exceeds the "
                f"{cluster.cost.usable_dram_gb(pool):.0f} GB of usable host memory per {pool.value} node"
            )


@dataclass
class SoloPolicy:
    """Solo-disaggregated baseline: every job gets its own rollout and training nodes."""

    name: str = "solo"

    def choose(self, cluster: Cluster, job: JobSpec) -> Candidate:
        return isolate(cluster, job)


@dataclass
class ColocatedPolicy:
    """Co-located baseline (veRL style): both phases time-share the job's training nodes."""

    name: str = "colocated"

    def choose(self, cluster: Cluster, job: JobSpec) -> Candidate:
        if job.colocated is None:
            raise ValueError(f"job {job.name}: the co-located baseline needs co-located phase times")
        train = _new_nodes(Pool.TRAIN, job.train_width, -1)
        ids = tuple(n for n, _ in train)
        member = Member(job, ids, ids, colocated=True)
        return Candidate(PlacementKind.ISOLATE, None, member, train, job.train_width * cluster.cost.price(Pool.TRAIN))


@dataclass
class RandomPolicy:
    """SLO-blind baseline: a uniformly random residency-feasible candidate."""

    seed: int = 0
    name: str = "random"
    rng: random.Random = field(init=False)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)

    def choose(self, cluster: Cluster, job: JobSpec) -> Candidate:
        options = [c for g in cluster.groups.values() for c in group_candidates(cluster, g, job)]
        options.append(isolate(cluster, job))
        return self.rng.choice(options)


POLICIES = {"rollmux": RollMuxPolicy, "solo": SoloPolicy, "colocated": ColocatedPolicy, "random": RandomPolicy}


def make_policy(name: str, seed: int = 0) -> Policy:
    """Policy by name; ``seed`` feeds the randomised ones."""
    if name not in POLICIES:
        raise ValueError(f"unknown policy {name!r}; choose from {', '.join(POLICIES)}")
    return RandomPolicy(seed=seed) if name == "random" else POLICIES[name]()


def place(cluster: Cluster, policy: Policy, job: JobSpec):
    """Choose with ``policy`` and commit: the one call both drivers make on arrival."""
    return cluster.commit(policy.choose(cluster, job))


__all__ = [
    "ColocatedPolicy",
    "Policy",
    "RandomPolicy",
    "RollMuxPolicy",
    "SoloPolicy",
    "make_policy",
    "place",
]
