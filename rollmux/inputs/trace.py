"""Trace readers: the production trace format and RollMux's own JSONL/CSV job format.

Both produce a :class:`Trace`, a list of jobs with arrival and departure seconds since
the trace's first event. Every problem is reported as an :class:`InputError` naming file,
line and field; nothing is half-read.

Production format (one event per line)::

    job<N>, YYYY-MM-DD HH:MM:SS, <+1 | 1 | -1>, <model>_<max length>

RollMux format: JSONL (one object per line) or CSV (header row), one job per record with
the fields of :class:`JobRecord`.
"""

from __future__ import annotations

import csv
import json
import math
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from rollmux.core.spec import JobSpec, PhaseTime
from rollmux.inputs.catalog import host_memory_gb, node_width
from rollmux.inputs.errors import InputError, from_validation, read_json
from rollmux.inputs.jobfile import MAX_PHASE_S, NAME_PATTERN, JobFields

MAX_TIME_S = 1e9
"""Latest arrival or departure and longest duration accepted: about 31 years."""


@dataclass(frozen=True)
class TraceJob:
    spec: JobSpec
    arrival: float
    departure: float

    @property
    def submitted(self) -> JobSpec:
        """The job as it submits itself at its arrival: with the iterations its trace life
        holds whole at its solo pace (a job that says fewer than it runs is planned with
        a tighter budget, never a looser one), unless its spec says how many."""
        solo = self.spec.solo_iteration()
        if self.spec.iterations is not None or solo <= 0:
            return self.spec
        whole = math.floor((self.departure - self.arrival) / solo)
        return replace(self.spec, iterations=max(1, whole))


@dataclass(frozen=True)
class Trace:
    """Jobs in arrival order; times in seconds since the first event."""

    jobs: tuple[TraceJob, ...]
    start: datetime | None = None

    @property
    def end(self) -> float:
        return max((j.departure for j in self.jobs), default=0.0)


SloSampler = Callable[[str], float]


def uniform_slo(low: float, high: float, seed: int) -> SloSampler:
    """SLOs drawn from U(low, high), one per job in arrival order, reproducible by seed."""
    if low < 1.0 or high < low:
        raise ValueError(f"SLO range must satisfy 1 <= low <= high, got ({low}, {high})")
    rng = random.Random(seed)
    return lambda _name: rng.uniform(low, high)


