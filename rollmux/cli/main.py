"""The ``rollmux`` command line: simulate a trace, plan a set of jobs.

Bad input never shows a traceback: one line naming file, line and field, exit code 2.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from dataclasses import fields, replace
from enum import Enum
from functools import wraps
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, TypeVar

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from rollmux.core.cluster import Cluster
from rollmux.core.configs import COLOCATED_ESTIMATE_RULE
from rollmux.core.errors import RollMuxError
from rollmux.core.placement import POLICIES, make_policy, place
from rollmux.core.spec import (
    DEFAULT_PLANNING,
    HOUR,
    MOVE_HORIZON_S,
    MOVE_RISK_GRACE,
    MOVE_RISK_GROWTH,
    MOVE_RISK_USD,
    Planning,
    Pool,
)
from rollmux.inputs.jobfile import load_job_file
from rollmux.inputs.trace import Trace, load_profile, read_trace, uniform_slo
from rollmux.sim import failures as fail
from rollmux.sim.failures import FailureModel, Recovery, RecoveryTimes
from rollmux.sim.faults import Faults

if TYPE_CHECKING:  # the simulator and the plots load scipy and matplotlib: only `simulate` needs them
    from rollmux.sim.compare import Comparison
    from rollmux.sim.simulator import SimResult

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__)
WIDE = 160
"""Width when output is not a terminal, so tables piped to files and READMEs stay whole."""
out = Console(width=None if sys.stdout.isatty() else WIDE)
err = Console(stderr=True)

MovesPerDay = Annotated[
    float | None,
    typer.Option(
        min=0, max=1_000, help="Each job's budget of moves: one, plus this many per day it runs (default: none)"
    ),
]
MoveRisk = Annotated[
    float,
    typer.Option(
        min=0,
        max=100_000,
        help="Dollars each move must repay within regrouping's horizon beyond its pause (fewer, larger moves)",
    ),
]
MoveHorizon = Annotated[
    float,
    typer.Option(
        min=0.01,
        max=24 * 365,
        help="Hours within which a move's saving must repay its pause, lost work and risk (or the mover's life)",
    ),
]
MoveRiskGrowth = Annotated[
    float,
    typer.Option(
        min=0,
        max=100,
        help="Share of the move risk each earlier move of a job adds to its next (spreads moves over jobs)",
    ),
]
MoveRiskGrace = Annotated[
    int,
    typer.Option(min=0, max=1000, help="Moves of a job before its move risk starts to grow (a soft budget of moves)"),
]
"""Regrouping's options that ``simulate`` and ``serve`` share."""


class Engine(str, Enum):
    """How ``simulate`` replays a trace (rollmux.sim.compare.ENGINES)."""

    FAST = "fast"
    CONTROL = "control"


F = TypeVar("F", bound=Callable[..., None])


def friendly_errors(command: F) -> F:
    """Turn RollMux's own errors into one red line and exit code 2."""

    @wraps(command)
    def wrapper(*args, **kwargs):
        try:
            return command(*args, **kwargs)
        except (RollMuxError, ValueError, OSError) as error:
            err.print(f"[bold red]error:[/] {escape(str(error))}", highlight=False, soft_wrap=True)
            raise typer.Exit(code=2) from None

    return wrapper  # type: ignore[return-value]


def _policy_names(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in POLICIES]
    if unknown or not names:
        raise ValueError(
            f"--policies: unknown policy {', '.join(unknown) or '(none)'}; choose from {', '.join(POLICIES)}"
        )
    return names


def _load_trace(trace: Path, profile: Path | None, slo_uniform: tuple[float, float], seed: int) -> Trace:
    sampler = uniform_slo(slo_uniform[0], slo_uniform[1], seed)
    return read_trace(trace, load_profile(profile) if profile else None, sampler)


def _downtime_help(kind: Recovery) -> str:
    default = RecoveryTimes().of(kind)
    return f"With --mtbf-hours: seconds without progress after a {kind.value} recovery (default {default:g})"


