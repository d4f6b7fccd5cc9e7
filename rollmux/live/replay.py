"""Replay a trace on the live system: the one control plane, a local Ray cluster, and one
emulated job per trace job, in time divided by ``time_scale``.

Each trace job is submitted at its (scaled) arrival as an emulated job (phases that wait
their scaled phase time from grant to release, roles holding real tensors of the job's
resident memory scaled down) and cancelled at its departure. What the live system did is
read back from the control plane — the node log (cost), the phase log (iteration periods,
overlaps), the job events — and measured in trace time, so it can stand next to the
simulator's run of the same trace.

With ``kill_every_s``, a seeded random node's worker process is SIGKILLed on that schedule
(wall seconds) while the trace runs; every kill's recovery — each job it interrupted, its
downtime and the iterations it had to train again — is read back from the same logs.
"""

from __future__ import annotations

import itertools
import os
import random
import re
import signal
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import psutil

from rollmux.core.spec import HOUR, CostModel, PhaseTime, Pool
from rollmux.inputs.runfile import JobSubmission
from rollmux.inputs.trace import Trace, TraceJob
from rollmux.sim.control_host import Recorded
from rollmux.sim.decisions import Decision, decisions
from rollmux.sim.periods import CHANGES, PeriodJudgement, judge_periods
from rollmux.wire.client import Client, ServiceError

EMULATED = "rollmux.jobs.emulated:EmulatedJob.from_context"
DRIVER_PID = re.compile(r"\bpid (\d+) on (\S+)")


@dataclass(frozen=True)
class ReplayOptions:
    time_scale: float
    mib_per_gb: float = 1.0
    """Each role holds this many MiB of real tensors per GB of the job's resident memory."""
    max_restarts: int = 3
    drivers_per_process: int = 32
    """Emulated jobs need no isolation from each other: many drivers share a warm process,
    so a job starts without a process start (seconds of CPU, a long while of trace time)."""
    spare_workers: int = 8
    """Empty workers kept per pool, so readying a node does not start a process either."""
    standby_workers: int = 0
    """Standby workers kept per pool for nodes whose worker dies (see ``kill_every_s``)."""
    kill_every_s: float | None = None
    """SIGKILL a random node's worker every this many wall seconds (None: never)."""
    kill_seed: int = 0


def window(trace: Trace, start_h: float, end_h: float) -> Trace:
    """The jobs alive in [start_h, end_h) hours, clipped to it, in time from its start."""
    start, end = start_h * HOUR, end_h * HOUR
    jobs = tuple(
        TraceJob(job.spec, max(job.arrival, start) - start, min(job.departure, end) - start)
        for job in trace.jobs
        if job.arrival < end and job.departure > start
    )
    return Trace(jobs, trace.start)


def scaled(phase: PhaseTime, scale: float) -> PhaseTime:
    return PhaseTime(phase.mean / scale, None if phase.high is None else phase.high / scale, phase.high_quantile)


def submission(trace_job: TraceJob, options: ReplayOptions) -> dict[str, Any]:
    """The trace job as an emulated job for the control plane, its times scaled, saying the
    iterations its trace life holds (``TraceJob.submitted``), as the virtual-clock host
    submits it: its departure cancels it should it still run then."""
    job, k = trace_job.spec, options.time_scale
    rollout, train = scaled(job.rollout, k), scaled(job.train, k)
    spec: dict[str, Any] = {
        "name": job.name,
        "rollout_s": rollout.mean,
        "train_s": train.mean,
        "rollout_p99_s": rollout.high,
        "train_p99_s": train.high,
        "rollout_width": job.rollout_width,
        "train_width": job.train_width,
        "rollout_mem_gb": job.rollout_mem_gb,
        "train_mem_gb": job.train_mem_gb,
        "slo": job.slo,
        "entrypoint": EMULATED,
        "iterations": trace_job.submitted.iterations,
        "max_restarts": options.max_restarts,
        "args": {
            "rollout_s": rollout.mean,
            "train_s": train.mean,
            "rollout_mib": job.rollout_mem_gb * options.mib_per_gb,
            "train_mib": job.train_mem_gb * options.mib_per_gb,
        },
    }
    if job.colocated is not None:
        spec["colo_rollout_s"] = spec["args"]["colo_rollout_s"] = job.colocated[0].mean / k
        spec["colo_train_s"] = spec["args"]["colo_train_s"] = job.colocated[1].mean / k
    return spec


