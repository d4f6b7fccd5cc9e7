"""Cluster state: co-execution groups, the nodes they hold, and their schedules.

The cluster is the only mutable object of the core. It changes through two calls,
``commit`` (a placement decided by a policy) and ``remove`` (a departure), and never
reads a clock or does I/O, so the simulator and the runtime drive it identically.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import Enum

from rollmux.core.errors import UnknownJob
from rollmux.core.roundrobin import Seat, SteadyState, steady_state
from rollmux.core.spec import DEFAULT_PLANNING, CostModel, JobSpec, PhaseTime, Planning, Pool

MAX_GROUP_JOBS = 8
"""The most jobs one co-execution group holds, whatever the SLOs allow. Residency keeps
real groups to a handful (published: 3B roles take 113-156 GB of a node's ~1.6 TB usable
DRAM), and every member waits for all others' phases in each meta-iteration. The exact
search of a group's configurations grows with the Bell number of its size, so this is
also what bounds the work of planning any input: no policy packs a job into a full
group, and regrouping, the optimum and the bound search no larger set (the production
trace's groups never exceed 6, bursty 300-job traces 7)."""


class PlacementKind(str, Enum):
    PACK = "pack"
    SCALE_ROLLOUT = "scale-rollout"
    ISOLATE = "isolate"


@dataclass(frozen=True)
class Member:
    """A job seated in a group on named nodes. Co-located members run both phases on
    their training nodes with their co-located phase times."""

    job: JobSpec
    rollout_nodes: tuple[int, ...]
    train_nodes: tuple[int, ...]
    colocated: bool = False

    def seat(self, planning: Planning) -> Seat:
        """Its planned phases on its nodes; an elastic rollout when it has a tail to move."""
        rollout, train = self.phases()
        planned, train_s = rollout.planned(planning), train.planned(planning)
        tail = self.job.tail
        if self.colocated or tail is None or not tail.applies(len(self.rollout_nodes)):
            return Seat(planned, train_s, self.rollout_nodes, self.train_nodes)
        whole = tail.rollout_s(planned)
        share = tail.tail_s(planned) / whole if whole > 0 else 0.0
        return Seat(whole, train_s, self.rollout_nodes, self.train_nodes, share, tail.nodes)

    def resident_gb(self, node: int) -> float:
        """Host memory the member's state takes on ``node``, as residency counts it (a
        co-located member holds only its training state there)."""
        used = self.job.rollout_mem_gb if node in self.rollout_nodes and not self.colocated else 0.0
        return used + (self.job.train_mem_gb if node in self.train_nodes else 0.0)

    def phases(self) -> tuple[PhaseTime, PhaseTime]:
        """The distributions of the member's two phases where it is seated."""
        if self.colocated and self.job.colocated is not None:
            return self.job.colocated
        return self.job.rollout, self.job.train


@dataclass(frozen=True)
class Candidate:
    """A possible placement of one job. Negative node ids stand for nodes to be added.

    ``delta_per_hour`` is the marginal cost: the price of the nodes it adds.
    """

    kind: PlacementKind
    group_id: int | None
    member: Member
    new_nodes: tuple[tuple[int, Pool], ...]
    delta_per_hour: float


@dataclass
class Group:
    """A set of jobs pinned to a fixed set of rollout and training nodes."""

    id: int
    rollout_nodes: list[int]
    train_nodes: list[int]
    members: list[Member]
    schedule: SteadyState = field(default_factory=lambda: steady_state([]))
    budget_s: float = float("inf")
    """The longest period every member tolerates (min of SLO × solo time), kept with the schedule."""

    def seats(self, planning: Planning) -> list[Seat]:
        return [m.seat(planning) for m in self.members]

    def slowdowns(self) -> dict[str, float]:
        """Each member's planned period over its mean solo disaggregated iteration time."""
        return {
            m.job.name: period / m.job.solo_iteration()
            for m, period in zip(self.members, self.schedule.periods, strict=False)
        }

    def mem_used_gb(self, node: int) -> float:
        return sum(m.resident_gb(node) for m in self.members)


@dataclass(frozen=True)
class Placement:
    """The decision returned to the driver: where the job went and what it cost."""

    job: str
    group_id: int
    kind: PlacementKind
    added_nodes: tuple[tuple[int, Pool], ...]
    delta_per_hour: float


@dataclass(frozen=True)
class Removal:
    job: str
    group_id: int
    released_nodes: tuple[tuple[int, Pool], ...]


@dataclass
class Cluster:
    """All groups and nodes of one cluster under one cost model and planning mode."""

    cost: CostModel = field(default_factory=CostModel)
    planning: Planning = DEFAULT_PLANNING
    groups: dict[int, Group] = field(default_factory=dict)
    node_pool: dict[int, Pool] = field(default_factory=dict)
    job_group: dict[str, int] = field(default_factory=dict)
    _next_node: int = 0
    _next_group: int = 0

    @staticmethod
    def restore(
        cost: CostModel,
        planning: Planning,
        groups: Iterable[tuple[int, list[int], list[int], list[Member]]],
        node_pool: dict[int, Pool],
        next_node: int,
        next_group: int,
    ) -> Cluster:
        """Rebuild a cluster exactly as it was persisted: same groups, nodes and members, in
        the same order, with their schedules recomputed (they are derived state)."""
        cluster = Cluster(cost=cost, planning=planning, node_pool=dict(node_pool))
        for group_id, rollout_nodes, train_nodes, members in groups:
            group = Group(group_id, list(rollout_nodes), list(train_nodes), list(members))
            cluster.groups[group_id] = group
            for member in members:
                cluster.job_group[member.job.name] = group_id
            cluster._reschedule(group)
        cluster._next_node, cluster._next_group = next_node, next_group
        return cluster

    @property
    def next_ids(self) -> tuple[int, int]:
        """The next node id and group id to be handed out (persisted with the state)."""
        return self._next_node, self._next_group

    def group_of(self, job: str) -> Group:
        if job not in self.job_group:
            raise UnknownJob(f"job {job!r} is not placed in this cluster")
        return self.groups[self.job_group[job]]

    def nodes(self, pool: Pool) -> int:
        return sum(1 for p in self.node_pool.values() if p is pool)

    def cost_per_hour(self) -> float:
        return sum(self.cost.price(p) for p in self.node_pool.values())

    def evaluate(self, group: Group | None, member: Member) -> SteadyState:
        """Schedule the group would have with ``member`` added (pure: nothing changes)."""
        seats = (group.seats(self.planning) if group else []) + [member.seat(self.planning)]
        return steady_state(seats)

    def commit(self, candidate: Candidate, node_ids: Iterator[int] | None = None) -> Placement:
        """Apply a candidate: allocate its new nodes (on the ids in ``node_ids``, set aside
        beforehand, if given), seat the job, reschedule the group."""
        if candidate.member.job.name in self.job_group:
            raise ValueError(f"job {candidate.member.job.name!r} is already placed")
        renamed = {placeholder: self._allocate(pool, node_ids) for placeholder, pool in candidate.new_nodes}
        member = Member(
            job=candidate.member.job,
            rollout_nodes=tuple(renamed.get(n, n) for n in candidate.member.rollout_nodes),
            train_nodes=tuple(renamed.get(n, n) for n in candidate.member.train_nodes),
            colocated=candidate.member.colocated,
        )
        group = self.groups.get(candidate.group_id) if candidate.group_id is not None else None
        if group is None:
            group = Group(id=self._next_group, rollout_nodes=[], train_nodes=[], members=[])
            self._next_group += 1
            self.groups[group.id] = group
        for placeholder, pool in candidate.new_nodes:
            (group.rollout_nodes if pool is Pool.ROLLOUT else group.train_nodes).append(renamed[placeholder])
        group.members.append(member)
        self._reschedule(group)
        self.job_group[member.job.name] = group.id
        added = tuple((renamed[p], pool) for p, pool in candidate.new_nodes)
        return Placement(member.job.name, group.id, candidate.kind, added, candidate.delta_per_hour)

    def add_group(self, members: Sequence[Member], node_ids: Iterator[int] | None = None) -> Group:
        """Seat several jobs at once in a new group on new nodes (a regrouping's target).

        ``members`` name nodes by local ids; rollout and training ids must not overlap.
        ``node_ids``: ids set aside by :meth:`reserve_ids` for the new nodes, in order.
        """
        local_pools = {n: Pool.ROLLOUT for m in members for n in m.rollout_nodes}
        local_pools.update({n: Pool.TRAIN for m in members for n in m.train_nodes})
        renamed = {local: self._allocate(pool, node_ids) for local, pool in sorted(local_pools.items())}
        group = Group(id=self._next_group, rollout_nodes=[], train_nodes=[], members=[])
        self._next_group += 1
        for local, pool in sorted(local_pools.items()):
            (group.rollout_nodes if pool is Pool.ROLLOUT else group.train_nodes).append(renamed[local])
        for m in members:
            if m.job.name in self.job_group:
                raise ValueError(f"job {m.job.name!r} is already placed")
            seated = replace(
                m,
                rollout_nodes=tuple(renamed[n] for n in m.rollout_nodes),
                train_nodes=tuple(renamed[n] for n in m.train_nodes),
            )
            group.members.append(seated)
            self.job_group[m.job.name] = group.id
        self.groups[group.id] = group
        self._reschedule(group)
        return group

    def reseat(
        self,
        group_id: int,
        members: Sequence[Member],
        kept: Mapping[int, int],
        node_ids: Iterator[int] | None = None,
    ) -> Group:
        """Seat ``members`` (on local node ids, as :meth:`add_group` takes them) in the
        existing group ``group_id`` instead of its members (a regrouping built in place):
        the local ids in ``kept`` are the group's nodes of those ids, the others new nodes.
        Every member the group still has must be among ``members``, on exactly the nodes
        it holds (it stays: nothing of it moves); the others must not be placed anywhere."""
        group = self.groups[group_id]
        local_pools = {n: Pool.ROLLOUT for m in members for n in m.rollout_nodes}
        local_pools.update({n: Pool.TRAIN for m in members for n in m.train_nodes})
        for local, node in kept.items():
            if local not in local_pools:
                raise ValueError(f"local node {local} is no member's node in the new seating of group {group_id}")
            if node not in (*group.rollout_nodes, *group.train_nodes) or self.node_pool[node] is not local_pools[local]:
                raise ValueError(f"node {node} is not a {local_pools[local].value} node of group {group_id}")
        renamed = {
            local: kept[local] if local in kept else self._allocate(pool, node_ids)
            for local, pool in sorted(local_pools.items())
        }
        staying = {m.job.name: m for m in group.members}
        seated = [
            replace(
                m,
                rollout_nodes=tuple(renamed[n] for n in m.rollout_nodes),
                train_nodes=tuple(renamed[n] for n in m.train_nodes),
            )
            for m in members
        ]
        for member in seated:
            name = member.job.name
            was = staying.pop(name, None)
            if was is not None and (was.rollout_nodes, was.train_nodes) != (member.rollout_nodes, member.train_nodes):
                raise ValueError(f"job {name!r} stays in group {group_id} but not on its nodes")
            if was is None and name in self.job_group:
                raise ValueError(f"job {name!r} is already placed")
        if staying:
            raise ValueError(f"group {group_id} still holds {sorted(staying)}, not in its new seating")
        in_use = set(renamed.values())
        for node in (*group.rollout_nodes, *group.train_nodes):
            if node not in in_use:
                del self.node_pool[node]
        new = [n for _, n in sorted(renamed.items()) if n not in (*group.rollout_nodes, *group.train_nodes)]
        group.rollout_nodes = [
            n for n in (*group.rollout_nodes, *new) if n in in_use and self.node_pool[n] is Pool.ROLLOUT
        ]
        group.train_nodes = [n for n in (*group.train_nodes, *new) if n in in_use and self.node_pool[n] is Pool.TRAIN]
        group.members = seated
        for member in seated:
            self.job_group[member.job.name] = group_id
        self._reschedule(group)
        return group

    def remove(self, job: str) -> Removal:
        """Take a job out; release the nodes no remaining member uses, and empty groups."""
        group = self.group_of(job)
        group.members = [m for m in group.members if m.job.name != job]
        del self.job_group[job]
        in_use = {n for m in group.members for n in (*m.rollout_nodes, *m.train_nodes)}
        released = tuple((n, self.node_pool[n]) for n in (*group.rollout_nodes, *group.train_nodes) if n not in in_use)
        for node, _ in released:
            del self.node_pool[node]
        group.rollout_nodes = [n for n in group.rollout_nodes if n in in_use]
        group.train_nodes = [n for n in group.train_nodes if n in in_use]
        if group.members:
            self._reschedule(group)
        else:
            del self.groups[group.id]
        return Removal(job, group.id, released)

    def update_phase_times(self, job: str, rollout: PhaseTime, train: PhaseTime) -> None:
        """Replace a running job's phase profile where it sits (e.g. by measured times): its
        co-located times if it is seated co-located, else its disaggregated ones; reschedule
        its group."""
        group = self.group_of(job)
        group.members = [(_with_phases(m, rollout, train) if m.job.name == job else m) for m in group.members]
        self._reschedule(group)

    def slowdowns(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for group in self.groups.values():
            out.update(group.slowdowns())
        return out

    def busy_node_fraction(self, pool: Pool) -> tuple[float, int]:
        """(Sum of busy fractions of the pool's nodes, node count) for utilisation reports."""
        busy = 0.0
        count = 0
        for group in self.groups.values():
            for node in group.rollout_nodes if pool is Pool.ROLLOUT else group.train_nodes:
                busy += group.schedule.busy_fraction(node)
                count += 1
        return busy, count

    def jobs(self) -> Iterable[JobSpec]:
        return (m.job for g in self.groups.values() for m in g.members)

    def reserve_ids(self, count: int) -> int:
        """Set aside the next ``count`` node ids (for nodes readied before the change that
        will use them, through ``node_ids``); returns the first."""
        first = self._next_node
        self._next_node += count
        return first

    def _allocate(self, pool: Pool, node_ids: Iterator[int] | None = None) -> int:
        if node_ids is not None:
            node = next(node_ids)
        else:
            node = self._next_node
            self._next_node += 1
        self.node_pool[node] = pool
        return node

    def _reschedule(self, group: Group) -> None:
        group.schedule = steady_state(group.seats(self.planning))
        group.budget_s = min(m.job.period_budget for m in group.members)


def _with_phases(member: Member, rollout: PhaseTime, train: PhaseTime) -> Member:
    if member.colocated:
        return replace(member, job=replace(member.job, colocated=(rollout, train)))
    return replace(member, job=replace(member.job, rollout=rollout, train=train))
