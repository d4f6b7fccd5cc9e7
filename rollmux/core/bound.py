"""A proven lower bound on the cheapest placement of any set of running jobs.

The model is the set partitioning the exact optimum and regrouping solve: a placement
splits the jobs into groups of at most ``max_group`` jobs, and a group ``S`` costs
``c_S``, the price of its cheapest feasible connected configuration as
``rollmux.core.configs.cheapest_config`` finds it (SLOs, residency, exact round-robin
steady state; co-located jobs if allowed). ``OPT = min sum_S c_S x_S`` over exact covers
``x``. This module returns a number that is *proven* to be at most ``OPT``, hence at most
the cost of every placement in the model, for any number of jobs. Pure code.

1. Weak duality. For any job values ``pi`` and any ``x`` feasible for the LP relaxation
   (every job covered once, so ``sum_S |S| x_S = n``)::

       sum_S c_S x_S = sum_j pi_j + sum_S x_S (c_S - pi(S)) >= sum_j pi_j + n * rho

   whenever ``rho <= 0`` and every column has ``c_S - pi(S) >= rho |S|``. ``pi`` comes
   from the restricted master LP (HiGHS duals), columns from pricing (column
   generation); ``rho`` is *proven* by a full pricing pass (below). When that pass finds
   no negative reduced cost, ``rho = 0`` and the bound is the LP relaxation itself. It is
   never taken below the fluid price of the jobs (each job's work over its own budget,
   priced), which bounds every group's price too.

2. Whole units. Where the two node prices are in a small whole ratio (the published
   model: a training node costs three rollout nodes), every placement costs a whole
   number of price units, so the bound is raised to the next whole unit.

3. Exact search above the LP. With ``U`` the cheapest placement found among the exact
   columns, a placement cheaper than ``U`` costs at most ``U - unit``, and every one of its
   columns then has ``c_S - pi(S) <= U - unit - sum(pi) - n * min(0, rho)`` (the other
   columns' reduced costs are at least ``rho`` per job). The same pass collects every such
   column; the MILP over them (its dual bound if it stops at its node limit) gives
   ``z``, and ``min(U, z)`` is a lower bound: either nothing beats ``U``, or the columns of
   what does are all there. Columns priced at their floor (below) are cheaper than the
   truth, which only lowers ``z``.

4. Independent parts. Jobs that can never share a group (no chain of pairwise compatible
   jobs links them: each one's shortest chain within the other's budget) are bounded
   separately; the bounds add up.

The pricing pass proves ``rho`` by enumerating every set of at most ``max_group`` jobs
in a depth-first search over jobs sorted by SLO budget, pruned by a price floor
``L(S) <= c_S``. ``L`` holds for every connected configuration because all its jobs share
one steady-state period ``P`` (round-robin: once per meta-iteration each), and ``P`` is at
most the tightest SLO budget ``b`` of the group (configs' acceptance rule), so:

- every job's own chain (rollout + training, or its co-located chain) is at most ``b``;
  a job with neither chain within ``b`` makes ``S`` infeasible;
- a node serves at most ``P <= b`` seconds of phases per meta-iteration, so a pool needs at
  least ``ceil(work / b)`` nodes, and ``ceil(m / k)`` nodes for the ``m`` phase-widths
  longer than ``b / (k + 1)`` (at most ``k`` of them fit a node), ``k = 1, 2, 3``;
- a pool needs at least ``ceil(resident state / usable DRAM)`` nodes and as many as the
  widest job; the rollout pool none if every job runs co-located.

``L`` is the least such price over the jobs' choices of disaggregated or co-located
execution. It only grows as jobs are added (the budget falls, work and state grow), so
every superset ``S + A`` has a reduced cost of at least ``L(S) - pi(S)`` minus what ``A`` can
bring: for every ``t`` in [0, 1], at most ``t (L(S) - F(S))`` plus the ``room`` largest
``pi_j - t f_j``, with ``F`` and ``f_j`` fluid prices at ``S``'s budget (ceilings dropped). A
subtree whose floor is not negative is skipped; every other set gets its exact ``c_S``
(cached across calls: it depends on the specs only). Where the work budget (enumeration
nodes, exact searches) runs out, a skipped subtree's floor enters ``rho`` and an unsearched
set is priced at ``L``: the answer stays a lower bound, only a weaker one.

5. Many jobs. With 50-90 running jobs (bursts) the depth-first pass cannot finish: there
   are billions of sets of eight. Pricing then switches to a MILP over the floor itself:
   for each job ``j`` as the tightest member (budget ``b``), ``min L(S) - pi(S)`` over sets
   ``S`` of jobs of budget at least ``b`` is a small integer program (a binary per job and
   mode, the node counts of both pools as integers, every term of ``L`` a linear
   constraint), solved by HiGHS to a proven dual bound. Sets priced exactly above their
   floor, and infeasible ones, are cut off (each by one no-good row), so the MILP
   prices every other set at its floor, which never exceeds its price. Its finds are
   searched exactly and enter the master, and column generation goes on until no set
   has a negative floor reduced cost. With ``m`` the least reduced cost proven, every
   column costing at least one training node, an LP solution uses at most ``z / p_T``
   columns (``z`` the restricted master's value), so ``sum(pi) + (z / p_T) * min(0, m)``
   bounds the LP from below at every round; at convergence it is the LP of the master.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, MutableMapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, linprog, milp

from rollmux.core.cluster import MAX_GROUP_JOBS
from rollmux.core.configs import Checks, Config, cheapest_config, colocated_phases, turn_order
from rollmux.core.spec import CostModel, JobSpec, Planning, Pool

_TOL = 1e-9
_RC_EPS = 1e-6
_MAX_RATIO_DENOMINATOR = 12
_WEIGHTS = (0.0, 0.25, 0.5, 0.75, 1.0)
"""Weights of the fluid price tried in a subtree's floor (each gives a valid floor)."""
"""A column enters the master only if its reduced cost is below -_RC_EPS; smaller
negative reduced costs still count in ``rho``."""

