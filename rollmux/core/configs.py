"""The cheapest configuration of one group of jobs, over every way to share nodes.

A configuration splits the group's jobs into rollout bins and, independently, into
training bins: the jobs of a bin share its nodes (as many as the widest job in it; a
narrower job may sit on any of them). So several trainers may share rollout nodes, a
trainer may serve several rollout bins, and groups may have any size the SLOs allow.
With ``colocate``, a job may also run both phases on its training bin with its
co-located phase times (no rollout node of its own), next to disaggregated jobs: every
choice of which jobs co-locate is a candidate, tried in the order of a price floor and
dropped once the floor reaches the cheapest configuration found, so the search stays
complete for any group size without trying all 2^n choices in full.

Only connected configurations count (every job reaches every other through shared
nodes): a disconnected one is two groups, each a column of its own. In a connected
group every job has the same steady-state period, so no node may be loaded beyond the
tightest SLO budget of the group and no job's own chain may exceed it; bins and pairs of
partitions failing that are pruned before the exact round-robin check.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from types import MappingProxyType

import numpy as np

from rollmux.core.cluster import MAX_GROUP_JOBS, Member
from rollmux.core.errors import ProblemTooLarge
from rollmux.core.roundrobin import lower_bounds, steady_state
from rollmux.core.spec import CostModel, JobSpec, PhaseTime, Planning, Pool

_TOL = 1e-9

Partition = tuple[tuple[int, ...], ...]
"""Jobs (by index) split into bins that share nodes."""

COLOCATED_RATIO_ROLLOUT = 1.98
COLOCATED_RATIO_TRAIN = 1.03
"""Estimate of co-located phase times from disaggregated ones when a job has none: the
largest ratio of the production profile's co-located to disaggregated time, per phase
(rollout ranges 0.61-1.98, training 0.85-1.03). The largest, so an estimate never
promises an SLO that measured times would break on any profiled job type."""
COLOCATED_ESTIMATE_RULE = (
    f"co-located rollout = {COLOCATED_RATIO_ROLLOUT} x rollout, co-located training = {COLOCATED_RATIO_TRAIN} x "
    "training (rollmux.core.configs.colocated_phases), where a job's profile gives no co-located times"
)
"""How planning says which times it estimated (simulate's table and JSON)."""


def colocated_phases(job: JobSpec) -> tuple[PhaseTime, PhaseTime]:
    """The job's co-located phase times: measured if given, else the documented estimate."""
    if job.colocated is not None:
        return job.colocated
    return (
        PhaseTime(
            job.rollout.mean * COLOCATED_RATIO_ROLLOUT,
            cv=job.rollout.cv,
            high=_scaled(job.rollout.high, COLOCATED_RATIO_ROLLOUT),
        ),
        PhaseTime(
            job.train.mean * COLOCATED_RATIO_TRAIN, cv=job.train.cv, high=_scaled(job.train.high, COLOCATED_RATIO_TRAIN)
        ),
    )


def _scaled(value: float | None, ratio: float) -> float | None:
    return None if value is None else value * ratio


def with_colocated_times(job: JobSpec) -> JobSpec:
    """The job carrying the co-located times it is planned with (so the cluster uses them)."""
    return job if job.colocated is not None else replace(job, colocated=colocated_phases(job))


@dataclass
class Checks:
    """The work a search may still do (None: unbounded): ``left`` exact round-robin
    checks, and ``steps`` of enumeration (every pair of partitions and every seating it
    considers, checked or not). Steps bound what checks alone do not: with loose SLOs and
    small states nearly every pairing fits, and a search of seven jobs could consider
    millions of seatings before its first check.

    Regrouping bounds its work per event with it, deterministically: a search that runs
    out sets ``ran_out`` and answers the cheapest configuration it found before (None if
    none), which only forgoes a saving; the bound prices such a set at its floor instead.
    """

    left: int | None = None
    steps: int | None = None
    ran_out: bool = False

    def take(self) -> bool:
        """Spend one exact check, if any is left."""
        if self.left is None:
            return True
        if self.left <= 0:
            self.ran_out = True
            return False
        self.left -= 1
        return True

    def step(self) -> bool:
        """Spend one enumeration step, if any is left."""
        if self.steps is None:
            return True
        if self.steps <= 0:
            self.ran_out = True
            return False
        self.steps -= 1
        return True


@dataclass(frozen=True)
class Config:
    """One group's cheapest configuration: its members seated on local node ids
    (training nodes first), its bins and its hourly price."""

    jobs: tuple[JobSpec, ...]
    members: tuple[Member, ...]
    rollout_bins: tuple[tuple[int, ...], ...]
    train_bins: tuple[tuple[int, ...], ...]
    colocated: tuple[int, ...]
    cost_per_hour: float
    periods: tuple[float, ...]

    def slowdown(self, name: str) -> float:
        """Planned period of the named member over its mean solo disaggregated iteration."""
        for member, period in zip(self.members, self.periods, strict=True):
            if member.job.name == name:
                return period / member.job.solo_iteration()
        raise KeyError(name)


@dataclass(frozen=True)
class _Job:
    """The numbers the search needs of one job, disaggregated and co-located. A rollout
    that moves its tail lasts ``rollout_s`` (its chain) but is elastic: it loads its nodes
    by ``rollout_load`` on average and by ``rollout_least`` (0) at least on any one."""

    spec: JobSpec
    rollout_s: float
    train_s: float
    colo_s: float
    rollout_load: float
    rollout_least: float

    @staticmethod
    def of(spec: JobSpec, planning: Planning) -> _Job:
        colo_r, colo_t = colocated_phases(spec)
        rollout = spec.planned_rollout(planning)
        return _Job(
            spec,
            rollout,
            spec.train.planned(planning),
            colo_r.planned(planning) + colo_t.planned(planning),
            spec.rollout_node_seconds(spec.rollout.planned(planning)) / spec.rollout_width,
            0.0 if spec.moves_tail else rollout,
        )


def turn_order(jobs: Sequence[JobSpec]) -> list[JobSpec]:
    """The order a group's jobs take their turns in, in every exact search (the first
    rollout queues first; :func:`~rollmux.core.roundrobin.fcfs_order`): longest rollout
    first, ties by name. A group's periods depend on its turn order, so the optimum, the
    bound and regrouping search one configuration space only because they all use it."""
    return sorted(jobs, key=turn_key)


def turn_key(job: JobSpec) -> tuple[float, str]:
    """Where the job comes in :func:`turn_order`."""
    return -job.rollout.mean, job.name


def cheapest_config(
    jobs: Sequence[JobSpec],
    cost: CostModel,
    planning: Planning,
    colocate: bool = False,
    checks: Checks | None = None,
    below: float = math.inf,
) -> Config | None:
    """The cheapest feasible connected configuration of exactly these jobs, or None.

    Feasible: every member's steady-state period within its SLO budget, every node's
    resident state within its usable host memory. ``checks`` caps the exact checks run.
    ``below``: only a configuration priced below it is wanted (regrouping has no use for
    a dearer one), so the search stops at that price; the one it returns is still the
    cheapest of all, and None then says only that none is priced below ``below``.
    Raises ProblemTooLarge beyond ``MAX_GROUP_JOBS`` jobs: no group holds more.
    """
    if len(jobs) > MAX_GROUP_JOBS:
        raise ProblemTooLarge(
            f"a group holds at most {MAX_GROUP_JOBS} jobs; asked for the configuration of {len(jobs)}"
        )
    items = [_Job.of(j, planning) for j in jobs]
    budget = min(j.period_budget for j in jobs) * (1 + _TOL)
    checks = checks or Checks()
    choices = list(_colocated_choices(len(items), colocate))
    floors = _price_floors(items, choices, cost, budget)
    candidates = [
        (float(floor), rank, colocated)
        for rank, (colocated, floor) in enumerate(zip(choices, floors, strict=True))
        if math.isfinite(floor)
    ]
    best: Config | None = None
    best_rank = 0
    for floor, rank, colocated in sorted(candidates):
        if best is not None and floor > best.cost_per_hour + _TOL:
            break
        ceiling = _ceiling(best, rank < best_rank) if best is not None else below
        if floor >= ceiling:
            continue
        found = _cheapest_with(items, frozenset(colocated), cost, planning, budget, ceiling, checks)
        if found is not None:
            best, best_rank = found, rank
        if checks.ran_out:
            break
    return best


def _colocated_choices(n: int, colocate: bool) -> Iterator[tuple[int, ...]]:
    """Which jobs co-locate: none, or every subset (fewest first) when allowed."""
    if not colocate:
        yield ()
        return
    for k in range(n + 1):
        yield from itertools.combinations(range(n), k)


def _ceiling(best: Config, earlier: bool) -> float:
    """The price a configuration must stay below to replace ``best``: an equal price
    wins only for a choice enumerated earlier, so ties resolve as in enumeration order."""
    return best.cost_per_hour + (_TOL if earlier else -_TOL)


def _price_floors(
    items: Sequence[_Job], choices: Sequence[tuple[int, ...]], cost: CostModel, budget: float
) -> np.ndarray:
    """For every choice of co-located jobs, a price no feasible configuration with exactly
    those co-located can beat (inf when a job's own chain exceeds the budget). Per pool:
    the widest job, the work and the resident state over what one node holds, and
    ``ceil(m / k)`` nodes for the ``m`` phase-widths longer than ``budget / (k + 1)`` (a
    node within the budget runs at most ``k`` of them per period). All choices at once."""
    colocated = _choice_masks(tuple(choices), len(items))
    disagg = ~colocated
    chain = np.where(colocated, [it.colo_s for it in items], [it.rollout_s + it.train_s for it in items])
    specs = [it.spec for it in items]
    rollout = _least_nodes(
        disagg, [it.rollout_load for it in items], specs, Pool.ROLLOUT, cost, budget, [it.rollout_least for it in items]
    )
    train_load = np.where(colocated, [it.colo_s for it in items], [it.train_s for it in items])
    train = _least_nodes(np.ones_like(colocated), train_load, specs, Pool.TRAIN, cost, budget)
    floors = rollout * cost.price(Pool.ROLLOUT) + train * cost.price(Pool.TRAIN)
    return np.where((chain > budget).any(axis=1), np.inf, floors)


@functools.lru_cache(maxsize=64)
def _choice_masks(choices: tuple[tuple[int, ...], ...], n: int) -> np.ndarray:
    """The choices of co-located jobs as a read-only mask per row (the same few recur)."""
    masks = np.zeros((len(choices), n), dtype=bool)
    for row, choice in enumerate(choices):
        masks[row, list(choice)] = True
    masks.flags.writeable = False
    return masks


def _least_nodes(
    members: np.ndarray,
    load: np.ndarray | Sequence[float],
    specs: Sequence[JobSpec],
    pool: Pool,
    cost: CostModel,
    budget: float,
    least: Sequence[float] | None = None,
) -> np.ndarray:
    """Per row of the ``members`` mask: the fewest nodes of ``pool`` its members can fit.
    ``load`` is each phase's mean seconds per node, ``least`` its fewest on any node (the
    crowds count by it; default the mean)."""
    width = members * np.array([s.width(pool) for s in specs])
    load = np.broadcast_to(np.asarray(load, dtype=float), width.shape)
    shortest = load if least is None else np.broadcast_to(np.asarray(least, dtype=float), width.shape)
    work = (width * load).sum(axis=1)
    state = (width * np.array([s.mem_gb(pool) for s in specs])).sum(axis=1)
    nodes = np.maximum(width.max(axis=1), np.ceil(work / budget - _TOL))
    nodes = np.maximum(nodes, np.ceil(state / (cost.usable_dram_gb(pool) + _TOL) - _TOL))
    for k in (1, 2, 3):
        nodes = np.maximum(nodes, np.ceil((width * (shortest > budget / (k + 1))).sum(axis=1) / k - _TOL))
    return nodes


def _cheapest_with(
    items: Sequence[_Job],
    colocated: frozenset[int],
    cost: CostModel,
    planning: Planning,
    budget: float,
    ceiling: float,
    checks: Checks,
) -> Config | None:
    """Cheapest configuration with exactly ``colocated`` co-located, priced below ``ceiling``
    (every job's own chain within the budget: ``_price_floors`` dropped the others).

    A connected configuration has at most one bin more than it has disaggregated jobs:
    a bin of ``b`` jobs links ``b - 1`` of them, ``n`` jobs need ``n - 1`` links, and the
    rollout bins hold only the disaggregated jobs. Partitions with more bins are skipped.
    A layout whose longest chain or most loaded node exceeds the tightest budget cannot
    meet it (the period is at least both): it counts as a check but skips simulating.
    """
    n = len(items)
    disagg = tuple(i for i in range(n) if i not in colocated)
    rollout_load = [it.rollout_load for it in items]
    train_load = [it.colo_s if i in colocated else it.train_s for i, it in enumerate(items)]
    most_bins = len(disagg) + 1
    train_parts = _priced_partitions(
        items, tuple(range(n)), Pool.TRAIN, train_load, cost, budget, most_bins - min(1, len(disagg))
    )
    if not train_parts:
        return None
    rollout_parts = _priced_partitions(items, disagg, Pool.ROLLOUT, rollout_load, cost, budget, most_bins - 1)
    for price, rbins, tbins in _pairs_by_price(rollout_parts, train_parts, ceiling):
        if not checks.step():
            return None
        if len(rbins) + len(tbins) > most_bins or not _connected(n, rbins, tbins):
            continue
        for members in _layouts(items, rbins, tbins, colocated):
            if not checks.step():
                return None
            if not _fits_memory(members, cost):
                continue
            if not checks.take():
                return None
            seats = [m.seat(planning) for m in members]
            if max(lower_bounds(seats)) > budget:
                continue
            periods = steady_state(seats).periods
            if all(p <= m.job.period_budget * (1 + _TOL) for m, p in zip(members, periods, strict=True)):
                return Config(
                    tuple(it.spec for it in items),
                    members,
                    rbins,
                    tbins,
                    tuple(sorted(colocated)),
                    price,
                    periods,
                )
    return None


def _pairs_by_price(
    rollout_parts: _Parts, train_parts: _Parts, ceiling: float
) -> Iterator[tuple[float, Partition, Partition]]:
    """Pairs of a rollout and a training partition priced below ``ceiling``, cheapest
    first (ties in enumeration order: by rollout partition, then training partition),
    generated lazily: a search usually stops at the first cheap pairs, so the pairs of a
    price are never all built (there may be millions), nor most bins named."""
    rollout_at, train_at = rollout_parts.shape.at, train_parts.shape.at
    totals: dict[float, list[tuple[float, float]]] = {}
    for pr in rollout_at:
        for pt in train_at:
            if pr + pt < ceiling:
                totals.setdefault(pr + pt, []).append((pr, pt))
    for total in sorted(totals):
        partner = {r: train_at[pt] for pr, pt in totals[total] for r in rollout_at[pr]}
        for r in sorted(partner):
            for t in partner[r]:
                yield total, rollout_parts.bins(r), train_parts.bins(t)


@dataclass(frozen=True)
class _Shape:
    """Every partition of a pool's jobs that fits, as bit masks with its price, and the
    partitions at each price. It depends only on which subsets fit on how many nodes, and
    the same fits recur across searches, so shapes are shared (read only)."""

    priced: tuple[tuple[float, tuple[int, ...]], ...]
    at: Mapping[float, tuple[int, ...]]


SHARED_SHAPE_JOBS = 6
"""Shapes of at most this many jobs are cached (at most 203 partitions each); larger ones,
up to 4,140 partitions, are rare (only groups online placement filled beyond regrouping's
size) and are built afresh, so the cache's memory stays bounded."""


def _shape(fitting: tuple[int, ...], most_bins: int, price: float) -> _Shape:
    if len(fitting) <= 1 << SHARED_SHAPE_JOBS:
        return _shared_shape(fitting, most_bins, price)
    return _build_shape(fitting, most_bins, price)


@functools.lru_cache(maxsize=8192)
def _shared_shape(fitting: tuple[int, ...], most_bins: int, price: float) -> _Shape:
    return _build_shape(fitting, most_bins, price)


def _build_shape(fitting: tuple[int, ...], most_bins: int, price: float) -> _Shape:
    partitions = _partitions(len(fitting) - 1, fitting, most_bins, {})
    priced = tuple((count * price, masks) for count, masks in partitions)
    at: dict[float, list[int]] = {}
    for index, (total, _) in enumerate(priced):
        at.setdefault(total, []).append(index)
    return _Shape(priced, MappingProxyType({total: tuple(indices) for total, indices in at.items()}))


@dataclass(frozen=True)
class _Parts:
    """A pool's partitions: a shape over ``members`` (bins named as job indices only
    when a search reaches them)."""

    members: tuple[int, ...]
    shape: _Shape

    def __bool__(self) -> bool:
        return bool(self.shape.priced)

    def bins(self, index: int) -> Partition:
        return tuple(_members_of(mask, self.members) for mask in self.shape.priced[index][1])


def _priced_partitions(
    items: Sequence[_Job],
    members: tuple[int, ...],
    pool: Pool,
    load: Sequence[float],
    cost: CostModel,
    budget: float,
    most_bins: int,
) -> _Parts:
    """Every partition of ``members`` into at most ``most_bins`` bins whose average node
    load and memory fit. Bins are bit masks over ``members`` while searching; each set's
    node count and fit is computed once, from the set without its lowest member."""
    width = [items[i].spec.width(pool) for i in members]
    work = [w * load[i] for w, i in zip(width, members, strict=True)]
    mem = [w * items[i].spec.mem_gb(pool) for w, i in zip(width, members, strict=True)]
    usable = cost.usable_dram_gb(pool) + _TOL
    size = 1 << len(members)
    nodes, works, mems, fitting = [0] * size, [0.0] * size, [0.0] * size, [0] * size
    for mask in range(1, size):
        low = mask & -mask
        k, rest = low.bit_length() - 1, mask ^ low
        nodes[mask] = max(nodes[rest], width[k])
        works[mask], mems[mask] = works[rest] + work[k], mems[rest] + mem[k]
        fits = works[mask] <= budget * nodes[mask] and mems[mask] <= usable * nodes[mask]
        fitting[mask] = nodes[mask] if fits else 0
    return _Parts(members, _shape(tuple(fitting), most_bins, cost.price(pool)))


@functools.lru_cache(maxsize=1 << 16)
def _members_of(mask: int, members: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(member for bit, member in enumerate(members) if mask >> bit & 1)


def _partitions(mask: int, fitting: Sequence[int], most_blocks: int, memo: dict) -> list[tuple[int, tuple[int, ...]]]:
    """Partitions of the set ``mask`` into at most ``most_blocks`` fitting blocks, each
    with its node count, in the order of the first member's block-mates by size then
    lexicographically (as ``itertools.combinations`` gives them); ``memo`` shares the
    partitions of a remainder between the branches that leave it."""
    if not mask:
        return [(0, ())]
    if most_blocks <= 0:
        return []
    key = (mask, most_blocks)
    if key not in memo:
        low = mask & -mask
        out: list[tuple[int, tuple[int, ...]]] = []
        for mates in _submasks(mask ^ low):
            block = low | mates
            count = fitting[block]
            if count:
                tails = _partitions(mask ^ block, fitting, most_blocks - 1, memo)
                out.extend((count + rest, (block, *tail)) for rest, tail in tails)
        memo[key] = out
    return memo[key]


@functools.lru_cache(maxsize=1 << 12)
def _submasks(mask: int) -> tuple[int, ...]:
    """Every subset of ``mask``, by size then lexicographically by member."""
    bits = [1 << b for b in range(mask.bit_length()) if mask >> b & 1]
    return tuple(sum(c) for k in range(len(bits) + 1) for c in itertools.combinations(bits, k))


def _connected(n: int, *partitions: tuple[tuple[int, ...], ...]) -> bool:
    """Whether shared bins link every job to every other."""
    parent = list(range(n))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for bins in partitions:
        for block in bins:
            for i in block[1:]:
                parent[find(i)] = find(block[0])
    return len({find(i) for i in range(n)}) == 1


def _layouts(
    items: Sequence[_Job],
    rbins: tuple[tuple[int, ...], ...],
    tbins: tuple[tuple[int, ...], ...],
    colocated: frozenset[int],
) -> Iterator[tuple[Member, ...]]:
    """Every way to seat the jobs on their bins' nodes: training nodes are numbered first,
    rollout nodes after; a job narrower than its bin may use any of its nodes."""
    train_nodes = _bin_nodes(items, tbins, Pool.TRAIN, 0)
    first_rollout = sum(max(items[i].spec.train_width for i in b) for b in tbins)
    rollout_nodes = _bin_nodes(items, rbins, Pool.ROLLOUT, first_rollout)
    choices = []
    for i, it in enumerate(items):
        trains = list(itertools.combinations(train_nodes[i], it.spec.train_width))
        if i in colocated:
            spec = with_colocated_times(it.spec)
            choices.append([(spec, t, t) for t in trains])
        else:
            rollouts = itertools.combinations(rollout_nodes[i], it.spec.rollout_width)
            choices.append([(it.spec, r, t) for r, t in itertools.product(rollouts, trains)])
    for layout in itertools.product(*choices):
        yield tuple(
            Member(spec, rollout, train, colocated=i in colocated) for i, (spec, rollout, train) in enumerate(layout)
        )


def _bin_nodes(
    items: Sequence[_Job], bins: tuple[tuple[int, ...], ...], pool: Pool, first: int
) -> dict[int, tuple[int, ...]]:
    out: dict[int, tuple[int, ...]] = {}
    node = first
    for block in bins:
        width = max(items[i].spec.width(pool) for i in block)
        for i in block:
            out[i] = tuple(range(node, node + width))
        node += width
    return out


def _fits_memory(members: Sequence[Member], cost: CostModel) -> bool:
    """Resident state per node within its usable DRAM (a co-located job counts its
    training state only, as the cluster does)."""
    used: dict[tuple[Pool, int], float] = {}
    for m in members:
        if not m.colocated:
            for node in m.rollout_nodes:
                used[(Pool.ROLLOUT, node)] = used.get((Pool.ROLLOUT, node), 0.0) + m.job.rollout_mem_gb
        for node in m.train_nodes:
            used[(Pool.TRAIN, node)] = used.get((Pool.TRAIN, node), 0.0) + m.job.train_mem_gb
    return all(gb <= cost.usable_dram_gb(pool) + _TOL for (pool, _), gb in used.items())