@dataclass
class ReplayLog:
    """What the control plane recorded, with the wall time the replay started."""

    began: float
    ended: float
    node_log: list[dict[str, Any]] = field(default_factory=list)
    phase_log: list[dict[str, Any]] = field(default_factory=list)
    events: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    views: dict[str, dict[str, Any]] = field(default_factory=dict)
    moves: list[dict[str, Any]] = field(default_factory=list)
    cpu_s: float = 0.0
    """CPU time the live system used while the trace ran: this process (the control plane)
    and every process it started (Ray, its workers and drivers) that was still alive."""
    kills: list[Kill] = field(default_factory=list)
    regrouping: dict[str, Any] = field(default_factory=dict)
    """The control plane's regrouping figures at the end."""
    rounds: list[dict[str, Any]] = field(default_factory=list)
    """Each regrouping round's planning and readying seconds (``/v1/regrouping/rounds``)."""
    capacity: dict[str, int | None] = field(default_factory=dict)
    """The nodes per pool the control plane offered jobs: what Ray offers, its spare
    workers' units included, less those its standby workers keep (``/v1/cluster``)."""

    @property
    def plan_s(self) -> float:
        """The mean wall seconds a regrouping round took to plan (0 without a round)."""
        return statistics.fmean(r["plan_s"] for r in self.rounds) if self.rounds else 0.0


@dataclass(frozen=True)
class Kill:
    """One injected failure: the node whose worker process was SIGKILLed, when (wall time),
    and the jobs of its group then."""

    at: float
    node: int
    pool: str
    pid: int
    jobs: tuple[str, ...]


class Killer:
    """Kills a seeded random node's worker on a schedule, from a thread of the replay."""

    def __init__(self, client: Client, every_s: float, seed: int):
        self.client, self.every_s, self.rng = client, every_s, random.Random(seed)
        self.kills: list[Kill] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="killer", daemon=True)

    def __enter__(self) -> Killer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s):
            kill = self.kill_one()
            if kill is not None:
                self.kills.append(kill)

    def kill_one(self) -> Kill | None:
        """SIGKILL the worker process of a random held node (None: no node is held)."""
        import ray

        from rollmux.dataplane.nodes import worker_of

        nodes = self.client.request("GET", "/v1/nodes")
        if not nodes:
            return None
        node = self.rng.choice(nodes)
        groups = {g["id"]: g for g in self.client.request("GET", "/v1/groups")}
        jobs = tuple(j["name"] for j in groups.get(node["group_id"], {"jobs": []})["jobs"])
        try:
            pid = ray.get(worker_of(node["id"]).where.remote(), timeout=10)["pid"]
            os.kill(pid, signal.SIGKILL)
        except (ValueError, ProcessLookupError, ray.exceptions.RayError):
            return None  # released, or dead already, meanwhile
        return Kill(time.time(), node["id"], node["pool"], pid, jobs)


def system_cpu_s() -> float:
    """CPU seconds used so far by this process and its descendants (the local Ray's)."""
    total = 0.0
    for process in [psutil.Process(), *psutil.Process().children(recursive=True)]:
        try:
            times = process.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system
    return total