ConfigCache = MutableMapping[frozenset[JobSpec], Config | None]


@dataclass(frozen=True)
class BoundConfig:
    """The model's group size limit, whether jobs may co-locate, and the work budget
    (counts, not time: the core reads no clock)."""

    max_group: int = MAX_GROUP_JOBS
    """Groups as large as placement builds: a bound over smaller groups only is no bound on
    what the system (or :func:`rollmux.core.optimum.optimum`) can reach."""
    colocate: bool = True
    rounds: int = 30
    columns_per_round: int = 100
    nodes_per_pass: int = 60_000
    evaluations: int = 3000
    """Exact configuration searches (cache misses) per call."""
    steps_per_search: int = 50_000
    steps: int = 5_000_000
    """Enumeration steps (see ``configs.Checks``) per search and per call: a search that
    runs out leaves its set priced at its floor, which only weakens the bound."""
    milp_nodes: int = 2000
    depth_first_jobs: int = 32
    """Parts of more jobs than this are priced by MILP over the floor (module text, 5)
    once growing columns finds nothing: a depth-first pass over them cannot finish."""
    floor_rounds: int = 40
    """Rounds of MILP pricing (module text, 5) once the depth-first pass cannot finish."""
    floor_milp_nodes: int = 200
    """Branch-and-bound nodes of one pricing MILP (its proven dual bound counts if it stops)."""

    def __post_init__(self) -> None:
        if not 1 <= self.max_group <= MAX_GROUP_JOBS:
            raise ValueError(f"max_group must be between 1 and {MAX_GROUP_JOBS} (a group's size limit)")
        for name in (
            "rounds",
            "columns_per_round",
            "nodes_per_pass",
            "evaluations",
            "steps_per_search",
            "milp_nodes",
            "depth_first_jobs",
            "floor_rounds",
            "floor_milp_nodes",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")
        if self.steps < self.steps_per_search:
            raise ValueError("steps must cover at least one search (steps_per_search)")


@dataclass(frozen=True)
class Bound:
    """A proven lower bound on the cheapest placement in the model, and how it was found.

    ``lp``: the column generation's bound, ``dual_sum + jobs * min(0, rho)`` rounded up
    to the price unit (or, where pricing was by MILP over the floor, ``floor_priced``, the
    best bound of module text 5 over its rounds; ``rho`` is then the least reduced cost of
    a set that the MILP proved). ``upper``: the cheapest placement found (exact columns), so the
    optimum lies in ``[value, upper]``; ``optimal`` when they meet. ``value`` is at least
    ``lp``: raised by the exact search over every column that could still improve on
    ``upper`` (see the module text) when that search ran to the end.
    """

    value: float
    lp: float
    upper: float
    dual_sum: float
    rho: float
    jobs: int
    rounds: int
    converged: bool
    enumerated: bool
    columns: tuple[frozenset[JobSpec], ...]
    """The master's columns priced exactly (to warm-start a bound of similar jobs)."""
    floor_priced: bool = False

    @property
    def optimal(self) -> bool:
        return self.value >= self.upper - _TOL * max(1.0, self.upper)


@dataclass(frozen=True)
class _Mode:
    """One way to run a job: its chain, and per pool its per-node load, width and
    resident state per node (rollout width 0: co-located, no rollout node). A rollout that
    moves its tail is elastic, its work shared out over its nodes as they come free:
    ``rollout_load`` is their mean (the work is exact) and ``rollout_least`` 0, since no
    node is sure to carry any of it (the crowd counts stay lower bounds)."""

    chain: float
    train_load: float
    train_width: int
    train_gb: float
    rollout_load: float = 0.0
    rollout_width: int = 0
    rollout_gb: float = 0.0
    rollout_least: float = 0.0


@dataclass(frozen=True)
class _Job:
    """A job's SLO budget and its modes (disaggregated, and co-located if allowed)."""

    spec: JobSpec
    budget: float
    modes: tuple[_Mode, ...]

    @staticmethod
    def of(spec: JobSpec, planning: Planning, colocate: bool) -> _Job:
        rollout = spec.planned_rollout(planning)
        disagg = _Mode(
            spec.planned_iteration(planning),
            spec.train.planned(planning),
            spec.train_width,
            spec.train_mem_gb,
            spec.rollout_node_seconds(spec.rollout.planned(planning)) / spec.rollout_width,
            spec.rollout_width,
            spec.rollout_mem_gb,
            0.0 if spec.moves_tail else rollout,
        )
        modes = [disagg]
        if colocate:
            colo = sum(p.planned(planning) for p in colocated_phases(spec))
            modes.append(_Mode(colo, colo, spec.train_width, spec.train_mem_gb))
        return _Job(spec, spec.period_budget * (1 + _TOL), tuple(modes))

    def allowed(self, budget: float) -> tuple[_Mode, ...]:
        """The modes whose chain fits ``budget``."""
        return tuple(m for m in self.modes if m.chain <= budget)

    def shortest_chain(self, budget: float) -> float:
        """The shortest chain among the modes allowed under ``budget`` (inf if none)."""
        return min((m.chain for m in self.allowed(budget)), default=math.inf)


_CROWDS = (1, 2, 3)
"""A node whose load stays within the budget ``b`` holds at most ``k`` phases longer than
``b / (k + 1)``: so a pool needs ``ceil(count / k)`` nodes for its phases above that."""
_EMPTY = ((0.0, 0.0, 0, (0,) * len(_CROWDS)),) * 2
"""A tally of one set, per pool (train, rollout): work, state, widest job, and the
widths of its phases above ``b / (k + 1)`` for each ``k`` of _CROWDS."""


def _tally(tally: tuple, mode: _Mode, budget: float) -> tuple:
    """``tally`` with one more job run in ``mode`` in a group of budget ``budget``."""
    train, rollout = tally
    train = _add(train, mode.train_width, mode.train_load, mode.train_gb, budget)
    if mode.rollout_width:
        rollout = _add(rollout, mode.rollout_width, mode.rollout_load, mode.rollout_gb, budget, mode.rollout_least)
    return train, rollout


def _add(pool: tuple, width: int, load: float, gb: float, budget: float, least: float | None = None) -> tuple:
    """``pool`` with a phase of ``width`` nodes, ``load`` seconds each on average and at
    least ``least`` on every one (the crowds count by the least)."""
    work, state, widest, crowds = pool
    least = load if least is None else least
    if least > budget / (_CROWDS[-1] + 1):
        crowds = tuple(c + width if least > budget / (k + 1) else c for c, k in zip(crowds, _CROWDS, strict=True))
    return work + width * load, state + width * gb, max(widest, width), crowds


def _nodes(pool: tuple, budget: float, usable_gb: float) -> int:
    """The fewest nodes that can serve a pool's tally (0 if it serves nothing)."""
    work, state, widest, crowds = pool
    if widest == 0:
        return 0
    crowded = max(math.ceil(c / k) for c, k in zip(crowds, _CROWDS, strict=True))
    return max(widest, crowded, math.ceil(work / budget - _TOL), math.ceil(state / usable_gb - _TOL))


@dataclass
class _Floor:
    """The price floor ``L`` and the fluid price ``F`` of sets of jobs (remembered: every
    pass of one call meets the same sets)."""

    jobs: Sequence[_Job]
    cost: CostModel
    seen: dict[tuple[int, ...], tuple[float, float]] = field(default_factory=dict)
    compatible: list[set[int]] = field(default_factory=list)
    """For each job, the later jobs (smaller budget) it can share a group with: its
    shortest chain fits their budget, and theirs too."""
    fluids: dict[tuple[int, int], float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for i, job in enumerate(self.jobs):
            later = range(i + 1, len(self.jobs))
            self.compatible.append(
                {
                    j
                    for j in later
                    if max(job.shortest_chain(self.jobs[j].budget), self.jobs[j].shortest_chain(self.jobs[j].budget))
                    <= self.jobs[j].budget
                }
            )

    def after(self, i: int) -> list[int]:
        return sorted(self.compatible[i])

    def fit(self, members: tuple[int, ...]) -> bool:
        """Whether every pair of these (index-ordered) jobs is compatible."""
        return all(b in self.compatible[a] for a, b in itertools.combinations(members, 2))

    def parts(self) -> list[list[int]]:
        """The jobs split into sets no group can join across (components of the
        compatibility graph), each in index order."""
        parent = list(range(len(self.jobs)))

        def find(i: int) -> int:
            while parent[i] != i:
                parent[i] = parent[parent[i]]
                i = parent[i]
            return i

        for i, later in enumerate(self.compatible):
            for j in later:
                parent[find(j)] = find(i)
        parts: dict[int, list[int]] = {}
        for i in range(len(self.jobs)):
            parts.setdefault(find(i), []).append(i)
        return list(parts.values())

    def of(self, members: tuple[int, ...]) -> tuple[float, float]:
        """(L, F) of the set (inf, inf if no configuration can be feasible)."""
        if members not in self.seen:
            self.seen[members] = self._of(members)
        return self.seen[members]

    def _of(self, members: tuple[int, ...]) -> tuple[float, float]:
        """The least floor over the members' modes; jobs with one allowed mode are
        tallied once, the product runs over the others only, extending the tallies of
        the jobs before (one addition per tally, not one per job per tally)."""
        budget = min(self.jobs[i].budget for i in members)
        fixed = _EMPTY
        flexible = []
        for i in members:
            allowed = self.jobs[i].allowed(budget)
            if not allowed:
                return math.inf, math.inf
            if len(allowed) == 1:
                fixed = _tally(fixed, allowed[0], budget)
            else:
                flexible.append(allowed)
        tallies = [fixed]
        for allowed in flexible:
            tallies = [_tally(tally, mode, budget) for tally in tallies for mode in allowed]
        best = fluid = math.inf
        for tally in tallies:
            price, flow = self._priced(tally, budget)
            best, fluid = min(best, price), min(fluid, flow)
        return best, fluid

    def fluid_of(self, i: int, last: int) -> float:
        """Job ``i``'s fluid price in a group whose budget is job ``last``'s (that of the
        jobs so far; a larger group's is smaller): its cheaper allowed mode's work, priced."""
        key = (i, last)
        if key not in self.fluids:
            budget = self.jobs[last].budget
            self.fluids[key] = min(
                (self._priced(_tally(_EMPTY, m, budget), budget)[1] for m in self.jobs[i].allowed(budget)),
                default=math.inf,
            )
        return self.fluids[key]

    def _priced(self, tally: tuple, budget: float) -> tuple[float, float]:
        """(Floor, fluid price) of a tally: each pool's node count is at least its widest
        job, its crowded phases per node, its work over the budget and its state over
        the usable DRAM of a node."""
        train, rollout = tally
        cost = self.cost
        nodes_t = _nodes(train, budget, cost.usable_dram_gb(Pool.TRAIN))
        nodes_r = _nodes(rollout, budget, cost.usable_dram_gb(Pool.ROLLOUT))
        price_t, price_r = cost.price(Pool.TRAIN), cost.price(Pool.ROLLOUT)
        return nodes_t * price_t + nodes_r * price_r, (train[0] * price_t + rollout[0] * price_r) / budget


@dataclass
class _Pricing:
    """One depth-first pass over every set of at most ``max_group`` jobs under fixed job
    values ``pi``. It collects the sets whose reduced cost is below ``threshold`` (priced
    exactly, or at their floor once the exact searches run out: a cheaper column than the
    truth only lowers what it bounds) and notes in ``rho`` every negative reduced cost
    per job it meets or cannot rule out. ``enough`` stops it early (then it proves
    nothing); ``complete`` says no set below ``threshold`` was left unexamined."""

    jobs: Sequence[_Job]
    floor: _Floor
    pi: np.ndarray
    exact: _Exact
    config: BoundConfig
    threshold: float = -_RC_EPS
    enough: int | None = None
    rho: float = 0.0
    found: dict[tuple[int, ...], tuple[float, bool]] = field(default_factory=dict)
    values: list[float] = field(default_factory=list)
    nodes_left: int = 0
    cut: int = 0
    stopped: bool = False
    complete: bool = True

    def run(self) -> _Pricing:
        self.nodes_left = self.config.nodes_per_pass
        self.values = [float(v) for v in self.pi]
        for i in range(len(self.jobs)):
            if not math.isinf(self.floor.of((i,))[0]):
                self._visit((i,), self.floor.after(i))
        return self

    def _note(self, reduced: float, size: int) -> None:
        self.rho = min(self.rho, reduced / size)

    def _visit(self, members: tuple[int, ...], extensions: list[int]) -> None:
        """Price ``members`` and search the sets grown from it by ``extensions`` (the
        later jobs compatible with every member)."""
        if self.stopped:
            return
        low, fluid = self.floor.of(members)
        self.nodes_left -= 1
        value = sum(self.values[i] for i in members)
        if low - value < self.threshold:
            self._price(members, low, value)
        if len(members) >= self.config.max_group or not extensions:
            return
        subtree = self._subtree_floor(members, extensions, low, fluid, value)
        if subtree >= max(0.0, self.threshold):
            return
        if self.nodes_left <= 0:
            self.cut += 1
            self._note(subtree, len(members) + 1)
            self.complete = self.complete and subtree >= self.threshold
            return
        for k, j in enumerate(extensions):
            compatible = self.floor.compatible[j]
            self._visit((*members, j), [e for e in extensions[k + 1 :] if e in compatible])

    def _price(self, members: tuple[int, ...], low: float, value: float) -> None:
        config = self.exact.get([self.jobs[i].spec for i in members])
        if config is None:
            return
        known = isinstance(config, Config)
        price = config.cost_per_hour if known else low
        reduced = price - value
        if reduced < 0:
            self._note(reduced, len(members))
        if reduced < self.threshold:
            self.found[members] = (price, known)
            self.stopped = self.enough is not None and len(self.found) >= self.enough

    def _subtree_floor(
        self, members: tuple[int, ...], extensions: Sequence[int], low: float, fluid: float, value: float
    ) -> float:
        """A floor on the reduced cost of every proper superset ``S + A`` grown from
        ``extensions``: ``L(S + A) >= max(L(S), F(S) + F(A))``, and for every ``t`` in
        [0, 1] ``max(0, F(A) - u) >= t (F(A) - u)`` with ``u = L(S) - F(S)``, so the value
        ``A`` can bring is at most ``t u`` plus its ``room`` best ``pi_j - t f_j``."""
        room = self.config.max_group - len(members)
        last = members[-1]
        pairs = [(self.values[j], self.floor.fluid_of(j, last)) for j in extensions]
        slack = low - fluid
        gain = min(
            t * slack + sum(sorted((max(0.0, v - t * f) for v, f in pairs), reverse=True)[:room]) for t in _WEIGHTS
        )
        return low - value - gain


@dataclass
class _FloorPricing:
    """Pricing by MILP over the floor (module text, 5): for every job ``j`` as the
    tightest member (the last by budget of the set, so each set has one tightest), a
    proven lower bound on ``L(S) - pi(S)`` over the sets not cut off, and the set that
    attains it. A job whose cheap floor (fluid prices and its own floor, as in
    :meth:`_Pricing._subtree_floor`) shows no negative reduced cost is not solved."""

    jobs: Sequence[_Job]
    floor: _Floor
    cost: CostModel
    config: BoundConfig
    cut: dict[int, list[tuple[int, ...]]] = field(default_factory=dict)
    """Sets to price above their floor, by tightest member: priced exactly, or infeasible."""

    def exclude(self, members: tuple[int, ...]) -> None:
        self.cut.setdefault(members[-1], []).append(members)

    def run(self, pi: np.ndarray) -> tuple[float, dict[tuple[int, ...], float]]:
        """(A lower bound on every set's floor reduced cost, at most 0; the sets of
        negative floor reduced cost found, with their floors.)"""
        values = [float(v) for v in pi]
        least, found = 0.0, {}
        for j in range(len(self.jobs)):
            candidates = [i for i in range(j) if j in self.floor.compatible[i]] + [j]
            quick = self._quick(j, candidates, values)
            if quick >= -_RC_EPS:
                least = min(least, quick)
                continue
            bound, members = self._solve(j, candidates, values)
            least = min(least, bound)
            if members is not None and members not in self.cut.get(j, ()):
                low = self.floor.of(members)[0]
                if low - sum(values[i] for i in members) < -_RC_EPS:
                    found[members] = low
        return least, found

    def _quick(self, j: int, candidates: Sequence[int], values: Sequence[float]) -> float:
        """A floor on the reduced cost of every set whose tightest member is ``j``: its
        floor is at least ``j``'s own and at least the fluid price of its jobs, hence at
        least any mix of the two."""
        own = self.floor.of((j,))[0]
        if math.isinf(own):
            return 0.0
        room = self.config.max_group - 1
        others = [(values[i], self.floor.fluid_of(i, j)) for i in candidates if i != j]
        fluid_j = self.floor.fluid_of(j, j)
        return max(
            (1 - t) * own + t * fluid_j - values[j] - sum(sorted((max(0.0, v - t * f) for v, f in others))[-room:])
            if room
            else (1 - t) * own + t * fluid_j - values[j]
            for t in _WEIGHTS
        )

    def _solve(
        self, j: int, candidates: Sequence[int], values: Sequence[float]
    ) -> tuple[float, tuple[int, ...] | None]:
        """The pricing MILP of tightest member ``j``: (its proven lower bound, the set of
        its best solution, or None)."""
        budget = self.jobs[j].budget
        seats = [(i, mode) for i in candidates for mode in self.jobs[i].allowed(budget)]
        if not any(i == j for i, _ in seats):
            return 0.0, None
        rows = _FloorRows(len(seats) + 2)
        trainers, rollouts = len(seats), len(seats) + 1
        for i in candidates:
            rows.add([(k, 1.0) for k, (m, _) in enumerate(seats) if m == i], 1.0 if i == j else 0.0, 1.0)
        rows.add([(k, 1.0) for k in range(len(seats))], 1.0, self.config.max_group)
        pools = (
            (
                trainers,
                self.cost.usable_dram_gb(Pool.TRAIN),
                lambda m: (m.train_width, m.train_load, m.train_gb, m.train_load),
            ),
            (
                rollouts,
                self.cost.usable_dram_gb(Pool.ROLLOUT),
                lambda m: (m.rollout_width, m.rollout_load, m.rollout_gb, m.rollout_least),
            ),
        )
        for nodes, usable, demand in pools:
            used = [(k, *demand(mode)) for k, (_, mode) in enumerate(seats) if demand(mode)[0]]
            rows.at_most([(k, w * load) for k, w, load, _, _ in used], nodes, budget * (1 + _TOL))
            rows.at_most([(k, w * gb) for k, w, _, gb, _ in used], nodes, usable * (1 + _TOL))
            for k, w, _, _, _ in used:
                if w > 1:
                    rows.at_most([(k, float(w))], nodes, 1.0)
            for crowd in _CROWDS:
                rows.at_most(
                    [(k, float(w)) for k, w, _, _, least in used if least > budget / (crowd + 1)], nodes, crowd
                )
        for members in self.cut.get(j, ()):
            inside = set(members)
            rows.add([(k, 1.0 if i in inside else -1.0) for k, (i, _) in enumerate(seats)], -np.inf, len(members) - 1)
        objective = np.zeros(len(seats) + 2)
        objective[: len(seats)] = [-values[i] for i, _ in seats]
        objective[trainers], objective[rollouts] = self.cost.price(Pool.TRAIN), self.cost.price(Pool.ROLLOUT)
        most_nodes = 2 * MAX_GROUP_JOBS * max(max(m.train_width, m.rollout_width) for _, m in seats)
        solution = milp(
            objective,
            constraints=rows.constraint(),
            integrality=np.ones(len(seats) + 2),
            bounds=Bounds(np.zeros(len(seats) + 2), np.concatenate([np.ones(len(seats)), [most_nodes, most_nodes]])),
            options={"node_limit": self.config.floor_milp_nodes},
        )
        if solution.status == 2:  # infeasible: every set of this tightest member is cut off
            return 0.0, None
        bound = getattr(solution, "mip_dual_bound", None)
        proven = float(bound) if bound is not None and np.isfinite(bound) else -math.inf
        if solution.x is None:
            return min(0.0, proven), None
        members = tuple(sorted({seats[k][0] for k in np.flatnonzero(solution.x[: len(seats)] > 0.5)}))
        return min(0.0, proven), members


@dataclass
class _FloorRows:
    """The rows of a pricing MILP, built sparse and handed over dense."""

    width: int
    coefficients: list[list[tuple[int, float]]] = field(default_factory=list)
    lower: list[float] = field(default_factory=list)
    upper: list[float] = field(default_factory=list)

    def add(self, terms: Sequence[tuple[int, float]], low: float, high: float) -> None:
        self.coefficients.append(list(terms))
        self.lower.append(low)
        self.upper.append(high)

    def at_most(self, terms: Sequence[tuple[int, float]], nodes: int, per_node: float) -> None:
        """sum(terms) <= per_node * nodes (nothing if there are no terms)."""
        if terms:
            self.add([*terms, (nodes, -per_node)], -np.inf, 0.0)

    def constraint(self) -> LinearConstraint:
        matrix = np.zeros((len(self.coefficients), self.width))
        for row, terms in enumerate(self.coefficients):
            for k, value in terms:
                matrix[row, k] += value
        return LinearConstraint(matrix, self.lower, self.upper)


class _Unknown:
    """Marker: the exact configuration was not searched (the budget ran out)."""


_UNKNOWN = _Unknown()


@dataclass
class _Exact:
    """Exact cheapest configurations through a cache, at most ``left`` new searches of at
    most ``steps_per_search`` enumeration steps each, ``steps`` in all; a search that runs
    out is unknown (not remembered)."""

    cache: ConfigCache
    cost: CostModel
    planning: Planning
    colocate: bool
    left: int
    steps_per_search: int
    steps: int

    def get(self, specs: Sequence[JobSpec], always: bool = False) -> Config | None | _Unknown:
        """The cached or searched configuration; ``always`` searches beyond the count of
        searches and the steps left (one search's steps at most): the master's seeds (every
        job alone, the warm sets) must be known however much earlier parts spent."""
        key = frozenset(specs)
        if key in self.cache:
            return self.cache[key]
        if not always and (self.left <= 0 or self.steps <= 0):
            return _UNKNOWN
        self.left -= 1
        ordered = turn_order(specs)
        budget = self.steps_per_search if always else min(self.steps, self.steps_per_search)
        checks = Checks(steps=budget)
        found = cheapest_config(ordered, self.cost, self.planning, self.colocate, checks)
        self.steps -= budget - (checks.steps or 0)
        if checks.ran_out:
            return _UNKNOWN
        self.cache[key] = found
        return found


def lower_bound(
    specs: Sequence[JobSpec],
    cost: CostModel,
    planning: Planning,
    config: BoundConfig | None = None,
    cache: ConfigCache | None = None,
    warm: Iterable[frozenset[JobSpec]] = (),
) -> Bound:
    """A proven lower bound on the cheapest placement of ``specs`` (see the module text).

    Jobs that can never share a group (no chain fits the other's budget, directly or
    through others) form independent problems: each is bounded on its own, and the bounds
    add up. ``cache`` keeps exact configurations between calls (they depend on the specs
    only); ``warm`` names job sets to start the master with (searched exactly if not
    cached; the feasible ones count), e.g. the groups of a placement at hand.
    Raises ValueError if a job has no feasible configuration even alone.
    """
    config = config or BoundConfig()
    cache = cache if cache is not None else {}
    jobs = sorted((_Job.of(s, planning, config.colocate) for s in specs), key=lambda j: (-j.budget, j.spec.name))
    exact = _Exact(cache, cost, planning, config.colocate, config.evaluations, config.steps_per_search, config.steps)
    warm = tuple(warm)
    parts = [_bound_part([jobs[i] for i in part], cost, config, exact, warm) for part in _Floor(jobs, cost).parts()]
    return Bound(
        value=sum(p.value for p in parts),
        lp=sum(p.lp for p in parts),
        upper=sum(p.upper for p in parts),
        dual_sum=sum(p.dual_sum for p in parts),
        rho=min((p.rho for p in parts), default=0.0),
        jobs=len(jobs),
        rounds=max((p.rounds for p in parts), default=0),
        converged=all(p.converged for p in parts),
        enumerated=all(p.enumerated for p in parts),
        columns=tuple(c for p in parts for c in p.columns),
        floor_priced=any(p.floor_priced for p in parts),
    )


def _bound_part(
    jobs: Sequence[_Job], cost: CostModel, config: BoundConfig, exact: _Exact, warm: Iterable[frozenset[JobSpec]]
) -> Bound:
    """The bound of jobs that may share groups: the column generation's (never below the
    fluid price), raised by the exact search where it completes."""
    floor = _Floor(jobs, cost)
    master = _Master(jobs, exact, config)
    master.seed(warm)
    found = master.generate(floor)
    dual_sum = float(found.pi.sum())
    unit = price_unit(cost)
    fluid = sum(floor.fluid_of(i, i) for i in range(len(jobs)))
    lp = _round_up(max(fluid, found.lagrangian), unit)
    upper = master.incumbent()
    value, enumerated = lp, False
    if upper > lp + _TOL * upper and not found.floor_priced and found.rho > -math.inf:
        # Every column of a placement cheaper than ``upper`` has a reduced cost below
        # ``upper - (unit) - dual_sum - n * min(0, rho)``: collect them all, solve exactly.
        slack = upper - (unit or 0.0) - dual_sum - len(jobs) * min(0.0, found.rho) + _RC_EPS * max(1.0, upper)
        pool = _Pricing(jobs, floor, found.pi, exact, config, threshold=slack).run()
        if pool.complete:
            enumerated = True
            value = max(lp, min(upper, _round_up(_cover_floor(len(jobs), pool.found, config.milp_nodes), unit)))
    return Bound(
        value=value,
        lp=lp,
        upper=upper,
        dual_sum=dual_sum,
        rho=found.rho,
        jobs=len(jobs),
        rounds=found.rounds,
        converged=found.converged,
        enumerated=enumerated,
        columns=master.exact_columns(),
        floor_priced=found.floor_priced,
    )


@dataclass(frozen=True)
class _Generated:
    """What column generation proved: the job values of its last master, a lower bound on
    the LP (``lagrangian``), the least reduced cost per job (depth-first pricing) or per
    set (MILP pricing, ``floor_priced``) behind it, and whether pricing found nothing."""

    pi: np.ndarray
    lagrangian: float
    rho: float
    rounds: int
    converged: bool
    floor_priced: bool = False


@dataclass
class _Master:
    """The restricted master: columns by member indices, with price and exactness."""

    jobs: Sequence[_Job]
    exact: _Exact
    config: BoundConfig
    columns: dict[tuple[int, ...], tuple[float, bool]] = field(default_factory=dict)

    def seed(self, warm: Iterable[frozenset[JobSpec]]) -> None:
        """Every job alone, and the feasible ``warm`` sets of these jobs."""
        index = {job.spec: k for k, job in enumerate(self.jobs)}
        for k, job in enumerate(self.jobs):
            alone = self.exact.get([job.spec], always=True)
            if not isinstance(alone, Config):
                raise ValueError(f"job {job.spec.name} has no configuration within its SLO, even alone")
            self.columns[(k,)] = (alone.cost_per_hour, True)
        for names in warm:
            if len(names) <= self.config.max_group and all(s in index for s in names):
                found = self.exact.get(list(names), always=True)
                if isinstance(found, Config):
                    self.columns[tuple(sorted(index[s] for s in names))] = (found.cost_per_hour, True)

    def generate(self, floor: _Floor) -> _Generated:
        """Column generation. Rounds first grow the columns of least reduced cost by one
        job (cheap); the full depth-first pass runs when that finds nothing, and its finds
        enter the master too. Beyond ``depth_first_jobs`` jobs, or where a pass cannot
        finish, pricing goes on by MILP over the floor (:meth:`generate_by_floor`)."""
        many = len(self.jobs) > self.config.depth_first_jobs
        for round_ in range(1, self.config.rounds + 1):
            pi = self._duals()
            grown = self._grow(floor, pi)
            if grown:
                self.columns.update(grown)
                continue
            if many:
                return self.generate_by_floor(floor, round_)
            proof = _Pricing(self.jobs, floor, pi, self.exact, self.config).run()
            if not proof.complete:
                return self.generate_by_floor(floor, round_)
            if not proof.found or round_ == self.config.rounds:
                return self._by_rho(pi, proof.rho, round_, not proof.found)
            self.columns.update(proof.found)
        if many:
            return self.generate_by_floor(floor, self.config.rounds)
        pi = self._duals()
        proof = _Pricing(self.jobs, floor, pi, self.exact, self.config).run()
        return self._by_rho(pi, proof.rho, self.config.rounds, False)

    def _by_rho(self, pi: np.ndarray, rho: float, rounds: int, converged: bool) -> _Generated:
        return _Generated(pi, float(pi.sum()) + len(self.jobs) * min(0.0, rho), rho, rounds, converged)

    def generate_by_floor(self, floor: _Floor, rounds: int) -> _Generated:
        """Column generation priced by MILP over the floor (module text, 5): the best
        bound over its rounds, each valid on its own."""
        pricing = _FloorPricing(self.jobs, floor, self.exact.cost, self.config)
        for members, (price, known) in self.columns.items():
            if known and price > floor.of(members)[0] + _RC_EPS:
                pricing.exclude(members)
        best, least, pi = -math.inf, -math.inf, np.zeros(len(self.jobs))
        for round_ in range(1, self.config.floor_rounds + 1):
            pi, value = self._duals_and_value()
            least, found = pricing.run(pi)
            best = max(best, float(pi.sum()) + value / self.exact.cost.price(Pool.TRAIN) * min(0.0, least))
            found = {members: low for members, low in found.items() if members not in self.columns}
            if not found:
                return _Generated(pi, best, least, rounds + round_, least >= -_RC_EPS, True)
            for members, low in found.items():
                config = self.exact.get([self.jobs[i].spec for i in members])
                if config is None:
                    pricing.exclude(members)
                elif isinstance(config, Config):
                    self.columns[members] = (config.cost_per_hour, True)
                    if config.cost_per_hour > low + _RC_EPS:
                        pricing.exclude(members)
                else:
                    self.columns[members] = (low, False)
        return _Generated(pi, best, least, rounds + self.config.floor_rounds, False, True)

    def _grow(self, floor: _Floor, pi: np.ndarray) -> dict[tuple[int, ...], tuple[float, bool]]:
        """Sets of negative reduced cost among every job alone and the ``columns_per_round``
        columns of least reduced cost, each grown by one compatible job."""
        values = [float(v) for v in pi]

        def reduced(members: tuple[int, ...]) -> float:
            return self.columns[members][0] - sum(values[i] for i in members)

        small = [m for m in self.columns if len(m) < self.config.max_group]
        seeds = sorted(small, key=lambda m: (reduced(m), m))[: self.config.columns_per_round]
        seeds += [(i,) for i in range(len(self.jobs))]
        found: dict[tuple[int, ...], tuple[float, bool]] = {}
        for seed in seeds:
            for j in range(len(self.jobs)):
                grown = tuple(sorted((*seed, j)))
                if j in seed or grown in self.columns or grown in found or not floor.fit(grown):
                    continue
                value = sum(values[i] for i in grown)
                if floor.of(grown)[0] - value >= -_RC_EPS:
                    continue
                config = self.exact.get([self.jobs[i].spec for i in grown])
                if isinstance(config, Config) and config.cost_per_hour - value < -_RC_EPS:
                    found[grown] = (config.cost_per_hour, True)
        return found

    def incumbent(self) -> float:
        """Price of the cheapest cover by exactly priced columns (a placement in the model)."""
        exact = {members: price for members, (price, known) in self.columns.items() if known}
        keys = list(exact)
        solution = _cover(len(self.jobs), keys, [exact[k] for k in keys], self.config.milp_nodes)
        if solution.x is None:
            return sum(exact[(k,)] for k in range(len(self.jobs)))
        return float(sum(exact[keys[c]] for c in np.flatnonzero(solution.x > 0.5)))

    def exact_columns(self) -> tuple[frozenset[JobSpec], ...]:
        return tuple(
            frozenset(self.jobs[i].spec for i in members) for members, (_, known) in self.columns.items() if known
        )

    def _duals(self) -> np.ndarray:
        """Job values: the duals of the cover rows of the restricted master LP."""
        return self._duals_and_value()[0]

    def _duals_and_value(self) -> tuple[np.ndarray, float]:
        """The job values and the restricted master LP's value."""
        keys = list(self.columns)
        cover = _matrix(len(self.jobs), keys)
        prices = [self.columns[k][0] for k in keys]
        solution = linprog(prices, A_eq=cover, b_eq=np.ones(len(self.jobs)), bounds=(0, None), method="highs")
        if solution.status != 0:
            raise RuntimeError(f"bound master LP failed: {solution.message}")
        return np.asarray(solution.eqlin.marginals, dtype=float), float(solution.fun)


def _matrix(rows: int, keys: Sequence[tuple[int, ...]]) -> np.ndarray:
    cover = np.zeros((rows, len(keys)))
    for c, members in enumerate(keys):
        cover[list(members), c] = 1.0
    return cover


def _cover(rows: int, keys: Sequence[tuple[int, ...]], prices: Sequence[float], node_limit: int):
    return milp(
        np.asarray(prices, dtype=float),
        constraints=LinearConstraint(_matrix(rows, keys), lb=np.ones(rows), ub=np.ones(rows)),
        integrality=np.ones(len(keys)),
        bounds=Bounds(0, 1),
        options={"node_limit": node_limit},
    )


def _cover_floor(rows: int, columns: dict[tuple[int, ...], tuple[float, bool]], node_limit: int) -> float:
    """A lower bound on the cheapest exact cover by ``columns`` (the MILP's dual bound;
    inf if there is none)."""
    keys = list(columns)
    if not keys:
        return math.inf
    solution = _cover(rows, keys, [columns[k][0] for k in keys], node_limit)
    if solution.status == 2:  # infeasible
        return math.inf
    if solution.status == 0:
        return float(solution.fun)
    bound = getattr(solution, "mip_dual_bound", None)
    return -math.inf if bound is None or not np.isfinite(bound) else float(bound)


def price_unit(cost: CostModel) -> float | None:
    """The largest amount every node price is a whole multiple of, when the two prices
    are in a small whole ratio (the published model: 3 rollout nodes per training node);
    every placement's cost is then a whole multiple of it. None otherwise."""
    ratio = Fraction(cost.price(Pool.TRAIN) / cost.price(Pool.ROLLOUT)).limit_denominator(_MAX_RATIO_DENOMINATOR)
    if abs(ratio.numerator / ratio.denominator * cost.price(Pool.ROLLOUT) - cost.price(Pool.TRAIN)) > _TOL * cost.price(
        Pool.TRAIN
    ):
        return None
    return cost.price(Pool.ROLLOUT) / ratio.denominator


def _round_up(value: float, unit: float | None) -> float:
    """``value`` raised to the next whole multiple of the price unit (no placement costs
    anything in between), less a rounding tolerance."""
    if unit is None or not math.isfinite(value):
        return value
    return math.ceil(value / unit - 1e-6) * unit