class PhasePair(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    generate: float = Field(ge=0, le=MAX_PHASE_S)
    train: float = Field(ge=0, le=MAX_PHASE_S)


class Profile(BaseModel):
    """Profiled solo phase times per job type: disaggregated and co-located."""

    model_config = ConfigDict(extra="forbid")
    disagg: dict[str, PhasePair]
    colo: dict[str, PhasePair] = {}


def load_profile(path: Path) -> Profile:
    raw = read_json(path)
    try:
        return Profile.model_validate(raw)
    except ValidationError as err:
        raise from_validation(path, err) from None


def job_from_profile(name: str, job_type: str, profile: Profile, slo: float) -> JobSpec:
    """A production job spec from its type: profiled times, catalogue widths and memory."""
    disagg = profile.disagg[job_type]
    colo = profile.colo.get(job_type)
    width = node_width(job_type)
    rollout_mem, train_mem = host_memory_gb(job_type)
    return JobSpec(
        name=name,
        kind=job_type,
        rollout=PhaseTime.fixed(disagg.generate),
        train=PhaseTime.fixed(disagg.train),
        slo=slo,
        rollout_width=width,
        train_width=width,
        rollout_mem_gb=rollout_mem,
        train_mem_gb=train_mem,
        colocated=(PhaseTime.fixed(colo.generate), PhaseTime.fixed(colo.train)) if colo else None,
    )


def _lines(path: Path) -> Iterator[tuple[int, str]]:
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        raise InputError(path, "file not found") from None
    except UnicodeDecodeError:
        raise InputError(path, "not a UTF-8 text file") from None
    for number, line in enumerate(text.splitlines(), start=1):
        if line.strip() and not line.lstrip().startswith("#"):
            yield number, line


def read_production_trace(path: Path, profile: Profile, slo: SloSampler) -> Trace:
    """Parse the production trace; jobs still running at its end depart at its last event."""
    path = Path(path)
    arrivals: dict[str, tuple[float, str, int]] = {}
    departures: dict[str, float] = {}
    start: datetime | None = None
    last = 0.0
    for number, line in _lines(path):
        fields = [f.strip() for f in line.split(",")]
        if len(fields) != 4:
            raise InputError(path, f"expected 4 comma-separated fields, found {len(fields)}", line=number)
        name, stamp, sign, job_type = fields
        if not name:
            raise InputError(path, "empty job id", line=number, field="job")
        try:
            when = datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S")
        except ValueError:
            raise InputError(path, f"{stamp!r} is not YYYY-MM-DD HH:MM:SS", line=number, field="time") from None
        start = start or when
        t = (when - start).total_seconds()
        if t < last:
            raise InputError(
                path, f"time goes backwards ({stamp} is before the previous event)", line=number, field="time"
            )
        last = t
        if job_type not in profile.disagg:
            raise InputError(path, f"unknown job type {job_type!r}: not in the profile", line=number, field="type")
        if sign in ("1", "+1"):
            if name in arrivals:
                raise InputError(path, f"job {name} arrives twice", line=number, field="event")
            arrivals[name] = (t, job_type, number)
        elif sign == "-1":
            if name not in arrivals:
                raise InputError(path, f"departure of {name} without an earlier arrival", line=number, field="event")
            if name in departures:
                raise InputError(path, f"job {name} departs twice", line=number, field="event")
            if arrivals[name][1] != job_type:
                raise InputError(
                    path,
                    f"job {name} departs as {job_type} but arrived as {arrivals[name][1]}",
                    line=number,
                    field="type",
                )
            departures[name] = t
        else:
            raise InputError(path, f"event must be +1, 1 or -1, got {sign!r}", line=number, field="event")
    if not arrivals:
        raise InputError(path, "the trace holds no job")
    jobs = []
    for name, (arrival, job_type, _) in arrivals.items():
        spec = job_from_profile(name, job_type, profile, slo(name))
        jobs.append(TraceJob(spec, arrival, departures.get(name, last)))
    return Trace(tuple(jobs), start)


class JobRecord(JobFields):
    """One job of RollMux's own trace format (JSONL object or CSV row)."""

    id: str = Field(pattern=NAME_PATTERN)
    arrival_s: float = Field(ge=0, le=MAX_TIME_S)
    departure_s: float | None = Field(default=None, ge=0, le=MAX_TIME_S)
    duration_s: float | None = Field(default=None, gt=0, le=MAX_TIME_S)

    @model_validator(mode="after")
    def _one_end(self) -> JobRecord:
        if (self.departure_s is None) == (self.duration_s is None):
            raise ValueError("give exactly one of departure_s and duration_s")
        if self.departure_s is not None and self.departure_s < self.arrival_s:
            raise ValueError("departure_s is before arrival_s")
        return self

    def to_trace_job(self, slo: SloSampler) -> TraceJob:
        spec = self.to_spec(self.id, self.slo if self.slo is not None else slo(self.id))
        departure = self.departure_s if self.departure_s is not None else self.arrival_s + (self.duration_s or 0.0)
        return TraceJob(spec, self.arrival_s, departure)


def _records(path: Path) -> Iterator[tuple[int, dict]]:
    if path.suffix == ".csv":
        try:
            handle = path.open(newline="")
        except FileNotFoundError:
            raise InputError(path, "file not found") from None
        with handle:
            reader = csv.DictReader(handle)
            for row in reader:
                yield reader.line_num, {k: v for k, v in row.items() if v not in ("", None)}
        return
    for number, line in _lines(path):
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise InputError(path, f"not valid JSON: {err.msg}", line=number) from None
        if not isinstance(record, dict):
            raise InputError(path, "each line must be one JSON object", line=number)
        yield number, record


def read_job_trace(path: Path, slo: SloSampler) -> Trace:
    """Parse RollMux's own format (.jsonl or .csv); records must come in arrival order."""
    path = Path(path)
    jobs: list[TraceJob] = []
    seen: set[str] = set()
    for number, record in _records(path):
        try:
            parsed = JobRecord.model_validate(record)
        except ValidationError as err:
            raise from_validation(path, err, line=number) from None
        if parsed.id in seen:
            raise InputError(path, f"job {parsed.id} appears twice", line=number, field="id")
        if jobs and parsed.arrival_s < jobs[-1].arrival:
            raise InputError(path, "time goes backwards: arrivals must be in order", line=number, field="arrival_s")
        seen.add(parsed.id)
        jobs.append(parsed.to_trace_job(slo))
    if not jobs:
        raise InputError(path, "the trace holds no job")
    return Trace(tuple(jobs))


def check_colocated_times(trace: Trace, source: Path | str = "trace") -> None:
    """Refuse, before any simulation, a trace whose jobs lack the co-located phase times
    the co-located baseline runs on, naming the first such job and where the times go."""
    for j in trace.jobs:
        if j.spec.colocated is None:
            where = f"type {j.spec.kind!r} in the profile's 'colo'" if j.spec.kind else "colo_rollout_s/colo_train_s"
            raise InputError(
                source,
                f"job {j.spec.name} has no co-located phase times ({where}); "
                "the colocated policy needs them: give them or leave colocated out of --policies",
                field="colo",
            )


def read_trace(path: Path, profile: Profile | None, slo: SloSampler) -> Trace:
    """Dispatch on the file: .jsonl/.csv is RollMux's format, anything else the production one."""
    path = Path(path)
    if path.suffix in (".jsonl", ".csv"):
        return read_job_trace(path, slo)
    if profile is None:
        raise InputError(path, "a production trace needs --profile with the phase times of its job types")
    return read_production_trace(path, profile, slo)
