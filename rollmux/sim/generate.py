"""Seeded synthetic traces: job mixes and arrival patterns the production trace lacks.

Every job takes a production job type (its widths and host memory, rollmux.inputs.catalog)
and draws its own phase times, so no two jobs are alike:

- ``production``: the type's profiled times, each scaled by a lognormal factor (CV 0.25);
- ``training-heavy``: training 2-4x the rollout;
- ``rollout-heavy``: rollout 3-6x the training.

Co-located times are the disaggregated ones scaled by the co-located/disaggregated ratios
of a random profiled type (per phase), as measured. Arrivals are ``uniform`` (Poisson) or
``bursty`` (bursts of 5-20 jobs within minutes, every few hours); a job runs for a
lognormal time of median ``median_hours``. SLOs are drawn from U(``slo``).
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass
from pathlib import Path

from rollmux.core.spec import HOUR, JobSpec, PhaseTime
from rollmux.inputs.catalog import host_memory_gb, node_width
from rollmux.inputs.trace import Profile, Trace, TraceJob, load_profile

PROFILE = Path(__file__).resolve().parents[2] / "data" / "traces" / "production-profile.json"
MIXES = ("production", "training-heavy", "rollout-heavy")
ARRIVALS = ("uniform", "bursty")


@dataclass(frozen=True)
class TraceShape:
    """What to generate: how many jobs, which mix, which arrivals, and the seed."""

    jobs: int = 300
    mix: str = "production"
    arrivals: str = "bursty"
    seed: int = 0
    slo: tuple[float, float] = (1.1, 2.0)
    median_hours: float = 12.0
    burst_every_hours: float = 4.0

    def __post_init__(self) -> None:
        if self.mix not in MIXES:
            raise ValueError(f"mix must be one of {', '.join(MIXES)}, got {self.mix!r}")
        if self.arrivals not in ARRIVALS:
            raise ValueError(f"arrivals must be one of {', '.join(ARRIVALS)}, got {self.arrivals!r}")
        if self.jobs < 1:
            raise ValueError(f"jobs must be >= 1, got {self.jobs}")


BENCH_SHAPES = {
    "uniform": TraceShape(mix="production", arrivals="uniform"),
    "rollout-heavy": TraceShape(mix="rollout-heavy", arrivals="uniform"),
    "training-heavy": TraceShape(mix="training-heavy", arrivals="uniform"),
    "bursty": TraceShape(mix="production", arrivals="bursty"),
    "long-lived": TraceShape(mix="production", arrivals="uniform", median_hours=48.0),
}
"""The five mixes the schedule-quality benches measure (300 jobs each by default): the
production mix with Poisson arrivals, rollout- and training-heavy mixes, the production
mix in bursts, and jobs that run four times as long."""


def generate(shape: TraceShape, profile: Profile | None = None) -> Trace:
    """A trace of ``shape.jobs`` jobs, identical for identical shapes."""
    profile = profile or load_profile(PROFILE)
    rng = random.Random(f"{shape.seed}:{shape.mix}:{shape.arrivals}")
    types = sorted(profile.disagg)
    arrivals = _arrivals(shape, rng)
    jobs = []
    for k, arrival in enumerate(arrivals):
        duration = HOUR * shape.median_hours * math.exp(rng.gauss(0.0, 0.8))
        spec = _job(f"job{k}", rng.choice(types), shape, profile, rng)
        jobs.append(TraceJob(spec, arrival, arrival + duration))
    return Trace(tuple(jobs))


def _arrivals(shape: TraceShape, rng: random.Random) -> list[float]:
    if shape.arrivals == "uniform":
        gap = shape.median_hours * HOUR / 20  # about 20 jobs running at once
        times, now = [], 0.0
        for _ in range(shape.jobs):
            times.append(now)
            now += rng.expovariate(1 / gap)
        return times
    times, now = [], 0.0
    while len(times) < shape.jobs:
        burst = now
        for _ in range(min(rng.randint(5, 20), shape.jobs - len(times))):
            burst += rng.uniform(0.0, 300.0)
            times.append(burst)
        now = burst + rng.expovariate(1 / (shape.burst_every_hours * HOUR))
    return times


def _job(name: str, job_type: str, shape: TraceShape, profile: Profile, rng: random.Random) -> JobSpec:
    base = profile.disagg[job_type]
    rollout, train = base.generate, base.train
    if shape.mix == "production":
        rollout, train = rollout * _spread(rng), train * _spread(rng)
    elif shape.mix == "training-heavy":
        rollout = rollout * _spread(rng)
        train = rollout * rng.uniform(2.0, 4.0)
    else:
        train = train * _spread(rng)
        rollout = train * rng.uniform(3.0, 6.0)
    ratio_type = rng.choice(sorted(profile.colo))
    colo = profile.colo[ratio_type]
    ratio = profile.disagg[ratio_type]
    width = node_width(job_type)
    rollout_mem, train_mem = host_memory_gb(job_type)
    return JobSpec(
        name=name,
        kind=job_type,
        rollout=PhaseTime.fixed(round(rollout, 1)),
        train=PhaseTime.fixed(round(train, 1)),
        slo=round(rng.uniform(*shape.slo), 3),
        rollout_width=width,
        train_width=width,
        rollout_mem_gb=rollout_mem,
        train_mem_gb=train_mem,
        colocated=(
            PhaseTime.fixed(round(rollout * colo.generate / ratio.generate, 1)),
            PhaseTime.fixed(round(train * colo.train / ratio.train, 1)),
        ),
    )


def _spread(rng: random.Random, cv: float = 0.25) -> float:
    sigma = math.sqrt(math.log1p(cv * cv))
    return math.exp(rng.gauss(-sigma * sigma / 2, sigma))


def write_jsonl(trace: Trace, path: Path) -> None:
    """The trace in RollMux's JSONL job format (``rollmux simulate`` reads it back)."""
    lines = []
    for j in trace.jobs:
        s = j.spec
        record = {
            "id": s.name,
            "arrival_s": round(j.arrival, 1),
            "departure_s": round(j.departure, 1),
            "rollout_s": s.rollout.mean,
            "train_s": s.train.mean,
            "rollout_width": s.rollout_width,
            "train_width": s.train_width,
            "rollout_mem_gb": s.rollout_mem_gb,
            "train_mem_gb": s.train_mem_gb,
            "slo": s.slo,
        }
        if s.colocated is not None:
            record["colo_rollout_s"], record["colo_train_s"] = s.colocated[0].mean, s.colocated[1].mean
        lines.append(json.dumps(record))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
