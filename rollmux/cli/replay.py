"""``rollmux replay``: a trace on the live system, next to the simulator's run of it."""

from __future__ import annotations

import fcntl
import json
import math
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from rollmux.core.control import Capacity
from rollmux.core.errors import RollMuxError
from rollmux.core.placement import make_policy
from rollmux.core.regroup import RegroupConfig
from rollmux.core.spec import HOUR, CostModel, Planning, Pool
from rollmux.dataplane.connect import start_ray
from rollmux.dataplane.warm import WarmOptions
from rollmux.inputs.trace import Trace
from rollmux.live import replay
from rollmux.live.launch import phase_records
from rollmux.report.html import replay_cost_plot
from rollmux.report.timeline import chrome_trace
from rollmux.sdk.jobcode import JOB_CODE
from rollmux.service.control import ControlOptions
from rollmux.service.server import ServeOptions, Service
from rollmux.sim.compare import compare
from rollmux.sim.control_host import HostCosts, simulate_control
from rollmux.sim.decisions import decisions, divergence
from rollmux.sim.periods import judge_periods
from rollmux.wire.client import Client

HEADROOM = 1.2
"""Nodes the local Ray offers over the simulator's peak: the live system must never be the
one that waits for capacity the simulation had. A live move holds its jobs' old nodes until
each one's state has left them (the simulator moves at once), so a plan moving many jobs
briefly needs more than the peak; one that does not fit waits for nodes to be given back
(more headroom means more idle worker processes, whose CPU the phases then lack)."""
MAX_WARM_WORKERS = 24
"""Spare workers kept per pool at most: each is a process with torch loaded (about 250 MB)."""
MAX_WARM_DRIVERS = 64
"""Drivers of emulated jobs in one process at most (threads that mostly wait on HTTP)."""
START_S, WORKER_START_S = 60.0, 6.0
"""The embedded control plane's start is awaited this long plus this long per warm worker
(46 took 2-3 minutes on two cores)."""
COMPARED = ("cost_usd", "cost_usd_per_hour", "cost_node_hours", "slo_attainment", "mean_slowdown", "p99_slowdown")


class OutputBusy(RollMuxError):
    """Another replay is writing to the same output folder."""


@contextmanager
def sole_writer(out: Path) -> Iterator[None]:
    """One replay per output folder, held until it ends: a second one would delete the
    first one's control-plane state under it and mix their results."""
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "replay.lock", "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "a process"
            raise OutputBusy(f"{out}: another replay ({holder}) is writing here; pass another --out") from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"pid {os.getpid()}")
        handle.flush()
        yield


