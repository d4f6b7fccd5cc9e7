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
    """Each judged job's mean period over its solo iteration, and the share of judged
    job-time within SLO (NaN when no period could be judged)."""

    slowdowns: dict[str, float]
    attainment: float
    judged_s: float


def judge_periods(
    jobs: Iterable[TraceJob], train_ends: Mapping[str, Sequence[float]], changes: Iterable[float], scale: float = 1.0
) -> PeriodJudgement:
    """Judge every job's iteration periods against its SLO.

    A period is the time between two of a job's training releases. It is judged when no
    change of turns falls in it or in the period before it — an arrival, a departure, or
    one of ``changes`` (a job joining or leaving some group's turns): the round-robin's
    start-up transient after a change is left out, as the fast simulator's steady state
    leaves it out, and so is each job's first iteration (its cold start). ``train_ends``
    and ``changes`` are in the clock's own seconds; ``scale`` turns them into the jobs'
    (trace) seconds."""
    jobs = list(jobs)
    boundaries = sorted({j.arrival for j in jobs} | {j.departure for j in jobs} | {c * scale for c in changes})
    slowdowns: dict[str, float] = {}
    within = judged = 0.0
    for job in jobs:
        spec, times = job.spec, sorted(t * scale for t in train_ends.get(job.spec.name, ()))
        solo = spec.solo_iteration()
        periods = [
            times[i] - times[i - 1]
            for i in range(2, len(times))
            if bisect.bisect_right(boundaries, times[i - 2]) == bisect.bisect_right(boundaries, times[i])
        ]
        if not periods:
            continue
        slowdowns[spec.name] = statistics.fmean(periods) / solo
        for period in periods:
            judged += period
            within += period if period <= spec.slo * solo * (1 + PERIOD_TOLERANCE) else 0.0
    return PeriodJudgement(slowdowns, within / judged if judged else float("nan"), judged)
