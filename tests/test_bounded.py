"""Planning is bounded in work and memory whatever a plan holds.

Loose SLOs make almost every grouping feasible: an unbounded search of one group of 46
such jobs took the control plane past 23 GB. These are the specifications of the bounds
that replaced it: no group beyond ``MAX_GROUP_JOBS``, every exact search within its
checks and steps, every regrouping round within its event's, a cache of bounded size,
and the exact optimum and the bound refusing or cutting what they cannot finish.
"""

from __future__ import annotations

import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rollmux.core.bound import BoundConfig, lower_bound
from rollmux.core.cluster import MAX_GROUP_JOBS, Cluster
from rollmux.core.configs import Checks, cheapest_config
from rollmux.core.control import ControlState
from rollmux.core.errors import ProblemTooLarge
from rollmux.core.optimum import MAX_OPTIMUM_JOBS, optimum
from rollmux.core.placement import RandomPolicy, RollMuxPolicy, make_policy, place
from rollmux.core.regroup import RegroupConfig, RegroupState, apply_regroup, plan_regroup
from rollmux.core.spec import CostModel, JobSpec, PhaseTime, Planning
from rollmux.inputs.jobfile import MAX_SLO
from rollmux.inputs.runfile import MAX_PLAN_JOBS, JobSubmission

ROUND_CPU_S = 10.0
"""CPU seconds a regrouping round may take, whatever the plan: over six times the slowest
round of 290 random plans (1.5 s; ``bench/regroup_bounds.py``, docs/results.md). CPU time,
not wall time, so a busy machine does not fail it."""


def small_job(i: int, slo: float, rollout: float = 1.0, train: float = 1.0) -> JobSpec:
    return JobSpec(f"j{i}", PhaseTime.fixed(rollout), PhaseTime.fixed(train), slo, 1, 1, 0.01, 0.01)


@st.composite
def submissions(draw: st.DrawFn) -> list[JobSubmission]:
    """Plans the API accepts: any SLO the schema allows, phase times over six orders of
    magnitude, wide jobs, states from nothing to a full node, some with p99 and
    co-located times."""
    count = draw(st.integers(1, 200))
    slos = st.one_of(st.floats(1.0, 1.5), st.floats(1.5, 100.0), st.sampled_from([60.0, 100.0, MAX_SLO]))
    times = st.sampled_from([0.01, 0.5, 1.0, 7.0, 60.0, 900.0, 1e4])
    jobs = []
    for i in range(count):
        rollout, train = draw(times), draw(times)
        fields = {
            "name": f"j{i}",
            "rollout_s": rollout,
            "train_s": train,
            "slo": draw(slos),
            "rollout_width": draw(st.sampled_from([1, 1, 1, 2, 4])),
            "train_width": draw(st.sampled_from([1, 1, 1, 2])),
            "rollout_mem_gb": draw(st.sampled_from([0.0, 0.01, 10.0, 400.0, 1600.0])),
            "train_mem_gb": draw(st.sampled_from([0.0, 0.01, 10.0, 400.0, 1600.0])),
        }
        if draw(st.booleans()):
            fields["rollout_p99_s"] = rollout * draw(st.floats(1.0, 3.0))
        if draw(st.booleans()):
            fields["colo_rollout_s"], fields["colo_train_s"] = rollout * 1.5, train
        jobs.append(JobSubmission(**fields))
    return jobs


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(submissions())
def test_any_plan_the_api_accepts_is_planned_within_the_round_budget(plan):
    assert len(plan) <= MAX_PLAN_JOBS
    state, config, cache = ControlState(Cluster(), make_policy("rollmux")), RegroupConfig(), RegroupState()
    for job in plan:
        state.submit(job.spec(), job.program(), 0.0)
    for _ in range(3):
        view = state.movable_view()
        started = time.process_time()
        found = plan_regroup(view, config, cache, state.progress(view, 1.0))
        spent = time.process_time() - started
        work = cache.last_round
        assert spent <= ROUND_CPU_S
        burst = config.for_burst()  # a round during a burst of arrivals has a larger, still fixed, budget
        assert work.searches <= work.jobs + len(view.groups) + burst.evaluations
        assert work.checks <= burst.checks_per_event and work.steps <= burst.steps_per_event
        assert cache.cached <= config.cache_entries
        if found is None:
            break
        state.start_regroup(found, 1.0)
    assert all(len(g.members) <= MAX_GROUP_JOBS for g in state.cluster.groups.values())
    assert {j.name for j in state.cluster.jobs()} == {j.name for j in plan}


def test_forty_six_jobs_with_loose_slos_fill_groups_of_at_most_the_limit_and_regroup_quickly():
    cluster, cache = Cluster(), RegroupState()
    for i in range(46):
        place(cluster, RollMuxPolicy(), small_job(i, 60.0))
    sizes = sorted(len(g.members) for g in cluster.groups.values())
    assert max(sizes) == MAX_GROUP_JOBS and sum(sizes) == 46
    started = time.process_time()
    plan = plan_regroup(cluster, RegroupConfig(), cache)
    assert time.process_time() - started <= ROUND_CPU_S
    if plan is not None:
        apply_regroup(cluster, plan)
    assert all(len(g.members) <= MAX_GROUP_JOBS for g in cluster.groups.values())