@app.command()
@friendly_errors
def simulate(
    trace: Annotated[Path, typer.Argument(help="Production trace, or RollMux .jsonl/.csv job trace")],
    profile: Annotated[Path | None, typer.Option(help="Phase-time profile (needed for a production trace)")] = None,
    policies: Annotated[
        str, typer.Option(help="Comma-separated policies to compare")
    ] = "rollmux,solo,colocated,random",
    slo_uniform: Annotated[tuple[float, float], typer.Option(help="Draw each job's SLO from U(LOW, HIGH)")] = (
        1.2,
        1.5,
    ),
    seed: Annotated[int, typer.Option(help="Seed of SLO draws and random placement")] = 0,
    planning: Annotated[
        Planning, typer.Option(help="Plan with the mean, a quantile or the worst case")
    ] = DEFAULT_PLANNING,
    regroup: Annotated[
        bool, typer.Option("--regroup/--no-regroup", help="Let RollMux migrate running jobs when it pays")
    ] = True,
    moves_per_day: MovesPerDay = None,
    move_risk_usd: MoveRisk = MOVE_RISK_USD,
    move_horizon_hours: MoveHorizon = MOVE_HORIZON_S / HOUR,
    move_risk_growth: MoveRiskGrowth = MOVE_RISK_GROWTH,
    move_risk_grace: MoveRiskGrace = MOVE_RISK_GRACE,
    rollout_cv: Annotated[
        float, typer.Option(min=0.0, help="Draw rollouts from a lognormal of this CV; SLOs on realised times")
    ] = 0.0,
    long_tail: Annotated[
        float,
        typer.Option(
            min=0.0,
            max=0.95,
            help="Model long-tail rollout migration, as the live plane runs it (both engines): the share "
            "of each rollout's time its last 20 % of requests take, moved onto a fifth of its nodes (at least one) "
            "so that its other nodes go to the next rollout, which starts on the nodes it gets; rollouts of one node "
            "move nothing. 0: off",
        ),
    ] = 0.0,
    tail_resume_s: Annotated[
        float | None,
        typer.Option(
            min=0.0,
            max=3600.0,
            help="With --long-tail: seconds the moved requests take to resume on the tail nodes "
            "(an assumption, not measured; default 5)",
        ),
    ] = None,
    engine: Annotated[
        Engine,
        typer.Option(
            help="fast: steady-state rates per group; control: the live control plane's state machine, "
            "phase by phase under a virtual clock, start-ups and transfers paid"
        ),
    ] = Engine.FAST,
    faults: Annotated[
        bool,
        typer.Option(
            "--faults",
            help="With --engine control: run each policy again with seeded driver kills, lease losses, node "
            "failures and two control-plane restarts, invariants checked at every step",
        ),
    ] = False,
    json_out: Annotated[Path | None, typer.Option("--json", help="Write the results as JSON here")] = None,
    plot: Annotated[Path | None, typer.Option(help="PNG of cost rate over time (default: next to --json)")] = None,
    mtbf_hours: Annotated[
        float | None,
        typer.Option(
            min=fail.MIN_MTBF_HOURS,
            max=fail.MAX_MTBF_HOURS,
            help="Inject node failures: mean time between failures per node",
        ),
    ] = None,
    standby: Annotated[
        int | None,
        typer.Option(min=0, max=fail.MAX_STANDBY, help="With --mtbf-hours: idle standby nodes per pool (default 0)"),
    ] = None,
    replicas: Annotated[
        bool | None,
        typer.Option(
            "--replicas/--no-replicas",
            help="With --mtbf-hours: keep each job's state in a buddy's host memory (default: on with a standby)",
        ),
    ] = None,
    checkpoint_min: Annotated[
        float | None,
        typer.Option(
            min=1.0,
            max=fail.MAX_CHECKPOINT_INTERVAL_S / 60,
            help="With --mtbf-hours: minutes of progress between checkpoints "
            f"(default {fail.DEFAULT_CHECKPOINT_INTERVAL_S / 60:g})",
        ),
    ] = None,
    restock_min: Annotated[
        float | None,
        typer.Option(
            min=0.0,
            max=fail.MAX_DOWNTIME_S / 60,
            help=f"With --mtbf-hours: minutes to replace a standby (default {fail.DEFAULT_RESTOCK_S / 60:g})",
        ),
    ] = None,
    downtime_buddy_s: Annotated[
        float | None, typer.Option(min=0.0, max=fail.MAX_DOWNTIME_S, help=_downtime_help(Recovery.STANDBY_BUDDY))
    ] = None,
    downtime_checkpoint_s: Annotated[
        float | None, typer.Option(min=0.0, max=fail.MAX_DOWNTIME_S, help=_downtime_help(Recovery.STANDBY_CHECKPOINT))
    ] = None,
    downtime_cold_s: Annotated[
        float | None, typer.Option(min=0.0, max=fail.MAX_DOWNTIME_S, help=_downtime_help(Recovery.COLD))
    ] = None,
) -> None:
    """Replay a trace under several placement policies and compare cost, efficiency and SLOs;
    with --mtbf-hours (fast engine) or --faults (control engine), also with failures injected,
    next to the fault-free figures."""
    from rollmux.core.regroup import RegroupConfig
    from rollmux.report.plots import cost_rate_plot
    from rollmux.sim.compare import compare
    from rollmux.sim.simulator import LONG_TAIL_RESUME_S, Realisation, with_long_tail, with_rollout_cv

    names = _policy_names(policies)
    failure_model = _failure_model(
        mtbf_hours,
        seed,
        standby=standby,
        replicas=replicas,
        checkpoint_min=checkpoint_min,
        restock_min=restock_min,
        downtimes=(downtime_buddy_s, downtime_checkpoint_s, downtime_cold_s),
    )
    if faults and engine is not Engine.CONTROL:
        raise typer.BadParameter("--faults needs --engine control (the fast engine injects --mtbf-hours)")
    if tail_resume_s is not None and not long_tail:
        raise typer.BadParameter("--tail-resume-s needs --long-tail (no rollout moves its tail without it)")
    fault_plan = Faults(seed=seed) if faults else None
    loaded = _load_trace(trace, profile, slo_uniform, seed)
    if long_tail:
        loaded = with_long_tail(loaded, long_tail, LONG_TAIL_RESUME_S if tail_resume_s is None else tail_resume_s)
    realise = None
    if rollout_cv > 0:
        loaded, realise = with_rollout_cv(loaded, rollout_cv), Realisation(seed=seed)
    event_count = 2 * len(loaded.jobs) * (2 if failure_model or fault_plan else 1)
    with Progress(
        TextColumn("{task.description:>10}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=err
    ) as progress:
        tasks = {n: progress.add_task(n, total=event_count) for n in names}
        result = compare(
            loaded,
            names,
            seed=seed,
            planning=planning,
            on_event=lambda n: progress.advance(tasks[n]),
            realise=realise,
            regroup=RegroupConfig(
                moves_per_day=moves_per_day,
                move_risk_usd=move_risk_usd,
                horizon_s=move_horizon_hours * HOUR,
                move_risk_growth=move_risk_growth,
                move_risk_grace=move_risk_grace,
            )
            if regroup
            else None,
            source=str(trace),
            failures=failure_model,
            engine=engine.value,
            faults=fault_plan,
        )
    out.print(comparison_table(result, f"{trace.name}: {len(loaded.jobs)} jobs, {loaded.end / 86400:.1f} days"))
    out.print(fluid_line(result), highlight=False)
    if result.steady:
        out.print(steady_line(result), highlight=False)
    if regroup:
        out.print(regroup_line(result.results[result.reference]), highlight=False)
    estimated = estimated_line(result.results[result.reference])
    if estimated:
        out.print(estimated, highlight=False)
    if fault_plan:
        out.print(faults_table(result))
    if failure_model:
        out.print(failures_table(result))
        for line in failures_lines(result):
            out.print(line, highlight=False)
    report = result.to_json()
    if json_out:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(json.dumps(report, indent=2))
        out.print(f"results: {json_out}")
    plot = plot or (json_out.with_name(json_out.stem + "-cost-rate.png") if json_out else Path("cost-rate.png"))
    cost_rate_plot(report["cost_rate"], plot, f"Cost rate on {trace.name}")
    out.print(f"picture: {plot}")


def comparison_table(result: Comparison, title: str) -> Table:
    ref = result.reference
    table = Table(title=title)
    for column in (
        "policy",
        "cost $",
        "$/h",
        "node-h",
        f"cost / {ref}",
        "work/$",
        f"{ref} eff ×",
        "SLO att.",
        "mean sd",
        "p99 sd",
        "busy R",
        "busy T",
        "peak R",
        "peak T",
    ):
        table.add_column(column, justify="left" if column == "policy" else "right")
    for name, sim in result.results.items():
        s = sim.summary()
        table.add_row(
            name,
            f"{s['cost_usd']:,.0f}",
            f"{s['cost_usd_per_hour']:,.1f}",
            f"{s['cost_node_hours']:,.0f}",
            f"{result.cost_ratio(name):.3f}",
            f"{s['work_efficiency']:.5f}",
            f"{result.efficiency_ratio(name):.3f}",
            f"{100 * s['slo_attainment']:.1f}%",
            f"{s['mean_slowdown']:.3f}",
            f"{s['p99_slowdown']:.3f}",
            f"{100 * s['rollout_busy_fraction']:.0f}%",
            f"{100 * s['train_busy_fraction']:.0f}%",
            str(s["rollout_peak_nodes"]),
            str(s["train_peak_nodes"]),
        )
    return table


_DOWNTIME_OPTIONS = ("--downtime-buddy-s", "--downtime-checkpoint-s", "--downtime-cold-s")


def _failure_model(
    mtbf_hours: float | None,
    seed: int,
    *,
    standby: int | None,
    replicas: bool | None,
    checkpoint_min: float | None,
    restock_min: float | None,
    downtimes: tuple[float | None, float | None, float | None],
) -> FailureModel | None:
    """The failure model the options ask for; options of one without --mtbf-hours are refused
    rather than ignored. Unset options take the model's documented defaults."""
    given = {"--standby": standby, "--replicas": replicas, "--checkpoint-min": checkpoint_min}
    given |= {"--restock-min": restock_min, **dict(zip(_DOWNTIME_OPTIONS, downtimes, strict=True))}
    if mtbf_hours is None:
        stray = [name for name, value in given.items() if value is not None]
        if stray:
            verb = "needs" if len(stray) == 1 else "need"
            raise ValueError(f"{', '.join(stray)} {verb} --mtbf-hours (no node fails without it)")
        return None
    times = {f.name: value for f, value in zip(fields(RecoveryTimes), downtimes, strict=True) if value is not None}
    chosen = {
        "standby": standby,
        "checkpoint_interval_s": None if checkpoint_min is None else 60 * checkpoint_min,
        "restock_s": None if restock_min is None else 60 * restock_min,
    }
    model = FailureModel(mtbf_hours, seed=seed, downtimes=RecoveryTimes(**times))
    model = replace(model, **{name: value for name, value in chosen.items() if value is not None})
    return replace(model, replicas=model.standby > 0 if replicas is None else replicas)


_SHORT_KIND = {  # recovery kinds in table headers
    "standby+buddy": "stby+buddy",
    "standby+checkpoint": "stby+ckpt",
    "cold": "cold",
}


def failures_table(result: Comparison) -> Table:
    """Per policy: cost, ETTR, losses and SLO attainment with failures, next to fault-free."""
    from rollmux.sim.compare import failure_summary

    model = result.failure_model
    assert model is not None
    times = model.downtimes
    table = Table(
        title=f"node failures: MTBF {model.mtbf_hours:g} h/node, {model.standby} standby/pool, "
        f"replicas {'on' if model.replicas else 'off'}, checkpoint {model.checkpoint_interval_s / 60:g} min, "
        f"downtime stby+buddy {times.standby_buddy_s:g} s, stby+ckpt {times.standby_checkpoint_s:g} s, "
        f"cold {times.cold_s:g} s, seed {model.seed}"
    )
    columns = ("policy", "no-fail $", "cost $", "standby $", "ETTR", "lost job-h", "lost node-h", "no-fail SLO")
    columns += ("SLO att.", "failures", *(_SHORT_KIND[kind.value] for kind in Recovery))
    for column in columns:
        table.add_column(column, justify="left" if column == "policy" else "right")
    for name, run in result.with_failures.items():
        s = failure_summary(result.results[name], run)
        table.add_row(
            name,
            f"{s['fault_free_cost_usd']:,.0f}",
            f"{s['cost_usd']:,.0f}",
            f"{s['standby_usd']:,.0f}",
            f"{s['ettr']:.4f}",
            f"{s['lost_job_hours']:,.1f}",
            f"{s['wasted_node_hours']:,.1f}",
            f"{100 * s['fault_free_slo_attainment']:.1f}%",
            f"{100 * s['slo_attainment']:.1f}%",
            str(s["failures"]),
            *(str(s["recoveries"][kind.value]) for kind in Recovery),
        )
    return table


def faults_table(result: Comparison) -> Table:
    """Per policy: the control engine's run with faults next to its fault-free run."""
    from rollmux.sim.compare import fault_summary

    plan = result.faults
    assert plan is not None
    table = Table(
        title=f"faults (control engine, seed {plan.seed}): driver kills {plan.driver_kills_per_job_day:g} and lease "
        f"losses {plan.lease_losses_per_job_day:g} per job-day, node failures {plan.node_failures_per_day:g} a day, "
        f"{plan.plane_restarts} control-plane restarts; lease {plan.lease_s:g} s, failover {plan.failover_s:g} s, "
        f"{plan.standby_per_pool} standby/pool; every invariant checked at every step"
    )
    columns = ("policy", "no-fault $", "cost $", "faults cost $", "ETTR", "redo job-h", "down job-h")
    columns += (
        "no-fault SLO",
        "SLO att.",
        "kills",
        "leases",
        "nodes",
        "restarts",
        "jobs hit",
        "failed",
        "steps checked",
    )
    for column in columns:
        table.add_column(column, justify="left" if column == "policy" else "right")
    for name, run in result.with_faults.items():
        s = fault_summary(result.results[name], *run)
        injected = s["injected"]
        table.add_row(
            name,
            f"{s['fault_free_cost_usd']:,.0f}",
            f"{s['cost_usd']:,.0f}",
            f"{s['cost_of_faults_usd']:,.0f}",
            f"{s['ettr']:.4f}",
            f"{s['redo_job_hours']:,.1f}",
            f"{s['down_job_hours']:,.1f}",
            f"{100 * s['fault_free_slo_attainment']:.1f}%",
            f"{100 * s['slo_attainment']:.1f}%",
            *(str(injected[kind]) for kind in ("driver-kill", "lease-loss", "node-failure", "plane-restart")),
            str(s["interruptions"]),
            ", ".join(s["failed_jobs"]) or "0",
            f"{s['checked_steps']:,}",
        )
    return table


def failures_lines(result: Comparison) -> list[str]:
    """Jobs interrupted per policy (the recovery columns count these, not failures: the
    jobs of one failed node may recover differently) and, with replicas, the job-hours
    of jobs whose copy had no buddy (no room on another held training node nor a
    standby, or a trainer spread over several nodes): those recover from their
    checkpoint."""
    accounts = {name: run.failures for name, run in result.with_failures.items() if run.failures}
    lines = [
        "jobs interrupted (each once in stby+buddy, stby+ckpt or cold): "
        + " ".join(f"{name}={a.interruptions}" for name, a in accounts.items())
    ]
    if result.failure_model and result.failure_model.replicas:
        hours = " ".join(f"{name}={a.unreplicated_job_s / HOUR:.1f}h" for name, a in accounts.items())
        lines.append(f"jobs without a replica (no room on another training node or a standby): {hours}")
    return lines


def regroup_line(result: SimResult) -> str:
    """How much regrouping worked, and how often its per-round budget stopped it."""
    return (
        f"regrouping ({result.policy}): {result.regroup_rounds} rounds, {result.regroup_rounds_exhausted} stopped "
        f"on their work budget (each kept the best plan it had found); at most {result.regroup_peak_cached} "
        "solved sets cached"
    )


def estimated_line(result: SimResult, named: int = 5) -> str:
    """Which jobs ran co-located on estimated times, and for how long (empty if none)."""
    jobs = sorted(result.estimated_jobs().items(), key=lambda item: -item[1].colocated_s)
    if not jobs:
        return ""
    hours = sum(a.colocated_s for _, a in jobs) / HOUR
    total = sum(a.colocated_s for a in result.jobs.values()) / HOUR
    shown = ", ".join(f"{name} ({a.colocated_s / HOUR:,.1f} h)" for name, a in jobs[:named])
    more = f" and {len(jobs) - named} more" if len(jobs) > named else ""
    return (
        f"estimated ({result.policy}): {len(jobs)} jobs ran co-located on estimated times, {hours:,.1f} of "
        f"{total:,.1f} co-located job-hours: {shown}{more}. Rule: {COLOCATED_ESTIMATE_RULE}; the JSON lists them all"
    )


def steady_line(result: Comparison) -> str:
    """The control engine's SLO by steady-state periods, next to the table's lifetime figure."""
    parts = [
        f"{name} {100 * j.attainment:.2f} % (single periods {100 * j.period_attainment:.2f} %)"
        for name, j in result.steady.items()
    ]
    return (
        "SLO by steady-state period (the brief's slowdown; the table's SLO is over each job's whole life, "
        "start-up and first turns counted): " + ", ".join(parts)
    )


def fluid_line(result: Comparison) -> str:
    ref = result.reference
    parts = [f"{name}/fluid={sim.cost_usd / result.fluid_usd:.3f}" for name, sim in result.results.items()]
    return f"fluid lower bound: ${result.fluid_usd:,.0f} — " + " ".join(parts) + f" (room left for {ref})"


@app.command()
@friendly_errors
def plan(
    jobs: Annotated[Path, typer.Argument(help="YAML file with a 'jobs' list (see examples/)")],
    policy: Annotated[str, typer.Option(help="Placement policy")] = "rollmux",
    json_out: Annotated[Path | None, typer.Option("--json", help="Write the plan as JSON here")] = None,
) -> None:
    """Place a set of jobs in order and show groups, nodes, cycle times and slowdowns."""
    job_file = load_job_file(jobs)
    chosen = make_policy(_policy_names(policy)[0])
    cluster = Cluster(cost=job_file.cost.to_model(), planning=job_file.planning)
    for spec in job_file.specs():
        place(cluster, chosen, spec)
    solo_rate = sum(
        s.rollout_width * cluster.cost.price(Pool.ROLLOUT) + s.train_width * cluster.cost.price(Pool.TRAIN)
        for s in job_file.specs()
    )
    out.print(groups_table(cluster))
    rate = cluster.cost_per_hour()
    out.print(
        f"cost ${rate:,.2f}/h on {cluster.nodes(Pool.ROLLOUT)} rollout + {cluster.nodes(Pool.TRAIN)} training nodes; "
        f"solo-disaggregated ${solo_rate:,.2f}/h ({solo_rate / rate:.2f}× more)",
        highlight=False,
    )
    if json_out:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(json.dumps(plan_json(cluster), indent=2))


def groups_table(cluster: Cluster) -> Table:
    table = Table(title="co-execution groups")
    for column in ("group", "rollout nodes", "train nodes", "cycle s", "T1 s", "T2 s", "jobs (slowdown / SLO)"):
        table.add_column(column, justify="left" if column in ("group", "jobs (slowdown / SLO)") else "right")
    for group in cluster.groups.values():
        slow = group.slowdowns()
        jobs = ", ".join(f"{m.job.name} {slow[m.job.name]:.3f}/{m.job.slo:.2f}" for m in group.members)
        table.add_row(
            str(group.id),
            " ".join(map(str, group.rollout_nodes)) or "-",
            " ".join(map(str, group.train_nodes)),
            f"{group.schedule.cycle:.1f}",
            f"{group.schedule.t1:.1f}",
            f"{group.schedule.t2:.1f}",
            jobs,
        )
    return table


def plan_json(cluster: Cluster) -> dict:
    return {
        "cost_usd_per_hour": cluster.cost_per_hour(),
        "groups": [
            {
                "id": g.id,
                "rollout_nodes": g.rollout_nodes,
                "train_nodes": g.train_nodes,
                "cycle_s": g.schedule.cycle,
                "t1_s": g.schedule.t1,
                "t2_s": g.schedule.t2,
                "jobs": [
                    {
                        "name": m.job.name,
                        "rollout_nodes": list(m.rollout_nodes),
                        "train_nodes": list(m.train_nodes),
                        "slowdown": g.slowdowns()[m.job.name],
                        "slo": m.job.slo,
                    }
                    for m in g.members
                ],
            }
            for g in cluster.groups.values()
        ],
    }


@app.command()
@friendly_errors
def generate(
    out_file: Annotated[Path, typer.Argument(help="JSONL trace to write (rollmux simulate reads it)")],
    jobs: Annotated[int, typer.Option(min=1, max=100_000, help="Number of jobs")] = 300,
    mix: Annotated[str, typer.Option(help="production, training-heavy or rollout-heavy")] = "production",
    arrivals: Annotated[str, typer.Option(help="uniform or bursty")] = "bursty",
    seed: Annotated[int, typer.Option(help="Seed: the same seed gives the same trace")] = 0,
    median_hours: Annotated[
        float, typer.Option(min=0.1, max=10_000.0, help="Median run time of a job (48: the long-lived mix)")
    ] = 12.0,
) -> None:
    """Write a seeded synthetic trace (see rollmux.sim.generate for the mixes and arrivals)."""
    from rollmux.sim.generate import TraceShape, write_jsonl
    from rollmux.sim.generate import generate as make_trace

    trace = make_trace(TraceShape(jobs=jobs, mix=mix, arrivals=arrivals, seed=seed, median_hours=median_hours))
    write_jsonl(trace, out_file)
    out.print(f"{out_file}: {len(trace.jobs)} jobs over {trace.end / 86400:.1f} days ({mix}, {arrivals}, seed {seed})")


@app.command()
@friendly_errors
def run(
    example: Annotated[Path, typer.Argument(help="YAML file with the cluster and the jobs (see examples/run.yaml)")],
    out_dir: Annotated[
        Path, typer.Option("--out", help="Folder for run.json, timeline.json, gantt.png, rewards.png and the state")
    ] = Path("out/run"),
    fresh: Annotated[bool, typer.Option("--fresh", help="Forget an earlier run of this folder and start over")] = False,
    url: Annotated[
        str | None, typer.Option("--url", help="Submit to this running control plane instead of embedding one")
    ] = None,
    token: Annotated[str | None, typer.Option("--token", help="Its bearer token (default $ROLLMUX_TOKEN)")] = None,
    import_check: ImportCheck = True,
) -> None:
    """Run real jobs multiplexed on shared rollout and training workers on Ray.

    The jobs go to one control plane: the one at --url, the one the Ray cluster already
    has, or one embedded here with its state in the output folder. An embedded one stays
    up until the jobs other runs gave it ended too; a run whose control plane went takes
    it over. Jobs checkpoint after every iteration; running the same file again resumes
    them (or reports them done).

    Takes a run file (the cluster, the policy and the jobs); `rollmux submit` takes a job
    spec or a plan, and submits a run file's jobs to a running control plane. Each
    `entrypoint:` is checked before any job starts: its module must be importable from the
    directory the run starts in or the Python path."""
    from rollmux.cli.run import execute
    from rollmux.inputs.entrypoints import check_entrypoints
    from rollmux.inputs.runfile import load_run_file
    from rollmux.live.launch import Target

    plan = load_run_file(example)
    if import_check:
        check_entrypoints(example, plan.plan())
    target = Target(url, token or os.environ.get("ROLLMUX_TOKEN")) if url else None
    try:
        result = execute(plan, out_dir, out, fresh, target)
    except KeyboardInterrupt:
        err.print("interrupted: run the same command again to resume from the jobs' checkpoints")
        raise typer.Exit(code=130) from None
    out.print()
    for name, error in result.errors.items():
        err.print(f"[bold red]job {escape(name)} failed:[/] {escape(error)}", soft_wrap=True)
    out.print(
        f"control plane: {result.url}; timeline: {out_dir / 'timeline.json'} (open in ui.perfetto.dev), "
        f"gantt: {out_dir / 'gantt.png'}, rewards: {out_dir / 'rewards.png'}",
        highlight=False,
    )
    if result.stopped_with:
        others = escape(", ".join(result.stopped_with))
        err.print(
            f"interrupted: the control plane stopped while it held other runs' jobs ({others}); each of those "
            "runs takes it over by itself and resumes them from their checkpoints",
            soft_wrap=True,
        )
        raise typer.Exit(code=130)
    if result.errors:
        raise typer.Exit(code=1)


@app.command()
@friendly_errors
def replay(
    trace: Annotated[Path, typer.Argument(help="Production trace, or RollMux .jsonl/.csv job trace")],
    time_scale: Annotated[float, typer.Option(min=1.0, help="Trace seconds per wall second (K)")],
    profile: Annotated[Path | None, typer.Option(help="Phase-time profile (needed for a production trace)")] = None,
    slo_uniform: Annotated[tuple[float, float], typer.Option(help="Draw each job's SLO from U(LOW, HIGH)")] = (
        1.2,
        1.5,
    ),
    seed: Annotated[int, typer.Option(help="Seed of SLO draws")] = 0,
    planning: Annotated[
        Planning, typer.Option(help="Plan with the mean, a quantile or the worst case")
    ] = DEFAULT_PLANNING,
    regroup: Annotated[
        bool, typer.Option("--regroup/--no-regroup", help="Let RollMux migrate running jobs when it pays")
    ] = True,
    slo_guard: Annotated[
        bool,
        typer.Option(
            "--slo-guard/--no-slo-guard",
            help="Run the live SLO guard too (off: emulated jobs run their trace times exactly, and the "
            "simulator has no guard to compare with)",
        ),
    ] = False,
    hours: Annotated[
        tuple[float, float] | None, typer.Option("--window", help="Replay only hours START to END of the trace")
    ] = None,
    mib_per_gb: Annotated[
        float, typer.Option(min=0.0001, max=64, help="MiB of real tensors per GB of a role's resident memory")
    ] = 1.0,
    json_out: Annotated[Path | None, typer.Option("--json", help="Write realised and simulated figures here")] = None,
    out_dir: Annotated[Path, typer.Option("--out", help="Folder for the state and timeline.json")] = Path("out/replay"),
    kill_every: Annotated[
        float | None,
        typer.Option(min=0.5, max=86400, help="SIGKILL a random node's worker every S wall seconds (seeded by --seed)"),
    ] = None,
    standby: Annotated[int, typer.Option(min=0, max=64, help="Standby workers kept per pool for dead nodes")] = 0,
) -> None:
    """Replay a trace on the live system (control plane, local Ray, one emulated job per
    trace job) in time divided by K, next to the simulator's run of the same trace."""
    from rollmux.cli.replay import execute, sole_writer, write
    from rollmux.live.replay import ReplayOptions, window

    loaded = _load_trace(trace, profile, slo_uniform, seed)
    if hours is not None:
        if not 0 <= hours[0] < hours[1]:
            raise ValueError(f"--window: {hours[0]} to {hours[1]} hours is not a window")
        loaded = window(loaded, *hours)
    options = ReplayOptions(time_scale, mib_per_gb, standby_workers=standby, kill_every_s=kill_every, kill_seed=seed)
    with sole_writer(out_dir):
        report = execute(loaded, options, out_dir, out, seed, planning, regroup, slo_guard)
    if json_out:
        write(report, json_out)
        out.print(f"results: {json_out}")
    out.print(f"timeline: {out_dir / 'timeline.json'} (open in ui.perfetto.dev)")


@app.command()
@friendly_errors
def report(
    results: Annotated[
        Path, typer.Argument(help="JSON written by `rollmux simulate --json` or `rollmux replay --json`")
    ],
    out_dir: Annotated[Path, typer.Option("--out", help="Folder for index.html and its pictures")] = Path("out/report"),
) -> None:
    """Render an HTML report (and PNGs) of a simulation's or a replay's results."""
    from rollmux.report.html import render

    out.print(f"report: {render(results, out_dir)}")


ServiceUrl = Annotated[str | None, typer.Option("--url", help="Service URL (default $ROLLMUX_URL or local)")]
Token = Annotated[str | None, typer.Option("--token", help="Bearer token (default $ROLLMUX_TOKEN or the state dir's)")]
StateDir = Annotated[Path | None, typer.Option("--state-dir", help="Where the service keeps its token and database")]
AsJson = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table")]
ImportCheck = Annotated[
    bool,
    typer.Option(
        "--import-check/--no-import-check",
        help="Check here that each entrypoint's module is importable before submitting (off: the job's code is "
        "only where the control plane runs)",
    ),
]


@app.command()
@friendly_errors
def serve(
    host: Annotated[str, typer.Option(help="Address to listen on")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=0, max=65535, help="Port to listen on")] = 8765,
    state_dir: StateDir = None,
    db: Annotated[str | None, typer.Option(help="SQLAlchemy URL (default: SQLite in the state dir)")] = None,
    policy: Annotated[str, typer.Option(help="Placement policy")] = "rollmux",
    ray_enabled: Annotated[
        bool, typer.Option("--ray/--no-ray", help="Run jobs on Ray (else only place and grant turns)")
    ] = True,
    ray_address: Annotated[str | None, typer.Option(help="Join this Ray cluster instead of starting one")] = None,
    rollout_nodes: Annotated[int, typer.Option(min=0, help="Rollout nodes a locally started Ray offers")] = 64,
    train_nodes: Annotated[int, typer.Option(min=0, help="Training nodes a locally started Ray offers")] = 64,
    lease_s: Annotated[
        float, typer.Option(min=0.5, max=3600, help="A session not heard from for this long is lost")
    ] = 10.0,
    lost_grace_s: Annotated[
        float | None,
        typer.Option(
            min=1,
            max=7 * 86_400,
            help="A job placed or lost without a session for this long stops holding its nodes: an external "
            "one is unseated until its driver returns, a RollMux one restarted "
            "(default: 6 leases, at least 60 s)",
        ),
    ] = None,
    host_memory_gb: Annotated[float, typer.Option(min=0.001, help="Residency limit per node for roles")] = 8.0,
    rollout_gpus: Annotated[float, typer.Option(min=0, max=64, help="GPUs each rollout worker asks Ray for")] = 0,
    train_gpus: Annotated[float, typer.Option(min=0, max=64, help="GPUs each training worker asks Ray for")] = 0,
    advertise_url: Annotated[
        str | None, typer.Option(help="URL job drivers use to reach this service (default: from host and port)")
    ] = None,
    regroup: Annotated[
        bool, typer.Option("--regroup/--no-regroup", help="Move running jobs when a re-placement pays for its move")
    ] = True,
    migration_pause_s: Annotated[
        float,
        typer.Option(min=0, max=86_400, help="A move's fixed pause, as regrouping prices it (seconds)"),
    ] = 30.0,
    migration_s_per_gb: Annotated[
        float,
        typer.Option(min=0, max=3_600, help="A move's pause per GB of state on its fullest node, as priced"),
    ] = 0.25,
    moves_per_day: MovesPerDay = None,
    move_risk_usd: MoveRisk = MOVE_RISK_USD,
    move_horizon_hours: MoveHorizon = MOVE_HORIZON_S / HOUR,
    move_risk_growth: MoveRiskGrowth = MOVE_RISK_GROWTH,
    move_risk_grace: MoveRiskGrace = MOVE_RISK_GRACE,
    slo_guard: Annotated[
        bool, typer.Option("--slo-guard/--no-slo-guard", help="Move a job out of a group whose real times break an SLO")
    ] = True,
    drivers_per_process: Annotated[
        int, typer.Option(min=1, max=1024, help="Job drivers one driver process runs at once (1: isolated)")
    ] = 1,
    spare_driver_slots: Annotated[
        int, typer.Option(min=0, max=4096, help="Drivers the started driver processes can still take at once")
    ] = 0,
    spare_workers: Annotated[
        int, typer.Option(min=0, max=1024, help="Empty workers kept started per pool for the next nodes")
    ] = 0,
    standby: Annotated[
        int,
        typer.Option(
            min=0, max=64, help="Standby workers per pool, each on a unit jobs are not placed on: replicas, failover"
        ),
    ] = 0,
) -> None:
    """Run the control plane: places jobs, runs their drivers on Ray, grants their phases."""
    from rollmux.core.regroup import RegroupConfig
    from rollmux.core.spec import Pool
    from rollmux.dataplane.warm import WarmOptions
    from rollmux.service.server import DEFAULT_STATE_DIR, ServeOptions, Service

    _policy_names(policy)
    options = ServeOptions(
        host=host,
        port=port,
        state_dir=state_dir or DEFAULT_STATE_DIR,
        db_url=db,
        policy=policy,
        use_ray=ray_enabled,
        ray_address=ray_address,
        rollout_nodes=rollout_nodes,
        train_nodes=train_nodes,
        lease_s=lease_s,
        lost_grace_s=lost_grace_s,
        host_memory_gb=host_memory_gb,
        gpus_per_node={Pool.ROLLOUT: rollout_gpus, Pool.TRAIN: train_gpus},
        advertise_url=advertise_url,
        regroup=RegroupConfig(
            s_per_gb=migration_s_per_gb,
            pause_s=migration_pause_s,
            moves_per_day=moves_per_day,
            move_risk_usd=move_risk_usd,
            horizon_s=move_horizon_hours * HOUR,
            move_risk_growth=move_risk_growth,
            move_risk_grace=move_risk_grace,
        )
        if regroup
        else None,
        slo_guard=slo_guard,
        warm=WarmOptions(drivers_per_process, spare_driver_slots, spare_workers, standby),
        job_code=_job_code() if ray_enabled else None,
    )
    service = Service(options)
    err.print(f"RollMux control plane on {service.url} — token in {options.state_dir / 'token'}", highlight=False)
    service.run()