def execute(
    trace: Trace,
    options: replay.ReplayOptions,
    out: Path,
    console: Console,
    seed: int,
    planning: Planning,
    regroup: bool,
    slo_guard: bool = False,
) -> dict[str, Any]:
    """Simulate the trace, replay it live, and write both side by side (hold the output
    folder first: :func:`sole_writer`)."""
    simulated = compare(trace, ["rollmux"], seed=seed, planning=planning, regroup=RegroupConfig() if regroup else None)
    sim = simulated.results["rollmux"]
    summary = sim.summary()
    options = warm_for_peak(options, summary, len(trace.jobs))
    rollout = math.ceil(summary["rollout_peak_nodes"] * HEADROOM) + 1
    train = math.ceil(summary["train_peak_nodes"] * HEADROOM) + 1
    warm = options.spare_workers + options.standby_workers
    start_ray(rollout_nodes=rollout + warm, train_nodes=train + warm)
    usable_gb = max(CostModel().usable_dram_gb(pool) for pool in Pool)
    shutil.rmtree(out / "state", ignore_errors=True)  # a replay starts from an empty control plane
    service = Service(
        ServeOptions(
            port=0,
            state_dir=out / "state",
            policy="rollmux",
            host_memory_gb=usable_gb * options.mib_per_gb / 1024,
            rollout_nodes=rollout,
            train_nodes=train,
            regroup=scaled_regroup(options.time_scale) if regroup else None,
            slo_guard=slo_guard,
            warm=WarmOptions(
                drivers_per_process=options.drivers_per_process,
                spare_driver_slots=options.drivers_per_process // 4,
                spare_workers=options.spare_workers,
                standby_workers=options.standby_workers,
            ),
            job_code=JOB_CODE,
        )
    ).start(timeout_s=START_S + WORKER_START_S * 2 * warm)
    try:
        client = Client(service.url, service.token)
        hours = trace.end / HOUR
        with Progress(
            TextColumn("replay"), BarColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), console=console
        ) as progress:
            task = progress.add_task("", total=hours)

            def show(trace_s: float, cluster: dict[str, Any]) -> None:
                jobs = cluster["jobs"]
                progress.update(
                    task,
                    completed=trace_s / HOUR,
                    description=f"{trace_s / 3600:,.1f}/{hours:,.1f} h, {jobs['running']} running, "
                    f"{cluster['queued']} queued, nodes {cluster['nodes']['rollout']}+{cluster['nodes']['train']}, "
                    f"${cluster['cost_usd_per_hour']:,.0f}/h",
                )

            log = replay.run(client, trace, options, on_progress=show)
            progress.update(task, completed=hours)
    finally:
        service.stop()
    realised = replay.realised(trace, log, options)
    control_regroup = scaled_regroup(options.time_scale) if regroup else None
    report = {
        "time_scale": options.time_scale,
        "mib_per_gb": options.mib_per_gb,
        "wall_s": log.ended - log.began,
        "jobs": len(trace.jobs),
        "trace_hours": hours,
        "realised": realised,
        "simulated": {**summary, "cost_rate": sim.cost_rate},
        "agreement": {
            f"{key}_realised_over_simulated": realised[key] / summary[key] if summary[key] else None for key in COMPARED
        },
        "overlaps": replay.overlaps(log.phase_log),
        "capacity": {"rollout": rollout, "train": train},
        "live_capacity": log.capacity,
        "decisions": compare_decisions(trace, log, options, control_regroup, slo_guard, live_capacity(log)),
    }
    records = phase_records(log.phase_log)
    if records:
        chrome_trace(records, out / "timeline.json")
    replay_cost_plot(report, out / "cost-rate.png")
    console.print(agreement_table(report))
    console.print(decisions_line(report["decisions"]))
    return report


def live_capacity(log: replay.ReplayLog) -> Capacity:
    """The capacity the live control plane had (Ray's units, spare workers' included), so
    that the virtual clock waits for room exactly where the live plane did."""
    return Capacity(rollout=log.capacity.get(Pool.ROLLOUT.value), train=log.capacity.get(Pool.TRAIN.value))


def warm_for_peak(options: replay.ReplayOptions, summary: dict[str, Any], jobs: int) -> replay.ReplayOptions:
    """Keep as many spare workers per pool as the simulation's peak holds nodes (at most
    ``MAX_WARM_WORKERS``), and room for every job's driver in the first driver process (at
    most ``MAX_WARM_DRIVERS``), started before the replay's clock. A window of a trace
    opens with the jobs running then submitted at once; their nodes and drivers were up in
    the trace. Started on demand, 40 worker processes took 60-90 s of the window's 109 on
    two cores while the running jobs' phases stalled, and jobs past the first process's 32
    drivers waited 50-70 s for a second one."""
    peak = math.ceil(max(summary["rollout_peak_nodes"], summary["train_peak_nodes"]))
    return replace(
        options,
        spare_workers=max(options.spare_workers, min(peak, MAX_WARM_WORKERS)),
        drivers_per_process=max(options.drivers_per_process, min(jobs, MAX_WARM_DRIVERS)),
    )


def scaled_regroup(time_scale: float) -> RegroupConfig:
    """The simulator's regrouping with its times divided by the time scale: the live
    control plane, whose phases are ``time_scale`` times shorter, decides the same moves.
    A move's risk price is scaled too: the savings it must repay accrue over a horizon
    ``time_scale`` times shorter (unscaled, no live move would repay it)."""
    default = RegroupConfig()
    return replace(
        default,
        s_per_gb=default.s_per_gb / time_scale,
        pause_s=default.pause_s / time_scale,
        horizon_s=default.horizon_s / time_scale,
        min_repay_s=default.min_repay_s / time_scale,
        move_risk_usd=default.move_risk_usd / time_scale,
    )


