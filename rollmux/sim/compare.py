"""Side-by-side comparison of placement policies on one trace, with ratios and bounds.

Every ratio is computed from results of the same run; nothing is a constant.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

from rollmux.core.configs import COLOCATED_ESTIMATE_RULE
from rollmux.core.placement import make_policy
from rollmux.core.regroup import RegroupConfig
from rollmux.core.spec import DEFAULT_PLANNING, HOUR, CostModel, Planning
from rollmux.inputs.trace import Trace, check_colocated_times
from rollmux.sim.control_host import HostCosts, simulate_control
from rollmux.sim.failures import FailureModel
from rollmux.sim.faults import FaultAccount, Faults
from rollmux.sim.periods import PeriodJudgement, judge_periods
from rollmux.sim.simulator import Realisation, SimResult, fluid_lower_bound_usd, simulate

REFERENCE = "rollmux"
ENGINES = ("fast", "control")
"""``fast``: steady-state rates per group (rollmux.sim.simulator), the estimator. ``control``:
the live control plane's state machine under a virtual clock (rollmux.sim.control_host)."""


@dataclass
class Comparison:
    results: dict[str, SimResult]
    """Fault-free runs."""
    fluid_usd: float
    seed: int
    failure_model: FailureModel | None = None
    with_failures: dict[str, SimResult] = field(default_factory=dict)
    """The same policies with ``failure_model``'s failures injected (empty without one)."""
    faults: Faults | None = None
    with_faults: dict[str, tuple[SimResult, FaultAccount]] = field(default_factory=dict)
    """The same policies through the control engine with ``faults`` injected (empty without)."""
    steady: dict[str, PeriodJudgement] = field(default_factory=dict)
    """Control engine only: each policy's SLO judged by steady-state periods, the brief's
    definition, next to the lifetime slowdowns its results judge (start-up and first turns
    counted, which a job of a few iterations cannot amortise)."""

    @property
    def reference(self) -> str:
        return REFERENCE if REFERENCE in self.results else next(iter(self.results))

    def cost_ratio(self, policy: str) -> float:
        """Cost of ``policy`` over the reference's cost: >1 means the reference is cheaper."""
        return self.results[policy].cost_usd / self.results[self.reference].cost_usd

    def efficiency_ratio(self, policy: str) -> float:
        """Reference's work per dollar over ``policy``'s."""
        return self.results[self.reference].work_efficiency / self.results[policy].work_efficiency

    def to_json(self) -> dict:
        ref = self.reference
        return {
            "reference": ref,
            "seed": self.seed,
            "policies": {name: r.summary() for name, r in self.results.items()},
            "ratios": {
                name: {
                    f"cost_over_{ref}": self.cost_ratio(name),
                    f"{ref}_work_efficiency_over": self.efficiency_ratio(name),
                }
                for name in self.results
            },
            "fluid_lower_bound": {
                "cost_usd": self.fluid_usd,
                "cost_usd_per_hour": self.fluid_usd / (self.results[ref].span_s / HOUR),
                **{f"{name}_over_fluid": r.cost_usd / self.fluid_usd for name, r in self.results.items()},
            },
            "cost_rate": {name: r.cost_rate for name, r in self.results.items()},
            "nodes_over_time": {name: r.nodes_over_time for name, r in self.results.items()},
            "jobs": {
                name: {job: {"slowdown": a.slowdown, "slo": a.spec.slo} for job, a in r.jobs.items() if a.seconds > 0}
                for name, r in self.results.items()
            },
            "estimated": {
                "rule": COLOCATED_ESTIMATE_RULE,
                "colocated_job_hours": {
                    name: {job: a.colocated_s / HOUR for job, a in r.estimated_jobs().items()}
                    for name, r in self.results.items()
                },
            },
            "example_group": [{"job": job, **asdict(seat)} for job, seat in self.results[ref].example_group],
            **({"failures": self.failures_json()} if self.failure_model else {}),
            **({"faults": self.faults_json()} if self.faults else {}),
            **({"steady_state_slo": self.steady_json()} if self.steady else {}),
        }

    def steady_json(self) -> dict:
        """Per policy: the share of judged job-time whose steady segment's mean period is
        within SLO, the stricter share judged period by period, and the job-hours judged."""
        return {
            name: {
                "attainment": judged.attainment,
                "single_period_attainment": judged.period_attainment,
                "judged_job_hours": judged.judged_s / HOUR,
            }
            for name, judged in self.steady.items()
        }

    def faults_json(self) -> dict:
        """The fault plan and, per policy, its control-engine run with faults next to the
        fault-free one: cost, ETTR, SLO attainment and what the faults did."""
        assert self.faults is not None
        return {
            "model": asdict(self.faults),
            "policies": {name: fault_summary(self.results[name], *run) for name, run in self.with_faults.items()},
        }

    def failures_json(self) -> dict:
        """The failure model and, per policy, its figures next to the fault-free ones."""
        assert self.failure_model is not None
        return {
            "model": asdict(self.failure_model),
            "policies": {name: failure_summary(self.results[name], run) for name, run in self.with_failures.items()},
        }