def _job_code():
    """The job side's code, for a control plane on Ray: the service imports none of it, so
    its entry point hands it in (imported only then: it loads Ray)."""
    from rollmux.sdk.jobcode import JOB_CODE

    return JOB_CODE


def _client(url: str | None, token: str | None, state_dir: Path | None):
    from rollmux.wire.client import Client

    return Client(url, token, state_dir)


@app.command()
@friendly_errors
def submit(
    spec: Annotated[
        Path,
        typer.Argument(
            help="Job spec (YAML or JSON), a plan (a `jobs:` list), or a run file (`policy:`/`cluster:` and `jobs:`)"
        ),
    ],
    url: ServiceUrl = None,
    token: Token = None,
    state_dir: StateDir = None,
    as_json: AsJson = False,
    import_check: ImportCheck = True,
) -> None:
    """Submit a job, or a plan in one transaction; prints where each was placed or why it waits.

    A run file (`rollmux run`'s: it has `policy:` or `cluster:`) has its jobs submitted as
    a plan: the control plane keeps its own policy and cluster, and `rollmux run FILE --url
    URL` would also follow the jobs to their end. Each `entrypoint:` is checked first: its
    module must be importable from here or the Python path."""
    import yaml

    from rollmux.cli.client import emit, jobs_table
    from rollmux.inputs.entrypoints import check_entrypoints
    from rollmux.inputs.errors import InputError
    from rollmux.inputs.runfile import is_run_file, load_run_file

    try:
        data = yaml.safe_load(spec.read_text())
    except FileNotFoundError:
        raise InputError(spec, "file not found") from None
    except (yaml.YAMLError, RecursionError, UnicodeDecodeError):
        data = None  # the control plane says what is wrong with it
    client = _client(url, token, state_dir)
    if is_run_file(data):
        run = load_run_file(spec)
        if import_check:
            check_entrypoints(spec, run.plan())
        answer = client.request("POST", "/v1/plans", json=run.plan())
        err.print(
            f"{escape(str(spec))} is a run file: submitted its {len(run.jobs)} job(s) to {client.url}, which keeps "
            f"its own policy and cluster (the file's are for `rollmux run`); `rollmux run {escape(str(spec))} --url "
            f"{client.url}` follows them to their end",
            highlight=False,
            soft_wrap=True,
        )
    else:
        if import_check:
            check_entrypoints(spec, data)
        answer = client.submit(spec)
    jobs = answer if isinstance(answer, list) else [answer]
    emit(out, answer, as_json, jobs_table(jobs))


