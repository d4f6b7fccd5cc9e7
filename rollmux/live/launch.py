"""Run a plan of jobs on the one control plane and collect what happened.

``run_plan`` is ``rollmux run`` without the display: it submits the plan to a control
plane (the one given by URL, the one the Ray cluster already has, or one embedded here
with its state in the output folder), waits until every job of the plan ended, and reads
back their metrics and the phase log. Running the same plan again resumes it: the
control plane answers identical resubmissions with the jobs it has, restarts the ones
whose drivers are gone from their checkpoints, and reports the finished ones as done.

Several runs share a Ray cluster's control plane, and it outlives the run that embeds it
as long as any job in it lives: that run waits for the others' jobs before it stops it.
A run that joined one notes in its output folder where the plane keeps its state
(``control-plane.json``); if the plane goes (its run killed or interrupted), the run takes
that state over by embedding a control plane on it, which resumes every job in it from
its checkpoint, and a later run of the same folder finds its jobs there again.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rollmux.core.control import ENDED_STATES, FAILED, LIVE_STATES
from rollmux.core.errors import RollMuxError
from rollmux.core.spec import Pool
from rollmux.core.turns import PhaseRecord
from rollmux.dataplane.connect import start_ray
from rollmux.inputs.runfile import RunFile
from rollmux.service.lock import StoreLocked, sqlite_holder
from rollmux.wire.client import Client, ServiceError

if TYPE_CHECKING:
    from rollmux.service.server import Service

POINTER = "control-plane.json"
"""In a run's output folder: the registry record (less its token) of the control plane
that holds the run's jobs, so that a later run finds them."""
DATABASE = "rollmux.db"
LOOK_AGAIN_S = 1.0
"""Pause between looks for a control plane that is starting or coming back."""
READING_S = 5.0
"""How long an embedded control plane stays up after another run's job ended: that run
sees it end at its next look (every half second) and then reads its results."""
JOINED_RETRY_S = 5.0
"""How long a joined control plane may refuse connections before it is looked for again
(a busy one still accepts them; looking again when it did not go finds it again)."""


@dataclass
class RunResult:
    histories: dict[str, list[dict[str, float]]] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    records: list[PhaseRecord] = field(default_factory=list)
    phase_log: list[dict[str, Any]] = field(default_factory=list)
    views: dict[str, dict[str, Any]] = field(default_factory=dict)
    summary: dict[str, Any] = field(default_factory=dict)
    url: str = ""
    stopped_with: list[str] = field(default_factory=list)
    """Other runs' jobs that still lived when this run stopped the control plane they
    shared (interrupted while it waited for them)."""


@dataclass(frozen=True)
class Target:
    """Where to submit: a running control plane, or None to embed one."""

    url: str | None = None
    token: str | None = None


class JobsElsewhere(RollMuxError):
    """The run's jobs are held by a control plane this run cannot reach or host."""


@dataclass
class Plane:
    """The control plane a run submits to."""

    client: Client
    record: dict[str, Any]
    """Its registry record: url, state, host, pid, embedded."""
    service: Service | None = None
    """The control plane itself, when this run embeds it."""


Ticks = Callable[[dict[str, dict[str, Any]], dict[str, Any]], None]


def run_plan(
    run: RunFile,
    out: Path,
    target: Target | None = None,
    on_tick: Ticks | None = None,
    tick_s: float = 0.5,
) -> RunResult:
    """Submit the run file's jobs in one transaction and wait until all of them ended (and,
    where the control plane is embedded here, until every other job in it ended too)."""
    with PlanRun(run, out, target) as plan:
        result = plan.run(on_tick, tick_s)
        plan.wait_for_others(tick_s=tick_s)
        return result