def fault_summary(fault_free: SimResult, run: SimResult, account: FaultAccount) -> dict:
    """One policy's control-engine run with faults next to its fault-free run."""
    return {
        "fault_free_cost_usd": fault_free.cost_usd,
        "cost_usd": run.cost_usd,
        "cost_of_faults_usd": run.cost_usd - fault_free.cost_usd,
        "ettr": run.ettr,
        "fault_free_slo_attainment": fault_free.slo_attainment,
        "slo_attainment": run.slo_attainment,
        "jobs_over_slo": run.jobs_over_slo,
        **account.to_json(),
    }


def failure_summary(fault_free: SimResult, run: SimResult) -> dict:
    """One policy's run with failures next to its fault-free run."""
    account = run.failures
    assert account is not None
    return {
        "fault_free_cost_usd": fault_free.cost_usd,
        "cost_usd": run.cost_usd,
        "standby_usd": account.standby_usd,
        "standby_node_hours": account.standby_node_s / HOUR,
        "ettr": run.ettr,
        "wasted_node_hours": account.wasted_node_s / HOUR,
        "lost_job_hours": account.lost_s / HOUR,
        "downtime_job_hours": account.downtime_s / HOUR,
        "redo_job_hours": account.redo_s / HOUR,
        "fault_free_work_efficiency": fault_free.work_efficiency,
        "work_efficiency": run.work_efficiency,
        "fault_free_slo_attainment": fault_free.slo_attainment,
        "slo_attainment": run.slo_attainment,
        "jobs_over_slo": run.jobs_over_slo,
        "failures": account.failures,
        "recoveries": {kind.value: count for kind, count in account.recoveries.items()},
        "interruptions": account.interruptions,
        "standby_failures": account.standby_failures,
        "unreplicated_job_hours": account.unreplicated_job_s / HOUR,
        "log": [asdict(hit) for hit in account.log],
    }


def compare(
    trace: Trace,
    policies: Sequence[str],
    seed: int = 0,
    cost: CostModel | None = None,
    planning: Planning = DEFAULT_PLANNING,
    on_event: Callable[[str], None] | None = None,
    realise: Realisation | None = None,
    regroup: RegroupConfig | None = None,
    source: str = "trace",
    failures: FailureModel | None = None,
    engine: str = "fast",
    faults: Faults | None = None,
) -> Comparison:
    """Run every policy over the same trace; ``on_event(policy)`` reports progress.

    With ``failures``, every policy runs twice: fault-free, then with failures injected
    (``on_event`` then ticks twice per trace event). Every policy's inputs are checked
    before the first simulation starts (``source`` names the trace in the error).
    ``engine="control"`` replays every policy through the control plane's state machine
    (phase by phase, start-ups and transfers paid; ``seed`` draws the phase times); with
    ``faults``, every policy runs there twice: fault-free, then with the faults injected."""
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {', '.join(ENGINES)}, not {engine!r}")
    if engine == "control" and (failures or realise):
        raise ValueError(
            "the control engine draws its own phase times and injects its own faults (--faults), not --mtbf-hours"
        )
    if faults and engine != "control":
        raise ValueError("faults are injected by the control engine only (--engine control)")
    if "colocated" in policies:
        check_colocated_times(trace, source)
    runs: dict[str, SimResult] = {}
    with_failures: dict[str, SimResult] = {}
    with_faults: dict[str, tuple[SimResult, FaultAccount]] = {}
    steady: dict[str, PeriodJudgement] = {}
    for name in policies:
        tick = (lambda _cluster, n=name: on_event(n)) if on_event else None
        regrouping = regroup if name == REFERENCE else None
        if engine == "control":
            policy = make_policy(name, seed)
            ticks = (lambda n=name: on_event(n)) if on_event else None
            control = simulate_control(trace, policy, cost, planning, regrouping, HostCosts(), seed, on_event=ticks)
            runs[name] = control.result
            steady[name] = judge_periods(trace.jobs, control.train_ends, control.turn_changes)
            if faults:
                faulted = simulate_control(
                    trace,
                    make_policy(name, seed),
                    cost,
                    planning,
                    regrouping,
                    HostCosts(),
                    seed,
                    on_event=ticks,
                    faults=faults,
                )
                assert faulted.faults is not None
                with_faults[name] = (faulted.result, faulted.faults)
            continue
        for model in (None, failures) if failures else (None,):
            run = simulate(
                trace,
                make_policy(name, seed),
                cost=cost,
                planning=planning,
                on_event=tick,
                realise=realise,
                regroup=regrouping,
                failures=model,
            )
            (with_failures if model else runs)[name] = run
    return Comparison(
        runs, fluid_lower_bound_usd(trace, cost), seed, failures, with_failures, faults, with_faults, steady
    )
