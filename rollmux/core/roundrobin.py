"""Intra-group round-robin schedule, computed by an exact event simulation.

Inside a co-execution group every node serves the phases of its jobs in a fixed cyclic
order, so that each job runs exactly one rollout and one training phase per
meta-iteration. The order is set first-come-first-served in the first meta-iteration
(rollouts in arrival order, trainings in the order their rollouts end) and then kept.

The schedule is a max-plus linear system: the state after a meta-iteration (when every
node becomes free, when every job's training ends) is a max-plus product of a matrix and
the state before it. Its period is the matrix's maximum cycle mean (Karp's theorem), exact
whatever the start-up transient. Most groups repeat their state, up to a common shift,
within a few meta-iterations: the event simulation finds the period that way first, and
the cycle mean is computed only for those whose transient is longer.

An *elastic* rollout (long-tail migration, DESIGN.md 5b) is not max-plus linear: it starts
on each of its nodes as that node comes free, shares its head's work out over the nodes it
has (water-filling), and runs its tail on its earliest nodes, freeing the others. A group
with one keeps the event simulation, iterated until its state repeats up to a common shift
(it converges geometrically) within ``_ELASTIC_ROUNDS``; past that, each seat's mean pace
over the last rounds (an elastic job can leave a shared node behind and run at its own pace).
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from rollmux.core.spec import PhaseTime

ROLLOUT = "rollout"
TRAIN = "train"

_REL_TOL = 1e-9
_MAX_CYCLICITY = 8
_QUICK_ROUNDS = 24
"""Meta-iterations the event simulation tries before the period is computed as a cycle mean."""
_ELASTIC_ROUNDS = 600
"""Meta-iterations a group with an elastic rollout is simulated at most."""
_ELASTIC_MEAN_OVER = 300
"""Rounds whose mean growth gives the periods when the growth never repeated (a long cycle)."""
_NONE = float("-inf")


@dataclass(frozen=True)
class Seat:
    """One job's place in a group: its planned phase times and the nodes of each phase.

    A co-located job names the same nodes for both phases. An elastic rollout
    (``tail_width`` > 0) moves its tail: the first ``1 - tail_share`` of its time on all its
    nodes is work shared out over the nodes it has, so it starts on each as that node comes
    free; the last ``tail_share`` runs on ``tail_width`` of them (the earliest it got), the
    others free for the next rollout. Its training still waits for the whole rollout.
    """

    rollout_s: float
    train_s: float
    rollout_nodes: tuple[int, ...]
    train_nodes: tuple[int, ...]
    tail_share: float = 0.0
    tail_width: int = 0

    @property
    def solo_s(self) -> float:
        return self.rollout_s + self.train_s

    @property
    def elastic(self) -> bool:
        return self.tail_width > 0

    def rollout_node_s(self, rollout_s: float | None = None) -> float:
        """Node-seconds its rollout (of ``rollout_s``, default its own) takes in all."""
        seconds = self.rollout_s if rollout_s is None else rollout_s
        if not self.elastic:
            return len(self.rollout_nodes) * seconds
        return seconds * (len(self.rollout_nodes) * (1 - self.tail_share) + self.tail_width * self.tail_share)


@dataclass(frozen=True)
class Visit:
    """A rollout on its nodes: when it ends, and when each node's part began and ended."""

    end: float
    nodes: dict[int, tuple[float, float]]

    @property
    def start(self) -> float:
        return min(begin for begin, _ in self.nodes.values())


