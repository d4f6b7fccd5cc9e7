"""Seeded faults for the control engine (``simulate --engine control --faults``).

The live system survives a killed driver, a session whose heartbeats stopped arriving, a
failed node and a restarted control plane; the control engine replays the same state
machine, so it can inject the same faults at moments a seed fixes and check, at every
step, what the live system promises: no node runs two jobs' phases at once, no accepted
job and no completed iteration is lost, every placed job sits in exactly one group.

What each fault does, as the live system does it:

- *driver kill*: the job's driver dies in the middle of whatever it was doing; the
  control plane notices when its lease runs out (``lease_s``), revokes its grant, and
  restarts it (a counted restart, with the state machine's back-off) after a cold start.
- *lease loss*: the driver's heartbeats stop reaching the control plane for a lease
  (a partition): the session is lost at that moment and restarted as after a kill.
- *node failure*: one held node fails; every job seated on it loses its session at once
  (a platform failure, not counted against the job) and resumes on a standby node, which
  takes over the node's identity after ``failover_s`` (a worker on a standby node in this
  project's failover bench: 5.1 s), then a cold start.
- *control-plane restart*: the state machine is dropped and rebuilt from its journal rows
  in a real SQLite store, as the service rebuilds it on start; plans in flight are dropped,
  drivers re-ask for the phases they were waiting for.

A job restarted from its last checkpoint (every iteration, the shipped jobs' default)
redoes the phase it was in and, if it was training, the rollout before it.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from rollmux.core.spec import HOUR
from rollmux.inputs.trace import Trace

DAY = 86_400.0
DRIVER_KILL, LEASE_LOSS, NODE_FAILURE, PLANE_RESTART = "driver-kill", "lease-loss", "node-failure", "plane-restart"


@dataclass(frozen=True)
class Faults:
    """How often each fault strikes, and what recovering from it takes.

    Rates are per job-day of a job's life (driver kills, lease losses) and per day of the
    trace (node failures, each of one node held then); ``plane_restarts`` are spread
    over the trace at seeded moments. ``standby_per_pool`` idle nodes are paid all along:
    what a failed node is replaced by."""

    driver_kills_per_job_day: float = 0.05
    lease_losses_per_job_day: float = 0.05
    node_failures_per_day: float = 1.0
    plane_restarts: int = 2
    seed: int = 0
    lease_s: float = 10.0
    failover_s: float = 5.1
    standby_per_pool: int = 1

    def __post_init__(self) -> None:
        rates = (self.driver_kills_per_job_day, self.lease_losses_per_job_day, self.node_failures_per_day)
        if min(*rates, self.lease_s, self.failover_s) < 0 or self.plane_restarts < 0 or self.standby_per_pool < 0:
            raise ValueError("fault rates, counts and recovery times must be >= 0")


@dataclass(frozen=True)
class Fault:
    """One injected fault: ``job`` for a driver kill or lease loss; ``pick`` (in [0, 1))
    chooses which held node fails, among those held at that moment."""

    at: float
    kind: str
    job: str = ""
    pick: float = 0.0


def schedule(faults: Faults, trace: Trace) -> list[Fault]:
    """Every fault of the run, in time order: Poisson arrivals per job over its life (kills,
    lease losses) and over the trace (node failures), restarts at uniform moments."""
    rng = random.Random(f"faults:{faults.seed}")
    out: list[Fault] = []
    for job in trace.jobs:
        for kind, rate in (
            (DRIVER_KILL, faults.driver_kills_per_job_day),
            (LEASE_LOSS, faults.lease_losses_per_job_day),
        ):
            out += [Fault(t, kind, job.spec.name) for t in _poisson(rng, rate / DAY, job.arrival, job.departure)]
    out += [
        Fault(t, NODE_FAILURE, pick=rng.random())
        for t in _poisson(rng, faults.node_failures_per_day / DAY, 0.0, trace.end)
    ]
    out += [Fault(rng.uniform(0.0, trace.end), PLANE_RESTART) for _ in range(faults.plane_restarts)]
    return sorted(out, key=lambda f: (f.at, f.kind, f.job))


def _poisson(rng: random.Random, rate: float, start: float, end: float) -> list[float]:
    times: list[float] = []
    if rate <= 0:
        return times
    t = start + rng.expovariate(rate)
    while t < end:
        times.append(t)
        t += rng.expovariate(rate)
    return times


@dataclass
class FaultAccount:
    """What the faults did to a run."""

    injected: dict[str, int] = field(
        default_factory=lambda: dict.fromkeys((DRIVER_KILL, LEASE_LOSS, NODE_FAILURE, PLANE_RESTART), 0)
    )
    """Faults that struck something (a kill of a job not running then strikes nothing)."""
    missed: int = 0
    interruptions: int = 0
    """Job sessions lost to a fault (a failed node carrying three jobs interrupts three)."""
    redo_s: float = 0.0
    """Solo-equivalent work done again: phases in progress and rollouts of unfinished iterations."""
    down_s: float = 0.0
    """Job-seconds from a fault to the job's new session."""
    standby_usd: float = 0.0
    failed_jobs: list[str] = field(default_factory=list)
    """Jobs that ran out of restarts (their own faults are counted; node failures are not)."""
    checked_steps: int = 0
    """Steps at which every invariant was checked."""

    def to_json(self) -> dict:
        return {
            "injected": dict(self.injected),
            "missed": self.missed,
            "interruptions": self.interruptions,
            "redo_job_hours": self.redo_s / HOUR,
            "down_job_hours": self.down_s / HOUR,
            "standby_usd": self.standby_usd,
            "failed_jobs": list(self.failed_jobs),
            "checked_steps": self.checked_steps,
        }
