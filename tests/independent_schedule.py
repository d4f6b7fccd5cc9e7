"""An event simulation of a group's round-robin, written apart from the core's, to check
``steady_state``: every node serves, each meta-iteration, its rollouts in the rollout order
and then its trainings in the training order; a phase starts when its job's previous phase
and every node's previous visit have ended. An elastic rollout (a moved tail) instead
begins on each node when that node's previous visit has ended; its head's node-seconds
are done by whichever nodes it has (the end found by bisection); its tail then runs on the
``tail_width`` nodes it got first and frees the others. The period is read once the phases'
end times repeat up to a common shift (any cyclicity up to 64), however long the transient
is; with an elastic rollout, whose seats may keep different paces, each seat's mean pace
over the last 2,000 of 4,000 rounds if its end times never repeat up to one shift."""

from __future__ import annotations

import random
from collections.abc import Sequence

from rollmux.core.roundrobin import Order, Seat

MAX_CYCLICITY = 64
ELASTIC_ROUNDS = 4_000
ELASTIC_SPAN = 2_000


def visits(seats: Sequence[Seat], order: Order) -> dict[int, list[tuple[int, str]]]:
    """Each node's cyclic sequence of (seat, phase) within one meta-iteration."""
    sequence: dict[int, list[tuple[int, str]]] = {}
    for i in order.rollout:
        for node in seats[i].rollout_nodes:
            sequence.setdefault(node, []).append((i, "rollout"))
    for i in order.train:
        for node in seats[i].train_nodes:
            sequence.setdefault(node, []).append((i, "train"))
    return sequence


def simulated_period(seats: Sequence[Seat], order: Order, max_rounds: int = 50_000, rel_tol: float = 1e-12) -> float:
    """The period of the schedule, from phase end times of successive meta-iterations."""
    periods = simulated_periods(seats, order, max_rounds, rel_tol)
    assert len(set(periods)) == 1, periods
    return periods[0]


def simulated_periods(
    seats: Sequence[Seat], order: Order, max_rounds: int = 50_000, rel_tol: float = 1e-12
) -> tuple[float, ...]:
    """Each seat's period, from phase end times of successive meta-iterations."""
    elastic = any(seat.tail_width for seat in seats)
    sequence = visits(seats, order)
    last_on: dict[int, float] = dict.fromkeys(sequence, 0.0)
    job_done = [0.0] * len(seats)
    seconds = {(i, "rollout"): s.rollout_s for i, s in enumerate(seats)} | {
        (i, "train"): s.train_s for i, s in enumerate(seats)
    }
    nodes_of = {(i, "rollout"): s.rollout_nodes for i, s in enumerate(seats)} | {
        (i, "train"): s.train_nodes for i, s in enumerate(seats)
    }
    phases = [(i, "rollout") for i in order.rollout] + [(i, "train") for i in order.train]
    history: list[list[float]] = []
    for k in range(max_rounds):
        ends: dict[tuple[int, str], float] = {}
        pending = list(phases)
        position = dict.fromkeys(sequence, 0)
        while pending:
            for phase in list(pending):
                nodes = nodes_of[phase]
                if any(sequence[n][position[n]] != phase for n in nodes):
                    continue  # not its turn on one of its nodes yet
                i = phase[0]
                ready = job_done[i] if phase[1] == "rollout" else ends[(i, "rollout")]
                if phase[1] == "rollout" and seats[i].tail_width:
                    ends[phase] = _elastic(seats[i], ready, last_on)
                else:
                    start = max(ready, *(last_on[n] for n in nodes))
                    ends[phase] = start + seconds[phase]
                    for n in nodes:
                        last_on[n] = ends[phase]
                for n in nodes:
                    position[n] += 1
                if phase[1] == "train":
                    job_done[i] = ends[phase]
                pending.remove(phase)
        history.append([ends[p] for p in phases])
        for c in range(1, min(MAX_CYCLICITY, k) + 1):
            now, before = history[k], history[k - c]
            shift = now[0] - before[0]
            tol = rel_tol * max(1.0, max(abs(x) for x in now))
            if all(abs((a - b) - shift) <= tol for a, b in zip(now, before, strict=True)):
                return (shift / c,) * len(seats)
        if elastic and k + 1 == ELASTIC_ROUNDS:  # never one shift: each seat's pace, over a long run
            trains = [phases.index((i, "train")) for i in range(len(seats))]
            return tuple((history[k][t] - history[k - ELASTIC_SPAN][t]) / ELASTIC_SPAN for t in trains)
    raise AssertionError(f"no period within {max_rounds} meta-iterations")


def _elastic(seat: Seat, ready: float, last_on: dict[int, float]) -> float:
    """An elastic rollout's end; ``last_on`` gets each of its nodes' new free time."""
    joins = {n: max(ready, last_on[n]) for n in seat.rollout_nodes}
    head = len(joins) * (1 - seat.tail_share) * seat.rollout_s
    low, high = min(joins.values()), max(joins.values()) + head
    for _ in range(200):  # bisection on the time the nodes have done the head's work together
        middle = (low + high) / 2
        if sum(max(0.0, middle - at) for at in joins.values()) >= head:
            high = middle
        else:
            low = middle
    first = sorted(joins, key=lambda n: (joins[n], n))[: seat.tail_width]
    end = max(high, *(joins[n] for n in first)) + seat.tail_share * seat.rollout_s
    for n, at in joins.items():
        last_on[n] = end if n in first else max(at, high)
    return end


def random_group(rng: random.Random, tails: bool = False) -> list[Seat]:
    """2–6 jobs on 1–3 rollout and 1–3 training nodes (some co-located), real-valued times
    over three orders of magnitude; with ``tails``, most rollouts of two nodes or more are
    elastic, moving a tail of a random share onto one or two of their nodes."""
    rollout_nodes, train_nodes = rng.randint(1, 3), rng.randint(1, 3)
    seats = []
    for _ in range(rng.randint(2, 6)):
        rollout_s, train_s = rng.uniform(0.1, 60.0), rng.uniform(0.1, 60.0)
        if rng.random() < 0.15:
            nodes = (100 + rng.randrange(2),)  # co-located: one node serves both phases
            seats.append(Seat(rollout_s, train_s, nodes, nodes))
            continue
        rollout = tuple(sorted(rng.sample(range(rollout_nodes), rng.randint(1, rollout_nodes))))
        train = tuple(sorted(rng.sample(range(10, 10 + train_nodes), rng.randint(1, train_nodes))))
        if tails and len(rollout) > 1 and rng.random() < 0.8:
            keep = rng.randint(1, len(rollout) - 1)
            seats.append(Seat(rollout_s, train_s, rollout, train, rng.uniform(0.0, 0.9), keep))
            continue
        seats.append(Seat(rollout_s, train_s, rollout, train))
    return seats