def elastic_visit(seat: Seat, rollout_s: float, ready: float, free: Mapping[int, float]) -> Visit:
    """The seat's elastic rollout of ``rollout_s`` seconds, its job ready at ``ready``, each
    node free at ``free[node]``. It starts on each node as that node comes free; its head
    (the first ``1 - tail_share`` of its time on all its nodes, as node-seconds) ends when
    the nodes it has have done that work together; its tail then runs on its earliest
    ``tail_width`` nodes (once the last of those is free) and its other nodes are free. A
    node that comes free only after the head is over is passed at once. (A whole rollout
    starts once all its nodes are free and holds them to its end: :func:`_rounds` does that
    inline, on the hot path of every steady state.)"""
    joins = sorted((max(ready, free[n]), n) for n in seat.rollout_nodes)
    head_end = _filled([at for at, _ in joins], len(joins) * (1 - seat.tail_share) * rollout_s)
    tail_start = max(head_end, joins[seat.tail_width - 1][0])
    end = tail_start + seat.tail_share * rollout_s
    nodes = {n: (at, end) if rank < seat.tail_width else (at, max(at, head_end)) for rank, (at, n) in enumerate(joins)}
    return Visit(end, nodes)


def _filled(joins: Sequence[float], work: float) -> float:
    """When nodes joining at ``joins`` (ascending) have done ``work`` node-seconds together."""
    total = 0.0
    for count, at in enumerate(joins, start=1):
        total += at
        done = (work + total) / count
        if count == len(joins) or done <= joins[count]:
            return done
    raise ValueError("a rollout without nodes")


@dataclass(frozen=True)
class Order:
    """Cyclic service order of seat indices, one sequence per phase kind."""

    rollout: tuple[int, ...]
    train: tuple[int, ...]


@dataclass(frozen=True)
class PhaseRun:
    """One executed phase in a simulated timeline."""

    seat: int
    phase: str
    iteration: int
    start: float
    end: float
    nodes: tuple[int, ...]


@dataclass(frozen=True)
class SteadyState:
    """Periodic regime of a group: per-seat period, the lower bounds and node loads."""

    periods: tuple[float, ...]
    t1: float
    t2: float
    busy_s: dict[int, float]

    @property
    def cycle(self) -> float:
        return max(self.periods, default=0.0)

    def slowdowns(self, seats: Sequence[Seat]) -> tuple[float, ...]:
        return tuple(p / s.solo_s if s.solo_s > 0 else 1.0 for p, s in zip(self.periods, seats, strict=False))

    def busy_fraction(self, node: int) -> float:
        period = self.cycle
        return self.busy_s.get(node, 0.0) / period if period > 0 else 0.0


def node_load(seats: Sequence[Seat]) -> dict[int, float]:
    """Seconds of work each node must serve per meta-iteration."""
    load: dict[int, float] = {}
    for seat in seats:
        # An elastic rollout's nodes share its work evenly on average.
        rollout = seat.rollout_node_s() / len(seat.rollout_nodes) if seat.tail_width else seat.rollout_s
        for node in seat.rollout_nodes:
            load[node] = load.get(node, 0.0) + rollout
        for node in seat.train_nodes:
            load[node] = load.get(node, 0.0) + seat.train_s
    return load


def lower_bounds(seats: Sequence[Seat]) -> tuple[float, float]:
    """(T1, T2): the longest dependency chain and the most loaded node, per meta-iteration.

    An elastic rollout's share of each node is not fixed, so T2 counts its work on no
    single node: it is the most any node serves of the other phases, or the work that the
    rollout nodes of an elastic seat must serve among them (every elastic rollout within
    those nodes, and the other phases on them) over their number."""
    t1 = max((s.solo_s for s in seats), default=0.0)
    if not any(s.tail_width for s in seats):
        return t1, max(node_load(seats).values(), default=0.0)
    fixed = node_load([s for s in seats if not s.elastic])
    for seat in seats:
        if seat.elastic:
            for node in seat.train_nodes:
                fixed[node] = fixed.get(node, 0.0) + seat.train_s
    t2 = max(fixed.values(), default=0.0)
    for seat in seats:
        if seat.elastic:
            span = set(seat.rollout_nodes)
            inside = sum(s.rollout_node_s() for s in seats if s.elastic and span.issuperset(s.rollout_nodes))
            t2 = max(t2, (inside + sum(fixed.get(n, 0.0) for n in span)) / len(span))
    return t1, t2


