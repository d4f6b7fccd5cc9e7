"""Steady-state SLO attainment judged from iteration periods, one rule for every clock.

The live replay and the virtual-clock host both end with each job's training releases
and the moments its group's turns changed. Judging both by this one rule is what makes
their SLO figures comparable: a lifetime slowdown over a short window is dominated by the
window's own start (every job submitted at once, its start-up and first turn counted), so
it says little about the schedule the two made.
"""

from __future__ import annotations

import bisect
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from rollmux.inputs.trace import TraceJob

CHANGES = frozenset({"running", "moved", "lost", "done", "failed", "cancelled"})
"""Job events that change their group's turns."""
PERIOD_TOLERANCE = 0.02
"""A period within 2 % of the SLO counts as within it (timer and switching jitter)."""


@dataclass(frozen=True)
class PeriodJudgement:
    """Each judged job's mean period over its solo iteration; the share of judged job-time
    in steady segments whose mean period is within SLO (``attainment``: the brief's
    steady-state period), and, stricter, the share in single periods within it
    (``period_attainment``). Both NaN when no period could be judged."""

    slowdowns: dict[str, float]
    attainment: float
    period_attainment: float
    judged_s: float


def judge_periods(
    jobs: Iterable[TraceJob], train_ends: Mapping[str, Sequence[float]], changes: Iterable[float], scale: float = 1.0
) -> PeriodJudgement:
    """Judge every job's steady iteration period against its SLO.

    A period is the time between two of a job's training releases. It is judged when no
    change of turns falls in it or in the period before it — an arrival, a departure, or
    one of ``changes`` (a job joining or leaving some group's turns): the round-robin's
    start-up transient after a change is left out, as the fast simulator's steady state
    leaves it out, and so is each job's first iteration (its cold start). The judged
    periods between two changes are one steady segment; its mean period is the job's
    steady-state period there (the cycle mean the simulators plan with), and the
    segment's time is within SLO when that mean is. Single periods vary with the measured
    phase times of a turn: ``period_attainment`` judges each alone. ``train_ends`` and
    ``changes`` are in the clock's own seconds; ``scale`` turns them into the jobs'
    (trace) seconds."""
    jobs = list(jobs)
    boundaries = sorted({j.arrival for j in jobs} | {j.departure for j in jobs} | {c * scale for c in changes})
    slowdowns: dict[str, float] = {}
    in_segments = in_periods = judged = 0.0
    for job in jobs:
        spec, times = job.spec, sorted(t * scale for t in train_ends.get(job.spec.name, ()))
        solo = spec.solo_iteration()
        limit = spec.slo * solo * (1 + PERIOD_TOLERANCE)
        segments = _steady_segments(times, boundaries)
        periods = [period for segment in segments for period in segment]
        if not periods:
            continue
        slowdowns[spec.name] = statistics.fmean(periods) / solo
        for segment in segments:
            length = sum(segment)
            judged += length
            in_segments += length if length / len(segment) <= limit else 0.0
            in_periods += sum(period for period in segment if period <= limit)
    return PeriodJudgement(
        slowdowns,
        in_segments / judged if judged else float("nan"),
        in_periods / judged if judged else float("nan"),
        judged,
    )


def _steady_segments(times: Sequence[float], boundaries: Sequence[float]) -> list[list[float]]:
    """The judged periods of one job, grouped by the stretch between changes they lie in."""
    segments: dict[int, list[float]] = {}
    for i in range(2, len(times)):
        stretch = bisect.bisect_right(boundaries, times[i])
        if bisect.bisect_right(boundaries, times[i - 2]) == stretch:
            segments.setdefault(stretch, []).append(times[i] - times[i - 1])
    return list(segments.values())
