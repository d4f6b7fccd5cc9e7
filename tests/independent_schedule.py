"""An event simulation of a group's round-robin, written apart from the core's, to check
``steady_state``: every node serves, each meta-iteration, its rollouts in the rollout order
and then its trainings in the training order; a phase starts when its job's previous phase
and every node's previous visit have ended. A rollout with a moved tail leaves its nodes
outside ``tail_nodes`` once the first ``1 - tail_share`` of its time is over. The period is
read once the phases' end times repeat up to a common shift (any cyclicity up to 64),
however long the transient is."""

from __future__ import annotations

import random
from collections.abc import Sequence

from rollmux.core.roundrobin import Order, Seat

MAX_CYCLICITY = 64


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
                start = max(ready, *(last_on[n] for n in nodes))
                ends[phase] = start + seconds[phase]
                seat = seats[i]
                for n in nodes:
                    early = phase[1] == "rollout" and seat.tail_nodes and n not in seat.tail_nodes
                    last_on[n] = start + seconds[phase] * (1 - seat.tail_share) if early else ends[phase]
                    position[n] += 1
                if phase[1] == "train":
                    job_done[i] = ends[phase]
                pending.remove(phase)
        history.append([ends[p] for p in phases])
        for c in range(1, min(MAX_CYCLICITY, k) + 1):
            now, before = history[k], history[k - c]
            shift = now[0] - before[0]
            tol = rel_tol * max(1.0, abs(now[-1]))
            if all(abs((a - b) - shift) <= tol for a, b in zip(now, before, strict=True)):
                return shift / c
    raise AssertionError(f"no period within {max_rounds} meta-iterations")


def random_group(rng: random.Random, tails: bool = False) -> list[Seat]:
    """2–6 jobs on 1–3 rollout and 1–3 training nodes (some co-located), real-valued times
    over three orders of magnitude; with ``tails``, most rollouts of two nodes or more move
    a tail of a random share onto their first one or two nodes."""
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
            seats.append(Seat(rollout_s, train_s, rollout, train, rng.uniform(0.0, 0.9), rollout[:keep]))
            continue
        seats.append(Seat(rollout_s, train_s, rollout, train))
    return seats