def run(
    client: Client,
    trace: Trace,
    options: ReplayOptions,
    on_progress: Callable[[float, dict[str, Any]], None] | None = None,
    tick_s: float = 1.0,
) -> ReplayLog:
    """Submit each job at its scaled arrival, cancel it at its departure, then read back.
    Jobs that arrive at one instant (a window's running jobs at its start) are submitted as
    one plan: placed at one instant, as the virtual clock that replays them places them."""
    happenings = sorted(
        [(job.arrival, 1, job) for job in trace.jobs] + [(job.departure, 0, job) for job in trace.jobs],
        key=lambda e: (e[0], e[1]),
    )
    began, cpu = time.time(), system_cpu_s()
    shown = 0.0
    killer = Killer(client, options.kill_every_s, options.kill_seed) if options.kill_every_s else None
    with killer or _nothing():
        for (at, arriving), together in itertools.groupby(happenings, key=lambda e: (e[0], e[1])):
            jobs = [job for *_, job in together]
            due = began + at / options.time_scale
            while (pause := due - time.time()) > 0:
                time.sleep(min(pause, tick_s))
                if on_progress and time.time() - shown >= tick_s:
                    shown = time.time()
                    on_progress((shown - began) * options.time_scale, client.request("GET", "/v1/cluster"))
            if not arriving:
                for job in jobs:
                    _depart(client, job.spec.name)
            elif len(jobs) == 1:
                client.request("POST", "/v1/jobs", json=submission(jobs[0], options))
            else:
                client.request("POST", "/v1/plans", json={"jobs": [submission(job, options) for job in jobs]})
    log = ReplayLog(began, time.time(), cpu_s=system_cpu_s() - cpu, kills=killer.kills if killer else [])
    names = [job.spec.name for job in trace.jobs]
    log.node_log = _pages(client, "/v1/nodes/log")
    log.moves = _pages(client, "/v1/moves")
    log.phase_log = client.phase_log()
    log.events = {name: client.request("GET", f"/v1/jobs/{name}/events") for name in names}
    log.views = {name: client.request("GET", f"/v1/jobs/{name}") for name in names}
    cluster = client.request("GET", "/v1/cluster")
    log.regrouping, log.capacity = cluster["regrouping"], cluster["capacity"]
    log.rounds = _pages(client, "/v1/regrouping/rounds")
    return log


def as_recorded(trace: Trace, log: ReplayLog, options: ReplayOptions) -> tuple[Trace, Recorded]:
    """The live run as the virtual-clock host replays it to compare their decisions, in the
    live plane's own units (wall seconds from the replay's start, each job as submitted):
    each job arrives when it was submitted and leaves when it ended, and its phases, first
    session, moves and the regrouping rounds take the times the live run measured."""
    jobs, running_at = [], {}
    for trace_job in trace.jobs:
        name = trace_job.spec.name
        events = log.events.get(name, [])
        submitted = next((e["at"] for e in events if e["kind"] == "submitted"), None)
        if submitted is None:
            continue
        ended = next((e["at"] for e in events if e["kind"] in ("done", "failed", "cancelled")), log.ended)
        running = next((e["at"] for e in events if e["kind"] == "running"), None)
        if running is not None:
            running_at[name] = running - log.began
        spec = JobSubmission.model_validate(submission(trace_job, options)).spec()
        jobs.append(TraceJob(spec, submitted - log.began, ended - log.began))
    phases = {
        (e["job"], e["phase"], e["iteration"]): e["ended_at"] - e["granted_at"]
        for e in log.phase_log
        if e["outcome"] == "released"
    }
    transfers: dict[str, tuple[float, ...]] = {}
    for move in sorted(log.moves, key=lambda m: m["decided_at"]):
        transfers[move["job"]] = (*transfers.get(move["job"], ()), move["pause_s"])
    rounds = {r["id"]: (r["plan_s"], r["ready_s"]) for r in log.rounds}
    ordered = tuple(sorted(jobs, key=lambda j: j.arrival))
    return Trace(ordered), Recorded(phases, running_at, transfers, rounds)


def live_decisions(log: ReplayLog, order: dict[str, int]) -> list[Decision]:
    """The live plane's placements, re-seats and moves, from its job events."""
    events = [{**e, "job": name} for name, found in log.events.items() for e in found]
    return decisions(events, order)


@contextmanager
def _nothing() -> Iterator[None]:
    yield


def _depart(client: Client, name: str) -> None:
    """Cancel the job at its departure; one that already ended (it failed) stays as it ended:
    its state and cause are in the report."""
    try:
        client.request("DELETE", f"/v1/jobs/{name}")
    except ServiceError as error:
        if error.status != 409:
            raise