def fcfs_order(seats: Sequence[Seat]) -> Order:
    """First-come-first-served order of the first meta-iteration, kept as the cycle.

    Rollouts queue in seat (arrival) order; trainings queue in the order rollouts end,
    taken as if no rollout moved its tail: the same order with and without tails, so that
    moving tails only frees nodes earlier and never lengthens a period.
    """
    rollout = tuple(range(len(seats)))
    free: dict[int, float] = {}
    rollout_end: list[float] = [0.0] * len(seats)
    for i in rollout:
        start = max((free.get(n, 0.0) for n in seats[i].rollout_nodes), default=0.0)
        rollout_end[i] = start + seats[i].rollout_s
        for n in seats[i].rollout_nodes:
            free[n] = rollout_end[i]
    train = tuple(sorted(rollout, key=lambda i: (rollout_end[i], i)))
    return Order(rollout=rollout, train=train)


Durations = Callable[[], tuple[Sequence[float], Sequence[float]]]
"""Draws one meta-iteration's (rollout, training) seconds for every seat."""


class _Round(NamedTuple):
    """One meta-iteration: every seat's rollout and training start, the state after it
    (nodes' free times, then seats' training ends) and each elastic rollout's parts. A
    named tuple: one is made per meta-iteration of every steady state."""

    rollout_start: list[float]
    train_start: list[float]
    state: tuple[float, ...]
    elastic: dict[int, Visit]


def _rounds(seats: Sequence[Seat], order: Order, durations: Durations | None = None) -> Iterator[_Round]:
    """Yield each meta-iteration.

    Phase times are the seats' own unless ``durations`` draws them afresh every
    meta-iteration. The state is every node's free time followed by every seat's training
    end: all the next meta-iteration depends on.
    """
    nodes = sorted({n for s in seats for n in (*s.rollout_nodes, *s.train_nodes)})
    free = dict.fromkeys(nodes, 0.0)
    train_end = [0.0] * len(seats)
    planned = ([s.rollout_s for s in seats], [s.train_s for s in seats])
    elastic_seats = frozenset(i for i, s in enumerate(seats) if s.elastic)
    while True:
        rollout_s, train_s = durations() if durations else planned
        rollout_start = [0.0] * len(seats)
        rollout_end = [0.0] * len(seats)
        train_start = [0.0] * len(seats)
        elastic: dict[int, Visit] = {}
        for i in order.rollout:
            seat = seats[i]
            if i in elastic_seats:
                visit = elastic[i] = elastic_visit(seat, rollout_s[i], train_end[i], free)
                free.update({n: end for n, (_, end) in visit.nodes.items()})
                rollout_start[i], rollout_end[i] = visit.start, visit.end
                continue
            start = max(train_end[i], *(free[n] for n in seat.rollout_nodes))
            rollout_start[i], rollout_end[i] = start, start + rollout_s[i]
            for n in seat.rollout_nodes:
                free[n] = rollout_end[i]
        for i in order.train:
            seat = seats[i]
            start = max(rollout_end[i], *(free[n] for n in seat.train_nodes))
            train_start[i] = start
            train_end[i] = start + train_s[i]
            for n in seat.train_nodes:
                free[n] = train_end[i]
        yield _Round(rollout_start, train_start, (*(free[n] for n in nodes), *train_end), elastic)


def realised_periods(
    seats: Sequence[Seat],
    phases: Sequence[tuple[PhaseTime, PhaseTime]],
    rng: random.Random,
    rounds: int = 400,
    warmup: int = 40,
) -> tuple[float, ...]:
    """Mean period of every seat when each phase's duration is drawn from its distribution.

    The cyclic order is the one planned from the seats' (planned) times, as the runtime
    would run it; the mean is taken after ``warmup`` meta-iterations of start-up.
    """
    order = fcfs_order(seats)

    def draw() -> tuple[list[float], list[float]]:
        return [r.sample(rng) for r, _ in phases], [t.sample(rng) for _, t in phases]

    starts = [step.rollout_start for step in itertools.islice(_rounds(seats, order, draw), rounds)]
    span = rounds - 1 - warmup
    return tuple((starts[-1][i] - starts[warmup][i]) / span for i in range(len(seats)))