@app.command()
@friendly_errors
def status(
    name: Annotated[str | None, typer.Argument(help="One job (default: all)")] = None,
    url: ServiceUrl = None,
    token: Token = None,
    state_dir: StateDir = None,
    as_json: AsJson = False,
) -> None:
    """Show jobs: state, group, nodes, slowdown, iterations, cost so far."""
    from rollmux.cli.client import emit, jobs_table

    client = _client(url, token, state_dir)
    jobs = [client.request("GET", f"/v1/jobs/{name}")] if name else client.jobs()
    emit(out, jobs[0] if name and as_json else jobs, as_json, jobs_table(jobs))


@app.command()
@friendly_errors
def cancel(
    name: Annotated[str, typer.Argument(help="The job to cancel")],
    url: ServiceUrl = None,
    token: Token = None,
    state_dir: StateDir = None,
    as_json: AsJson = False,
) -> None:
    """Cancel a running job; its group is re-evaluated and unused nodes released."""
    from rollmux.cli.client import emit, jobs_table

    job = _client(url, token, state_dir).request("DELETE", f"/v1/jobs/{name}")
    emit(out, job, as_json, jobs_table([job]))


@app.command()
@friendly_errors
def groups(url: ServiceUrl = None, token: Token = None, state_dir: StateDir = None, as_json: AsJson = False) -> None:
    """Show the co-execution groups, their nodes, cycle times and slowdowns."""
    from rollmux.cli.client import emit
    from rollmux.cli.client import groups_table as service_groups_table

    found = _client(url, token, state_dir).request("GET", "/v1/groups")
    emit(out, found, as_json, service_groups_table(found))


if __name__ == "__main__":
    app()