def _pages(client: Client, path: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    while page := client.request("GET", path, params={"after": found[-1]["id"] if found else -1, "limit": 10_000}):
        found += page
    return found


def realised(trace: Trace, log: ReplayLog, options: ReplayOptions, cost: CostModel | None = None) -> dict[str, Any]:
    """The live run's figures in trace time, in the simulator's terms."""
    cost = cost or CostModel()
    k = options.time_scale
    held = _node_seconds(log, k)
    cost_usd = sum(seconds / HOUR * cost.price(pool) for (_, pool), seconds in held.items())
    judgement = _slowdowns(trace, log, k)
    slowdowns, values = judgement.slowdowns, sorted(judgement.slowdowns.values())
    span_h = (log.ended - log.began) * k / HOUR
    return {
        "cost_usd": cost_usd,
        "cost_usd_per_hour": cost_usd / span_h if span_h else 0.0,
        "cost_node_hours": sum(held.values()) / HOUR,
        **{f"{pool.value}_node_hours": sum(s for (_, p), s in held.items() if p is pool) / HOUR for pool in Pool},
        "slo_attainment": judgement.attainment,
        "period_slo_attainment": judgement.period_attainment,
        "judged_job_hours": judgement.judged_s / HOUR,
        "mean_slowdown": statistics.fmean(values) if values else float("nan"),
        "p99_slowdown": values[min(len(values) - 1, int(0.99 * len(values)))] if values else float("nan"),
        "max_slowdown": values[-1] if values else float("nan"),
        "slowdowns": slowdowns,
        "restarts": sum(v["restarts"] for v in log.views.values()),
        "phases": len(log.phase_log),
        "driver_processes": len(_driver_pids(log)),
        "live_cpu_s": log.cpu_s,
        "cpu_ms_per_phase": 1000 * log.cpu_s / len(log.phase_log) if log.phase_log else float("nan"),
        "cost_rate": _cost_rate(log, k, cost),
        **_migrations(log, k),
        **_recoveries(log, k),
    }


def _recoveries(log: ReplayLog, k: float) -> dict[str, Any]:
    """Every injected kill and, for each job of the node's group that it interrupted (the
    job lost its session after the kill, before the next one): when it noticed (a job
    learns it when it next uses the node: ``detected_s`` after the kill), how long it then
    took to work again (``recovery_s``, to its first phase granted after it resumed), the
    whole ``downtime_s`` from the kill (wall and trace seconds, an upper bound: the job may
    have gone on working elsewhere before it noticed), the iteration it resumed from and
    the iterations it had trained before it noticed and lost."""
    found = []
    for index, kill in enumerate(log.kills):
        until = log.kills[index + 1].at if index + 1 < len(log.kills) else log.ended
        for job in kill.jobs:
            recovery = _recovery(log, job, kill.at, until, k)
            if recovery is not None:
                found.append(
                    {"node": kill.node, "pool": kill.pool, "at_h": (kill.at - log.began) * k / HOUR, **recovery}
                )
    recoveries = [r["recovery_s"] for r in found if r["recovery_s"] is not None]
    downtimes = [r["downtime_s"] for r in found if r["downtime_s"] is not None]
    return {
        "kills": len(log.kills),
        "recoveries": found,
        "recovery_s_mean": statistics.fmean(recoveries) if recoveries else None,
        "recovery_s_max": max(recoveries, default=None),
        "recovery_downtime_s_mean": statistics.fmean(downtimes) if downtimes else None,
        "recovery_downtime_s_max": max(downtimes, default=None),
        "recovery_steps_lost": sum(r["steps_lost"] for r in found),
    }


def _recovery(log: ReplayLog, job: str, killed: float, until: float, k: float) -> dict[str, Any] | None:
    events = log.events.get(job, [])
    lost = next((e for e in events if e["kind"] == "lost" and killed <= e["at"] < until), None)
    if lost is None:
        return None  # the kill did not interrupt it (it had left, or never touched the node again)
    resumed = next((e for e in events if e["kind"] == "running" and e["at"] >= lost["at"]), None)
    phases = [e for e in log.phase_log if e["job"] == job]
    trained = [e for e in phases if e["phase"] == "train" and e["outcome"] == "released"]
    done_before = len({e["iteration"] for e in trained if e["ended_at"] <= lost["at"]})  # it may go on a while
    match = re.search(r"from iteration (\d+)", resumed["detail"]) if resumed else None
    back = min((e["granted_at"] for e in phases if resumed and e["granted_at"] >= resumed["at"]), default=None)
    return {
        "job": job,
        "resumed_from": int(match.group(1)) if match else None,
        "steps_lost": done_before - int(match.group(1)) if match else done_before,
        "detected_s": lost["at"] - killed,
        "recovery_s": back - lost["at"] if back is not None else None,
        "downtime_s": back - killed if back is not None else None,
        "downtime_trace_s": (back - killed) * k if back is not None else None,
        "how": resumed["detail"] if resumed else "did not resume before it left",
    }


def _driver_pids(log: ReplayLog) -> set[str]:
    """The processes the jobs' drivers ran in (each session names its driver's pid)."""
    return {
        match.group(0)
        for events in log.events.values()
        for event in events
        if event["kind"] == "session" and (match := DRIVER_PID.search(event["detail"]))
    }


def _migrations(log: ReplayLog, k: float) -> dict[str, Any]:
    """Moves of running jobs and the pauses they cost, in trace time (every one listed)."""
    moves = log.moves
    pauses = [m["pause_s"] * k for m in moves if m["outcome"] == "moved"]
    return {
        "migrations": len(pauses),
        "migrations_abandoned": len(moves) - len(pauses),
        "migration_pause_s_total": sum(pauses),
        "migration_pause_s_max": max(pauses, default=0.0),
        "migration_moved_mib": sum(m["moved_bytes"] for m in moves) / 2**20,
        "moves": [
            {
                "job": m["job"],
                "reason": m["reason"],
                "at_h": (m["decided_at"] - log.began) * k / HOUR,
                "pause_s": m["pause_s"] * k,
                "outcome": m["outcome"],
                "moved_bytes": m["moved_bytes"],
            }
            for m in moves
        ],
    }


def overlaps(phase_log: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Instants with two jobs on one node in the phase log (none, if all went well)."""
    by_node: dict[int, list[tuple[float, float, str]]] = {}
    for entry in phase_log:
        for node in entry["nodes"]:
            by_node.setdefault(node, []).append((entry["granted_at"], entry["ended_at"], entry["job"]))
    found = []
    for node, spans in by_node.items():
        spans.sort()
        for (_, end, job), (later, _, other) in zip(spans, spans[1:], strict=False):
            if later < end - 1e-6:
                found.append({"node": node, "jobs": [job, other], "at": later, "seconds": end - later})
    return found


def _node_seconds(log: ReplayLog, k: float) -> dict[tuple[int, Pool], float]:
    """Trace seconds each node was held."""
    taken: dict[int, float] = {}
    held: dict[tuple[int, Pool], float] = {}
    for entry in log.node_log:
        key = (entry["node"], Pool(entry["pool"]))
        if entry["held"]:
            taken[entry["node"]] = entry["at"]
        elif entry["node"] in taken:
            held[key] = held.get(key, 0.0) + (entry["at"] - taken.pop(entry["node"])) * k
    for entry in log.node_log:
        if entry["held"] and entry["node"] in taken:
            key = (entry["node"], Pool(entry["pool"]))
            held[key] = held.get(key, 0.0) + (log.ended - taken.pop(entry["node"])) * k
    return held


def _cost_rate(log: ReplayLog, k: float, cost: CostModel) -> list[tuple[float, float]]:
    """(trace seconds, $/h) at every change of the nodes held, as the simulator records it."""
    rate, points = 0.0, [(0.0, 0.0)]
    for entry in log.node_log:
        price = cost.price(Pool(entry["pool"]))
        rate += price if entry["held"] else -price
        points.append(((entry["at"] - log.began) * k, max(rate, 0.0)))
    points.append(((log.ended - log.began) * k, max(rate, 0.0)))
    return points


def _slowdowns(trace: Trace, log: ReplayLog, k: float) -> PeriodJudgement:
    """Each job's realised periods judged in trace time (:func:`judge_periods`): a job
    joins its group's turns once its roles are loaded, a moment after its arrival."""
    changes = [e["at"] - log.began for events in log.events.values() for e in events if e["kind"] in CHANGES]
    return judge_periods(trace.jobs, _train_ends(log), changes, scale=k)


def _train_ends(log: ReplayLog) -> dict[str, list[float]]:
    """Each job's training releases, in wall seconds from the replay's start."""
    ends: dict[str, list[float]] = {}
    for entry in log.phase_log:
        if entry["phase"] == "train" and entry["outcome"] == "released":
            ends.setdefault(entry["job"], []).append(entry["ended_at"] - log.began)
    return ends