def _common_shift(now: tuple[float, ...], before: tuple[float, ...]) -> float | None:
    """The shift if ``now`` equals ``before`` plus one constant in every entry, else None."""
    shift = now[0] - before[0]
    tol = _REL_TOL * max(1.0, abs(now[-1]))
    if all(abs((a - b) - shift) <= tol for a, b in zip(now, before, strict=False)):
        return shift
    return None


def subgroup(seats: Sequence[Seat], order: Order, members: Sequence[int]) -> tuple[list[Seat], Order]:
    """The seats ``members`` (a component) on their own, numbered from 0, in their order."""
    position = {seat: k for k, seat in enumerate(members)}
    return [seats[i] for i in members], Order(
        rollout=tuple(position[i] for i in order.rollout if i in position),
        train=tuple(position[i] for i in order.train if i in position),
    )


def components(seats: Sequence[Seat]) -> list[list[int]]:
    """Seats grouped by shared nodes: each component is an irreducible max-plus system."""
    parent = list(range(len(seats)))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    owner: dict[int, int] = {}
    for i, seat in enumerate(seats):
        for n in (*seat.rollout_nodes, *seat.train_nodes):
            if n in owner:
                parent[find(i)] = find(owner[n])
            else:
                owner[n] = i
    groups: dict[int, list[int]] = {}
    for i in range(len(seats)):
        groups.setdefault(find(i), []).append(i)
    return list(groups.values())


def _component_period(seats: Sequence[Seat], order: Order) -> tuple[float, ...]:
    """Each seat's period in a connected set of seats. Without an elastic rollout, exact:
    found when the state repeats up to a common shift within a few meta-iterations (most
    groups), else the maximum cycle mean of the round's matrix. With one, the state
    converges geometrically: found when it repeats within ``_ELASTIC_ROUNDS``, else each
    seat's own pace, the mean growth of its training end over the last
    ``_ELASTIC_MEAN_OVER`` rounds. Seats can keep different paces there (an elastic job may
    leave behind a node it shares, starting without it and passing it when it comes free
    too late), and a state growing at two paces for a few rounds may still be a transient,
    so only the long mean tells them apart."""
    elastic = any(s.elastic for s in seats)
    history: list[tuple[float, ...]] = []
    for k, step in enumerate(itertools.islice(_rounds(seats, order), _ELASTIC_ROUNDS if elastic else _QUICK_ROUNDS)):
        history.append(step.state)
        for c in range(1, min(_MAX_CYCLICITY, k) + 1):
            shift = _common_shift(step.state, history[k - c])
            if shift is not None:
                return (shift / c,) * len(seats)
    if not elastic:
        return (max_cycle_mean(round_matrix(seats, order)),) * len(seats)
    now, before = history[-1][-len(seats) :], history[-1 - _ELASTIC_MEAN_OVER][-len(seats) :]
    return tuple((a - b) / _ELASTIC_MEAN_OVER for a, b in zip(now, before, strict=True))


Form = dict[int, float]
"""A max-plus linear form: ``max(x[v] + w for v, w in form.items())`` over the state ``x``."""