class PlanRun:
    """One run of a plan on the control plane that holds its jobs: joined, embedded here,
    or taken over from a run that went. Leaving the ``with`` block stops an embedded one."""

    def __init__(
        self, run: RunFile, out: Path, target: Target | None = None, on_note: Callable[[str], None] | None = None
    ):
        self.spec, self.out, self.target = run, out, target
        self.note = on_note or (lambda text: None)
        self.plane: Plane | None = None
        self.others: list[str] = []
        """The other runs' live jobs last seen by :meth:`wait_for_others`."""

    def __enter__(self) -> PlanRun:
        self.plane = self._attach()
        return self

    def __exit__(self, *failure: object) -> None:
        if self.plane is not None and self.plane.service is not None:
            self.plane.service.stop()

    def run(self, on_tick: Ticks | None = None, tick_s: float = 0.5) -> RunResult:
        """Submit the plan and follow it to its end. A joined control plane that stops
        answering is looked for again, or taken over, and the plan resubmitted there
        (identical, so the jobs are found as they were)."""
        while True:
            try:
                return self._follow(on_tick, tick_s)
            except ServiceError as error:
                if not self._may_move(error):
                    raise
                self.note(f"the control plane at {self._plane.client.url} stopped answering: looking for it again")
                self.plane = self._attach()

    def wait_for_others(
        self, on_wait: Callable[[list[dict[str, Any]]], None] | None = None, tick_s: float = 0.5
    ) -> None:
        """Where this run embeds the control plane: return once no job in it lives, so that
        the other runs sharing it finish before it stops."""
        if self._plane.service is None:
            return
        client = self._plane.client
        while True:
            if waiting := client.jobs(list(LIVE_STATES)):
                self.others = [job["name"] for job in waiting]
                if on_wait:
                    on_wait(waiting)
            elif self._still_reading(client) <= 0:
                break
            time.sleep(tick_s)
        self.others = []

    def _still_reading(self, client: Client) -> float:
        """Seconds the run of another job that ended last may still be reading its results
        (the control plane's clock is this process's)."""
        mine = {job.name for job in self.spec.jobs}
        ended = [job["ended_at"] or 0.0 for job in client.jobs(list(ENDED_STATES)) if job["name"] not in mine]
        return max(ended, default=0.0) + READING_S - time.time()

    @property
    def _plane(self) -> Plane:
        assert self.plane is not None, "PlanRun used outside its with block"
        return self.plane

    def _follow(self, on_tick: Ticks | None, tick_s: float) -> RunResult:
        client = self._plane.client
        client.request("POST", "/v1/plans", json=self.spec.plan())
        names = [job.name for job in self.spec.jobs]
        views = _views(client, names)
        while True:
            summary = client.request("GET", "/v1/cluster")
            if on_tick:
                on_tick(views, summary)
            if all(v["state"] in ENDED_STATES for v in views.values()):
                return _collect(client, names, views, summary)
            time.sleep(tick_s)
            views = _views(client, names)

    def _may_move(self, error: ServiceError) -> bool:
        """A control plane found through the Ray cluster that does not answer (or not ready)."""
        found_here = self.target is None or self.target.url is None
        return found_here and self._plane.service is None and error.status in (None, 503)

    def _attach(self) -> Plane:
        """The control plane holding this folder's jobs: the given URL, the Ray cluster's
        one, or one embedded here on the state where the jobs live (this folder's own for
        a first run). Waits while another run starts one, or while a ``rollmux serve``
        that holds the jobs is away."""
        if self.target is not None and self.target.url is not None:
            return Plane(Client(self.target.url, self.target.token), {"url": self.target.url})
        from rollmux.dataplane import registry
        from rollmux.service.server import ClusterTaken

        cluster = self.spec.cluster
        standby = cluster.standby_workers
        start_ray(cluster.ray_address, cluster.rollout_nodes + standby, cluster.train_nodes + standby)
        while True:
            found = registry.lookup()
            if found is not None:
                return self._join(found)
            home = self._home()
            if home is not None and not home.get("embedded", True):
                self.note(f"waiting for the control plane that holds these jobs to come back: {_describe(home)}")
            else:
                try:
                    return self._embed(home)
                except (StoreLocked, ClusterTaken) as busy:
                    self.note(f"another run is starting the control plane, to be joined once it answers: {busy}")
            time.sleep(LOOK_AGAIN_S)

    def _join(self, found: dict[str, Any]) -> Plane:
        home = self._home()
        if home is not None and home["state"] != found["state"]:
            raise JobsElsewhere(
                f"the jobs of {self.out} are held by the control plane with its state in {home['state']}, "
                f"but this Ray cluster's control plane ({_describe(found)}) is another: run this again once it "
                "stopped (this run then hosts theirs), or with --fresh to run the jobs again from the start on it"
            )
        self._point(found)
        return Plane(Client(found["url"], found["token"], retry_s=JOINED_RETRY_S), found)

    def _embed(self, home: dict[str, Any] | None) -> Plane:
        """Host the control plane here, on the state where this folder's jobs live."""
        from rollmux.core.regroup import RegroupConfig
        from rollmux.dataplane.warm import WarmOptions
        from rollmux.sdk.jobcode import JOB_CODE
        from rollmux.service.server import ServeOptions, Service

        state = Path(home["state"]) if home is not None else (self.out / "state").resolve()
        if home is not None and not (state / DATABASE).exists():
            raise JobsElsewhere(
                f"the jobs of {self.out} are held by the control plane with its state in {state} "
                f"({_describe(home)}), which is not there to host: run this where that folder is, "
                "or with --fresh to run the jobs again from the start"
            )
        if home is not None and "url" in home:
            self.note(f"the control plane that held these jobs ({_describe(home)}) is gone: hosting it here on {state}")
        cluster = self.spec.cluster
        options = ServeOptions(
            host="0.0.0.0" if cluster.ray_address else "127.0.0.1",
            port=0,
            state_dir=state,
            policy=self.spec.policy,
            ray_address=cluster.ray_address,
            lease_s=cluster.lease_s,
            host_memory_gb=cluster.host_memory_gb,
            gpus_per_node={Pool(pool): gpus for pool, gpus in cluster.gpus_per_node.items()},
            regroup=RegroupConfig() if cluster.regroup else None,
            slo_guard=cluster.slo_guard,
            warm=WarmOptions(standby_workers=cluster.standby_workers),
            job_code=JOB_CODE,
            embedded=True,
        )
        service = Service(options).start()
        self._point(service.record)
        return Plane(Client(service.url, service.token), service.record, service)

    def _home(self) -> dict[str, Any] | None:
        """Where this folder's jobs live: the control plane its pointer names, or its own
        state folder (written before pointers were); None for a first run."""
        pointer = self.out / POINTER
        if pointer.exists():
            return json.loads(pointer.read_text())
        state = self.out / "state"
        if (state / DATABASE).exists():
            return {"state": str(state.resolve()), "embedded": True}
        return None

    def _point(self, record: dict[str, Any]) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        kept = {key: value for key, value in record.items() if key != "token"}
        (self.out / POINTER).write_text(json.dumps(kept, indent=1))