def compare_decisions(
    trace: Trace,
    log: replay.ReplayLog,
    options: replay.ReplayOptions,
    regroup: RegroupConfig | None,
    slo_guard: bool,
    capacity: Capacity,
) -> dict[str, Any]:
    """The live plane's placements and moves next to the virtual-clock host's, replaying
    the same submissions with the phase, start-up and transfer times the live run measured
    (:func:`replay.as_recorded`), each regrouping round planning and readying its nodes as
    long as the live round of its number (beyond them, the live rounds' mean planning
    time), in the live plane's own units, settings and capacity; with the
    virtual clock's cost (in trace time) and SLO attainment, what the live run is judged by."""
    live_options = ControlOptions()
    recorded_trace, recorded = replay.as_recorded(trace, log, options)
    run = simulate_control(
        recorded_trace,
        make_policy(live_options.policy),
        live_options.cost,
        live_options.planning,
        regroup,
        HostCosts(job_start_s=0.0, node_ready_s=0.0, settle_s=live_options.regroup_settle_s, plan_s=log.plan_s),
        slo_guard=slo_guard,
        recorded=recorded,
        capacity=capacity,
    )
    order = {job.spec.name: index for index, job in enumerate(recorded_trace.jobs)}
    live, control = replay.live_decisions(log, order), decisions(run.decision_events, order)
    # Its clock runs in the live plane's seconds: node-seconds, and so dollars, times the scale.
    # Its SLO is judged by the live run's rule, steady segment by segment; its own
    # lifetime figure would count every window's start, where all its jobs arrive at once.
    periods = judge_periods(recorded_trace.jobs, run.train_ends, run.turn_changes)
    outcome = {
        "cost_usd": run.result.cost_usd * options.time_scale,
        "slo_attainment": periods.attainment,
        "period_slo_attainment": periods.period_attainment,
        "lifetime_slo_attainment": run.result.slo_attainment,
        "slowdowns": periods.slowdowns,
        "plan_s": log.plan_s,
        "plans_waiting_for_room": run.plans_waiting,
        "live_rounds": log.rounds,
    }
    return {**divergence(live, control), "virtual_clock": outcome}


def agreement_table(report: dict[str, Any]) -> Table:
    title = f"replay of {report['jobs']} jobs, {report['trace_hours']:,.1f} h at 1/{report['time_scale']:g}"
    table = Table(title=title)
    for column in ("figure", "realised", "simulated", "realised / simulated"):
        table.add_column(column, justify="left" if column == "figure" else "right")
    for key in COMPARED:
        real, sim = report["realised"][key], report["simulated"][key]
        table.add_row(key, f"{real:,.3f}", f"{sim:,.3f}", f"{real / sim:.3f}" if sim else "-")
    table.add_row("overlaps", str(len(report["overlaps"])), "0", "")
    clock = report["decisions"]["virtual_clock"]
    real = report["realised"]
    table.add_row(
        "cost_usd, virtual clock", "", f"{clock['cost_usd']:,.3f}", f"{real['cost_usd'] / clock['cost_usd']:.3f}"
    )
    for key in ("slo_attainment", "period_slo_attainment"):
        table.add_row(
            f"{key}, virtual clock",
            f"{real[key]:.3f}",
            f"{clock[key]:.3f}",
            f"{real[key] / clock[key]:.3f}" if clock[key] else "-",
        )
    realised = report["realised"]
    if realised["kills"]:
        table.add_row(
            "workers killed / jobs interrupted", f"{realised['kills']} / {len(realised['recoveries'])}", "", ""
        )
        for label, key in (("recovery s (mean, max)", "recovery_s"), ("kill to work s", "recovery_downtime_s")):
            mean, worst = realised[f"{key}_mean"], realised[f"{key}_max"]
            table.add_row(label, "-" if mean is None else f"{mean:.3f}, {worst:.3f}", "", "")
        table.add_row("steps lost", str(realised["recovery_steps_lost"]), "", "")
    return table


def decisions_line(agreed: dict[str, Any]) -> str:
    """The live plane's placements and moves against the virtual clock's, in one line."""
    counts = ", ".join(f"{n} {kind}" for kind, n in agreed["live_by_kind"].items())
    head = f"decisions: live {agreed['live']} ({counts}), virtual clock {agreed['control']}"
    first = agreed["first_divergence"]
    if first is None:
        return f"{head}: the same sequence"
    return f"{head}: they part at #{first['index']}: live {first['live']}, virtual clock {first['control']}"


def write(report: dict[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=1))
