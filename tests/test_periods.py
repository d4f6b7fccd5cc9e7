"""One rule judges the SLO of the live replay and of the virtual clock: iteration periods in
steady state (rollmux.sim.periods)."""

from __future__ import annotations

import math

import pytest

from rollmux.core.spec import JobSpec, PhaseTime
from rollmux.inputs.trace import TraceJob
from rollmux.sim.periods import judge_periods


def job(name: str, slo: float = 1.5, arrival: float = 0.0, departure: float = 1_000.0) -> TraceJob:
    spec = JobSpec(name=name, rollout=PhaseTime(6.0), train=PhaseTime(4.0), slo=slo)
    return TraceJob(spec, arrival, departure)


def test_a_steady_job_within_its_slo_is_judged_within_it():
    judged = judge_periods([job("a")], {"a": [12.0 * i for i in range(1, 11)]}, changes=[])
    assert judged.slowdowns == {"a": pytest.approx(1.2)}
    assert judged.attainment == 1.0
    assert judged.judged_s == pytest.approx(12.0 * 8)


def test_a_steady_segment_is_judged_by_its_mean_period_and_single_periods_each_alone():
    ends = [10.0, 20.0, 30.0, 50.0, 60.0]  # periods 10, 10, 20, 10: the first is not judged
    judged = judge_periods([job("a", slo=1.5)], {"a": ends}, changes=[])
    assert judged.attainment == 1.0  # mean 13.3 s against 15 s
    assert judged.period_attainment == pytest.approx(10.0 / 40.0 + 10.0 / 40.0)


def test_a_segment_whose_mean_period_is_over_the_slo_counts_against_it_with_all_its_time():
    # Two steady segments split by a change at 45 s: periods 10, 10 then 20, 20, 20.
    ends = [10.0, 20.0, 30.0, 40.0, 60.0, 80.0, 100.0, 120.0]
    judged = judge_periods([job("a", slo=1.5)], {"a": ends}, changes=[45.0])
    # 80-100 and 100-120 are judged (60-80 follows the change): 20 s of 20 + 40 s.
    assert judged.judged_s == pytest.approx(20.0 + 40.0)
    assert judged.attainment == pytest.approx(20.0 / 60.0)
    assert judged.period_attainment == pytest.approx(20.0 / 60.0)


def test_the_transient_after_a_change_of_turns_is_left_out():
    ends = [10.0, 20.0, 30.0, 60.0, 90.0, 100.0, 110.0, 120.0]
    judged = judge_periods([job("a")], {"a": ends}, changes=[35.0])
    # The two periods of 30 s (30-60 and 60-90) follow the change: not judged.
    assert judged.attainment == 1.0
    assert judged.judged_s == pytest.approx(4 * 10.0)


def test_scale_turns_a_clock_s_seconds_into_the_trace_s():
    live = [1.2 * i for i in range(1, 11)]
    assert judge_periods([job("a")], {"a": live}, changes=[], scale=10.0).slowdowns == {"a": pytest.approx(1.2)}


def test_a_job_with_no_judged_period_is_left_out_and_nothing_judged_is_nan():
    judged = judge_periods([job("a")], {"a": [10.0, 20.0]}, changes=[])
    assert judged.slowdowns == {}
    assert math.isnan(judged.attainment) and math.isnan(judged.period_attainment)