def forget(out: Path) -> None:
    """Forget an earlier run of this folder (``--fresh``): its state and its pointer. Refused
    while a control plane serves from that state (another run may have taken it over)."""
    holder = sqlite_holder(out / "state" / DATABASE)
    if holder is not None:
        raise StoreLocked(f"{out / 'state'} is in use by another rollmux control plane: {holder}")
    shutil.rmtree(out / "state", ignore_errors=True)
    (out / POINTER).unlink(missing_ok=True)


def _describe(record: dict[str, Any]) -> str:
    """A control plane in words, from its registry record."""
    kind = "embedded by rollmux run" if record.get("embedded") else "rollmux serve"
    return f"{kind} at {record.get('url', '?')}, pid {record.get('pid', '?')} on {record.get('host', '?')}"


def _views(client: Client, names: list[str]) -> dict[str, dict[str, Any]]:
    return {name: client.request("GET", f"/v1/jobs/{name}") for name in names}


def _collect(client: Client, names: list[str], views: dict[str, dict[str, Any]], summary: dict) -> RunResult:
    result = RunResult(views=views, summary=summary, url=client.url)
    for name in names:
        result.histories[name] = client.request("GET", f"/v1/jobs/{name}/metrics")
        if views[name]["state"] == FAILED:
            result.errors[name] = views[name]["reason"]
        result.phase_log += client.request("GET", f"/v1/jobs/{name}/phases")
    result.records = phase_records(result.phase_log)
    realised = realised_slowdowns(result.records)
    for name in names:
        views[name]["realised_slowdown"] = realised.get(name)
    return result


def realised_slowdowns(records: list[PhaseRecord]) -> dict[str, float]:
    """Each job's slowdown as it ran: the time from its first grant to its last release
    over the time its phases were busy (what its iterations would take alone, without
    waiting for a turn or switching), the measure its SLO bounds."""
    spans: dict[str, tuple[float, float, float]] = {}
    for r in records:
        first, last, busy = spans.get(r.job, (r.granted, r.released, 0.0))
        spans[r.job] = (min(first, r.granted), max(last, r.released), busy + max(0.0, r.ended - r.started))
    return {job: (last - first) / busy for job, (first, last, busy) in spans.items() if busy > 0}


def phase_records(log: list[dict[str, Any]]) -> list[PhaseRecord]:
    """The released phases of a phase log as the timeline draws them, in grant order."""
    return sorted((_record(entry) for entry in log if entry["outcome"] == "released"), key=lambda r: r.granted)


def node_records(log: list[dict[str, Any]]) -> list[PhaseRecord]:
    """Every node's time in each phase, as the Gantt chart draws it: the released phases,
    and the nodes an elastic rollout shed before its end or was widened onto after its
    start (held from grant to release, each its own line)."""
    extra = [_held(entry) for entry in log if entry["outcome"] in ("shed", "widened")]
    return sorted(phase_records(log) + extra, key=lambda r: r.granted)


def _held(entry: dict[str, Any]) -> PhaseRecord:
    """A shed or widened node's line: busy from its grant to its end."""
    return replace(_record(entry), started=entry["granted_at"], ended=entry["ended_at"], wake_s=0.0, sleep_s=0.0)


def _record(entry: dict[str, Any]) -> PhaseRecord:
    """A released phase as the timeline draws it: server times, the holder's durations."""
    started = entry["granted_at"] + entry["wake_s"]
    return PhaseRecord(
        job=entry["job"],
        phase=entry["phase"],
        iteration=entry["iteration"],
        nodes=tuple(entry["nodes"]),
        requested=entry["requested_at"],
        granted=entry["granted_at"],
        started=started,
        ended=min(started + entry["busy_s"], entry["ended_at"]),
        released=entry["ended_at"],
        wake_s=entry["wake_s"],
        sleep_s=entry["sleep_s"],
    )