def round_matrix(seats: Sequence[Seat], order: Order) -> list[Form]:
    """One meta-iteration as a max-plus matrix: row ``j`` gives the next state's entry ``j``
    (nodes' free times in node order, then the seats' training ends) as a form over the
    current state. The same steps as :func:`_rounds`, on forms instead of numbers. An
    elastic rollout has none (its head's end is not max-plus in its nodes' free times)."""
    if any(s.elastic for s in seats):
        raise ValueError("a group with an elastic rollout is not max-plus linear")
    nodes = sorted({n for s in seats for n in (*s.rollout_nodes, *s.train_nodes)})
    free: dict[int, Form] = {n: {k: 0.0} for k, n in enumerate(nodes)}
    train_end: list[Form] = [{len(nodes) + i: 0.0} for i in range(len(seats))]
    rollout_end: list[Form] = [{} for _ in seats]
    for i in order.rollout:
        seat = seats[i]
        rollout_end[i] = _plus(_max(train_end[i], *(free[n] for n in seat.rollout_nodes)), seat.rollout_s)
        for n in seat.rollout_nodes:
            free[n] = rollout_end[i]
    for i in order.train:
        seat = seats[i]
        train_end[i] = _plus(_max(rollout_end[i], *(free[n] for n in seat.train_nodes)), seat.train_s)
        for n in seat.train_nodes:
            free[n] = train_end[i]
    return [*(free[n] for n in nodes), *train_end]


def _max(*forms: Form) -> Form:
    merged: Form = {}
    for form in forms:
        for v, w in form.items():
            if v not in merged or w > merged[v]:
                merged[v] = w
    return merged


def _plus(form: Form, seconds: float) -> Form:
    return {v: w + seconds for v, w in form.items()}


def max_cycle_mean(matrix: Sequence[Form]) -> float:
    """The largest mean weight of a cycle of the graph with an edge ``v -> j`` of weight
    ``matrix[j][v]``: the growth per step of ``x(k+1) = matrix (x) x(k)`` in max-plus
    algebra from any finite start. Karp's theorem, on walks from a virtual source joined to
    every vertex: ``max_v min_k (D_n(v) - D_k(v)) / (n - k)``, where ``D_k(v)`` is the
    heaviest walk of ``k`` edges ending at ``v``."""
    n = len(matrix)
    walks: list[list[float]] = [[0.0] * n]
    for _ in range(n):
        last = walks[-1]
        walks.append([max((last[v] + w for v, w in row.items() if last[v] != _NONE), default=_NONE) for row in matrix])
    best = _NONE
    for v in range(n):
        if walks[n][v] == _NONE:
            continue
        best = max(best, min((walks[n][v] - walks[k][v]) / (n - k) for k in range(n) if walks[k][v] != _NONE))
    if best == _NONE:
        raise ValueError("the round's matrix has no cycle: a seat without phases")
    return best


def steady_state(seats: Sequence[Seat], order: Order | None = None) -> SteadyState:
    """Steady-state period of every seat under the cyclic order (FCFS by default)."""
    if not seats:
        return SteadyState(periods=(), t1=0.0, t2=0.0, busy_s={})
    order = order or fcfs_order(seats)
    periods = [0.0] * len(seats)
    for members in components(seats):
        for i, period in zip(members, _component_period(*subgroup(seats, order, members)), strict=True):
            periods[i] = period
    t1, t2 = lower_bounds(seats)
    return SteadyState(periods=tuple(periods), t1=t1, t2=t2, busy_s=node_load(seats))


def timeline(seats: Sequence[Seat], iterations: int, order: Order | None = None) -> list[PhaseRun]:
    """Every phase of the first ``iterations`` meta-iterations, for tests and Gantt charts.
    An elastic rollout is one run per node it worked on (a node passed at once has none)."""
    order = order or fcfs_order(seats)
    runs: list[PhaseRun] = []
    for k, step in zip(range(iterations), _rounds(seats, order), strict=False):
        for i, seat in enumerate(seats):
            if i in step.elastic:
                for node, (begin, end) in sorted(step.elastic[i].nodes.items()):
                    if end > begin:
                        runs.append(PhaseRun(i, ROLLOUT, k, begin, end, (node,)))
            else:
                start = step.rollout_start[i]
                runs.append(PhaseRun(i, ROLLOUT, k, start, start + seat.rollout_s, seat.rollout_nodes))
            start = step.train_start[i]
            runs.append(PhaseRun(i, TRAIN, k, start, start + seat.train_s, seat.train_nodes))
    return runs