def test_the_random_baseline_never_fills_a_group_beyond_the_limit_either():
    cluster, policy = Cluster(), RandomPolicy(seed=3)
    for i in range(60):
        place(cluster, policy, small_job(i, MAX_SLO))
    assert max(len(g.members) for g in cluster.groups.values()) <= MAX_GROUP_JOBS


def test_an_exact_search_stops_at_its_steps_and_says_it_ran_out():
    # Six jobs whose cheapest feasible configuration lies behind ~100,000 seatings that
    # fit no node's memory: unbounded, this one search took 1.7 s.
    rows = [
        (65.36, 91.45, 42.08, 1, 2, 500, 900),
        (3.90, 57.89, 14.95, 1, 1, 0.01, 100),
        (0.42, 67.01, 49.22, 2, 1, 0.01, 900),
        (41.71, 94.49, 7.82, 1, 1, 500, 900),
        (10.77, 0.33, 49.13, 2, 1, 500, 0.01),
        (94.65, 0.68, 3.09, 2, 1, 0.01, 0.01),
    ]
    jobs = [
        JobSpec(f"j{i}", PhaseTime.fixed(r), PhaseTime.fixed(t), slo, rw, tw, rm, tm)
        for i, (r, t, slo, rw, tw, rm, tm) in enumerate(rows)
    ]
    checks = Checks(40, steps=2000)
    started = time.process_time()
    found = cheapest_config(jobs, CostModel(), Planning.P95, True, checks)
    assert checks.ran_out and checks.steps == 0
    assert found is None or all(p <= j.period_budget for j, p in zip(found.jobs, found.periods, strict=True))
    assert time.process_time() - started < 1.0


def test_no_exact_search_takes_more_jobs_than_a_group_holds():
    jobs = [small_job(i, 60.0) for i in range(MAX_GROUP_JOBS + 1)]
    with pytest.raises(ProblemTooLarge, match=f"at most {MAX_GROUP_JOBS} jobs"):
        cheapest_config(jobs, CostModel(), Planning.P95)
    with pytest.raises(ProblemTooLarge, match=f"at most {MAX_OPTIMUM_JOBS} jobs"):
        optimum([small_job(i, 2.0) for i in range(MAX_OPTIMUM_JOBS + 1)])
    with pytest.raises(ValueError, match="max_group"):
        RegroupConfig(max_group=MAX_GROUP_JOBS + 1)
    with pytest.raises(ValueError, match="max_group"):
        BoundConfig(max_group=MAX_GROUP_JOBS + 1)


def test_the_optimum_of_loose_jobs_keeps_its_groups_within_the_limit():
    best = optimum([small_job(i, 60.0) for i in range(MAX_GROUP_JOBS + 2)])
    assert max(len(g.jobs) for g in best.groups) <= MAX_GROUP_JOBS


def test_a_bound_whose_searches_run_out_of_steps_is_still_a_bound():
    jobs = [small_job(i, 1.3 + 0.1 * (i % 3), 40.0 + 9 * i, 30.0 + 7 * (i % 4)) for i in range(6)]
    best = optimum(jobs, colocate=True).cost_per_hour
    starved = lower_bound(jobs, CostModel(), Planning.P95, BoundConfig(steps_per_search=3, steps=40))
    assert starved.value <= best + 1e-6
    assert lower_bound(jobs, CostModel(), Planning.P95).value <= best + 1e-6


def test_the_cache_of_long_lived_jobs_stays_within_its_limit():
    def peak(config: RegroupConfig) -> int:
        cluster, cache, largest = Cluster(), RegroupState(), 0
        for i in range(30):  # long-lived: they never leave, so sweeping departed jobs frees nothing
            spec = small_job(i, 1.2 + 0.03 * (i % 9), 50.0 + 11 * (i % 7), 40.0 + 5 * (i % 5))
            place(cluster, RollMuxPolicy(), spec)
        for k in range(40):
            arriving = small_job(100 + k, 1.3, 60.0 + k, 45.0)
            place(cluster, RollMuxPolicy(), arriving)
            plan = plan_regroup(cluster, config, cache)
            if plan is not None:
                apply_regroup(cluster, plan)
            cluster.remove(arriving.name)
            largest = max(largest, cache.cached)
        return largest

    limited = RegroupConfig(cache_entries=120)
    assert peak(limited) <= limited.cache_entries < peak(RegroupConfig())


def test_a_round_that_runs_out_of_budget_says_so():
    cluster, cache = Cluster(), RegroupState()
    for i in range(24):
        place(cluster, RollMuxPolicy(), small_job(i, 1.25 + 0.01 * (i % 7), 60.0 + 7 * (i % 11), 40.0 + 13 * (i % 7)))
    plan_regroup(cluster, RegroupConfig(evaluations=2), cache)
    assert cache.last_round.exhausted and cache.last_round.searches <= 24 + len(cluster.groups) + 2
    assert cache.rounds == cache.exhausted_rounds == 1
