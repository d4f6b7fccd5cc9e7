"""The HTTP API of the control plane (FastAPI; the OpenAPI schema is at /openapi.json).

Every endpoint but ``/healthz`` and ``/readyz`` needs ``Authorization: Bearer <token>``,
checked with the body's size and nesting before the body is read
(:mod:`rollmux.service.guard`). Handlers are coroutines that never block: a job waiting
for its turn holds no thread. Job specs arrive as JSON or YAML and are validated with the
same pydantic model as run files; an invalid spec gets 422 naming the field and the
reason, and nothing is stored.
"""

from __future__ import annotations

import importlib.metadata
import json
from contextlib import asynccontextmanager, contextmanager
from typing import Annotated, Any, Literal

import yaml
from fastapi import FastAPI, HTTPException, Query, Request, Response, status
from fastapi import Path as PathParam
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from rollmux.core.control import Grant, PhaseTiming
from rollmux.core.errors import (
    JobEnded,
    JobExists,
    NoCapacity,
    PhaseOrderError,
    ResidencyExceeded,
    RollMuxError,
    StaleEpoch,
    UnknownJob,
)
from rollmux.inputs.errors import problem
from rollmux.inputs.jobfile import NAME_PATTERN
from rollmux.inputs.runfile import JobSubmission, Plan
from rollmux.service.control import ControlPlane
from rollmux.service.guard import RequestGuard
from rollmux.wire.client import ERROR_HEADER

YAML_TYPES = ("application/yaml", "application/x-yaml", "text/yaml")
JobName = Annotated[str, PathParam(pattern=NAME_PATTERN, max_length=128)]
Phase = Literal["rollout", "train"]
State = Literal["pending", "placed", "starting", "running", "lost", "done", "failed", "cancelled"]
MAX_WAIT_S = 30.0
MAX_LIST = 1000


class JobView(BaseModel):
    name: str
    state: str
    reason: str
    kind: str
    priority: int
    group_id: int | None
    rollout_nodes: list[int]
    train_nodes: list[int]
    slo: float
    slowdown: float | None
    iterations: int
    epoch: int
    restarts: int
    max_restarts: int = Field(default=3, description="restarts after a lost session or platform failure, then it fails")
    restart_at: float | None = Field(
        default=None, description="its next driver waits until then (back-off after repeated restarts)"
    )
    unseat_at: float | None = Field(
        default=None,
        description="seated without a session (placed or lost): its nodes are released then unless a session begins",
    )
    lost_grace_s: float | None = Field(
        default=None, description="how long a live job may sit seated without a session (the control plane's setting)"
    )
    parked: bool = Field(
        default=False, description="unseated after its grace: placed again only when its driver opens a session"
    )
    phase: str | None
    metrics: dict[str, float] | None = Field(default=None, description="the last iteration's metrics")
    cost_usd: float
    submitted_at: float
    ended_at: float | None
    buddy: str | None = Field(
        default=None,
        description="where a job with replicas keeps its trainer's copy: node:<id> or standby:<slot> (null: no room)",
    )


class JobList(BaseModel):
    jobs: list[JobView]
    next_cursor: int | None = Field(description="pass as `cursor` for the next page; null on the last")


class SessionView(BaseModel):
    epoch: int
    iteration: int
    lease_s: float
    rollout_nodes: list[int]
    train_nodes: list[int]
    program: dict[str, Any]
    checkpoint: str


class Lease(BaseModel):
    epoch: int
    lease_until: float


class GrantView(BaseModel):
    granted: bool
    phase: str | None = None
    nodes: list[int] = []
    rollout_nodes: list[int] = Field(default=[], description="the job's rollout nodes now (they change when it moves)")
    train_nodes: list[int] = []
    granted_ago_s: float = Field(default=0.0, description="how long before this answer the grant was made")
    epoch: int | None = None
    token: int | None = None
    iteration: int | None = None


class Released(BaseModel):
    status: str
    next: GrantView | None = Field(default=None, description="the next phase's grant, when asked for")


def _grant_view(control: ControlPlane, grant: Grant | None) -> dict[str, Any]:
    if grant is None:
        return {"granted": False}
    rollout_nodes, train_nodes = control.roles_at(grant.job)
    return {
        "granted": True,
        "phase": grant.phase,
        "nodes": list(grant.nodes),
        "rollout_nodes": list(rollout_nodes),
        "train_nodes": list(train_nodes),
        "granted_ago_s": max(0.0, control.clock() - grant.granted_at),
        "epoch": grant.epoch,
        "token": grant.token,
        "iteration": grant.iteration,
    }


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class SessionBody(_Body):
    pid: int = Field(ge=0, le=2**31, description="process id of the job's driver")
    host: str = Field(max_length=255, description="host of the job's driver")


class EpochBody(_Body):
    epoch: int = Field(ge=0, le=2**62, description="the session's epoch (fencing)")


class ActivateBody(EpochBody):
    iteration: int | None = Field(default=None, ge=0, le=10**9, description="resume here (its last checkpoint)")
    restored: Literal["checkpoint", "kept", "replica", "buddy"] | None = Field(
        default=None, description="where its trainer's state came from (shown in the job's events)"
    )


class Progress(_Body):
    iteration: int = Field(ge=0, le=10**9)
    metrics: dict[Annotated[str, Field(max_length=64)], float] = Field(max_length=64)


class ReleaseBody(EpochBody):
    token: int = Field(ge=0, le=2**62, description="the grant's fencing token")
    busy_s: float = Field(ge=0, le=1e7, description="measured duration of the phase's work")
    wake_s: float = Field(default=0.0, ge=0, le=1e7)
    sleep_s: float = Field(default=0.0, ge=0, le=1e7)
    progress: Progress | None = Field(
        default=None, description="metrics reported during the phase, recorded with its release"
    )


class ShedBody(EpochBody):
    token: int = Field(ge=0, le=2**62, description="the grant's fencing token")
    keep: list[Annotated[int, Field(ge=0, le=2**62)]] = Field(
        min_length=1, max_length=4096, description="the nodes the rollout keeps for its tail; the rest are given back"
    )


class ProgressBody(EpochBody, Progress):
    pass


class CompleteBody(EpochBody):
    error: str = Field(default="", max_length=4000, description="empty: done; else: failed, with this cause")


class PhaseEvent(BaseModel):
    id: int
    job: str
    epoch: int
    token: int
    phase: str
    iteration: int
    nodes: list[int]
    requested_at: float
    granted_at: float
    ended_at: float
    busy_s: float
    wake_s: float
    sleep_s: float
    outcome: str


class EventView(BaseModel):
    at: float
    kind: str
    detail: str


class GroupJob(BaseModel):
    name: str
    slowdown: float
    slo: float


class GroupView(BaseModel):
    id: int
    rollout_nodes: list[int]
    train_nodes: list[int]
    cycle_s: float
    t1_s: float
    t2_s: float
    jobs: list[GroupJob]


class NodeView(BaseModel):
    id: int
    pool: str
    group_id: int
    holder: str | None
    busy_fraction: float
    price_per_hour: float


class NodeChange(BaseModel):
    id: int
    node: int
    pool: str
    at: float
    held: bool


class MoveView(BaseModel):
    """A running job moved between groups: when it was decided, when the job reached its
    phase boundary, when its state landed on the new nodes (``pause_s``: boundary to landing)."""

    id: int
    job: str
    epoch: int
    reason: str
    origin: list[int]
    target: list[int]
    decided_at: float
    ready_at: float
    done_at: float
    pause_s: float
    moved_bytes: int
    outcome: str


class RoundView(BaseModel):
    """One regrouping round's wall times (kept in memory for the last 10,000 rounds)."""

    id: int = Field(description="the round's number since start")
    taken_at: float = Field(description="when it took its snapshot")
    plan_s: float = Field(description="seconds from its snapshot to its plan")
    ready_s: float = Field(
        description="seconds readying its new nodes until its moves started or it was dropped (0 without a plan)"
    )
    moves: int = Field(description="jobs it started moving")


class RegroupingView(BaseModel):
    rounds: int = Field(description="regrouping rounds planned since start")
    rounds_exhausted: int = Field(description="rounds stopped on their work budget (each kept the best plan found)")
    planning_s: float = Field(description="wall seconds its rounds took to plan, all together")
    cached_sets: int = Field(description="solved job sets kept between rounds (bounded)")
    last_round: dict[str, float | int | bool] = Field(
        description="the last round's jobs, searches, checks, steps, whether it was exhausted, and its seconds"
    )


class ClusterSummary(BaseModel):
    nodes: dict[str, int]
    capacity: dict[str, int | None]
    groups: int
    jobs: dict[str, int]
    queued: int
    cost_usd_per_hour: float
    busy_fraction: dict[str, float]
    bubble_fraction: float
    accepted_since_start: int
    commits_since_start: int
    regrouping: RegroupingView


class Problem(BaseModel):
    detail: Any


class _Metrics:
    """Prometheus collector reading the control plane at scrape time."""

    def __init__(self, control: ControlPlane):
        self.control = control

    def collect(self):
        summary = self.control.summary()
        nodes = GaugeMetricFamily("rollmux_nodes", "Nodes held, per pool", labels=["pool"])
        busy = GaugeMetricFamily("rollmux_busy_fraction", "Busy fraction of held nodes, per pool", labels=["pool"])
        for pool, count in summary["nodes"].items():
            nodes.add_metric([pool], count)
            busy.add_metric([pool], summary["busy_fraction"][pool])
        jobs = GaugeMetricFamily("rollmux_jobs", "Live jobs, per state", labels=["state"])
        for state, count in summary["jobs"].items():
            jobs.add_metric([state], count)
        yield nodes
        yield busy
        yield jobs
        yield GaugeMetricFamily("rollmux_queued_jobs", "Jobs waiting for capacity", value=summary["queued"])
        yield GaugeMetricFamily("rollmux_groups", "Co-execution groups", value=summary["groups"])
        yield GaugeMetricFamily(
            "rollmux_cost_usd_per_hour", "Price of the nodes held", value=summary["cost_usd_per_hour"]
        )
        yield GaugeMetricFamily("rollmux_bubble_fraction", "Idle share of held nodes", value=summary["bubble_fraction"])
        yield CounterMetricFamily(
            "rollmux_submissions", "Jobs accepted since start", value=summary["accepted_since_start"]
        )
        yield CounterMetricFamily(
            "rollmux_commits", "Store transactions since start", value=summary["commits_since_start"]
        )
        regrouping = summary["regrouping"]
        yield CounterMetricFamily("rollmux_regroup_rounds", "Regrouping rounds planned", value=regrouping["rounds"])
        yield CounterMetricFamily(
            "rollmux_regroup_rounds_exhausted",
            "Regrouping rounds stopped on their work budget",
            value=regrouping["rounds_exhausted"],
        )
        yield GaugeMetricFamily(
            "rollmux_regroup_cached_sets", "Solved job sets regrouping keeps", value=regrouping["cached_sets"]
        )
        yield GaugeMetricFamily(
            "rollmux_regroup_last_round_seconds",
            "Wall seconds the last regrouping round took to plan",
            value=regrouping["last_round"]["seconds"],
        )


def _errors(error: ValidationError | RequestValidationError, prefix: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    found = [(problem(e), e["type"]) for e in error.errors()]
    return [{"loc": [*prefix, *loc], "msg": msg, "type": kind} for (loc, msg), kind in found]


async def _parsed_body(request: Request) -> Any:
    """The body as plain data, from JSON or YAML; 415/422 when it is not one."""
    raw = await request.body()
    kind = request.headers.get("content-type", "application/json").split(";")[0].strip().lower()
    try:
        if kind in YAML_TYPES:
            return yaml.safe_load(raw.decode("utf-8"))
        if kind == "application/json":
            return json.loads(raw)
    except (ValueError, yaml.YAMLError) as error:
        raise HTTPException(
            status.HTTP_422_UNPROCESSABLE_CONTENT, [{"loc": ["body"], "msg": f"not parseable: {error}"}]
        ) from None
    except RecursionError:
        raise HTTPException(
            status.HTTP_422_UNPROCESSABLE_CONTENT, [{"loc": ["body"], "msg": "nested too deeply"}]
        ) from None
    raise HTTPException(status.HTTP_415_UNSUPPORTED_MEDIA_TYPE, "send application/json or application/yaml")


def _validated(model: type[BaseModel], data: Any) -> Any:
    try:
        return model.model_validate(data)
    except ValidationError as error:
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, _errors(error, ("body",))) from None


@contextmanager
def _errors_as_http():
    """The control plane's refusals as HTTP answers: unknown 404, conflicts 409, bad 422."""
    try:
        yield
    except UnknownJob as error:
        raise HTTPException(status.HTTP_404_NOT_FOUND, str(error)) from None
    except (JobEnded, JobExists, PhaseOrderError, StaleEpoch, NoCapacity, ResidencyExceeded) as error:
        raise HTTPException(status.HTTP_409_CONFLICT, str(error), {ERROR_HEADER: type(error).__name__}) from None
    except (RollMuxError, ValueError) as error:
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, [{"loc": ["body"], "msg": str(error)}]) from None


def create_app(control: ControlPlane, token: str) -> Any:
    """The API app wrapped in its request guard (token, size, nesting); the control plane
    starts and stops with it."""

    @asynccontextmanager
    async def lifespan(_app: FastAPI):
        await control.start()
        try:
            yield
        finally:
            await control.stop()

    app = FastAPI(
        lifespan=lifespan,
        openapi_url="/openapi.json",
        docs_url=None,
        redoc_url=None,
        title="RollMux",
        version=importlib.metadata.version("rollmux"),  # pyproject.toml's: the package root would import the job side
        description="Control plane of RollMux: RL post-training jobs on disaggregated rollout and training pools.",
    )
    registry = CollectorRegistry()
    registry.register(_Metrics(control))
    base = {400: {"model": Problem}, 401: {"model": Problem}, 413: {"model": Problem}, 422: {"model": Problem}}
    one = {**base, 404: {"model": Problem}, 409: {"model": Problem}}

    @app.exception_handler(RequestValidationError)
    async def _invalid(_request: Request, error: RequestValidationError) -> JSONResponse:
        return JSONResponse({"detail": _errors(error)}, status_code=422)

    spec_body = {
        "requestBody": {
            "required": True,
            "content": {
                "application/json": {"schema": JobSubmission.model_json_schema()},
                "application/yaml": {"schema": JobSubmission.model_json_schema()},
            },
        }
    }

    @app.post("/v1/jobs", status_code=201, response_model=JobView, responses=one, openapi_extra=spec_body)
    async def submit(request: Request, response: Response) -> dict[str, Any]:
        """Submit a job (JSON or YAML): 201 once placed or queued and durably stored; 200 if an
        identical job of that name was submitted before (a retry)."""
        job = _validated(JobSubmission, await _parsed_body(request))
        with _errors_as_http():
            views, fresh = await control.submit([job])
        response.status_code = 201 if fresh else 200
        return views[0]

    plan_body = {
        "requestBody": {
            "required": True,
            "content": {
                "application/json": {"schema": Plan.model_json_schema()},
                "application/yaml": {"schema": Plan.model_json_schema()},
            },
        }
    }

    @app.post("/v1/plans", status_code=201, response_model=list[JobView], responses=one, openapi_extra=plan_body)
    async def submit_plan(request: Request, response: Response) -> list[dict[str, Any]]:
        """Submit a plan (``jobs:`` list) in one transaction: every job accepted, or none."""
        plan = _validated(Plan, await _parsed_body(request))
        with _errors_as_http():
            views, fresh = await control.submit(plan.jobs)
        response.status_code = 201 if fresh else 200
        return views

    @app.get("/v1/jobs", response_model=JobList, responses=base)
    async def list_jobs(
        state: Annotated[list[State] | None, Query(description="only jobs in these states")] = None,
        limit: Annotated[int, Query(ge=1, le=MAX_LIST)] = 100,
        cursor: Annotated[int, Query(ge=-1, le=2**62, description="next_cursor of the previous page")] = -1,
    ) -> dict[str, Any]:
        """Jobs in submission order, a page at a time."""
        return await control.list_jobs(list(state or ()), cursor, limit)

    @app.get("/v1/jobs/{name}", response_model=JobView, responses=one)
    async def get_job(name: JobName) -> dict[str, Any]:
        with _errors_as_http():
            return await control.view(name)

    @app.delete("/v1/jobs/{name}", response_model=JobView, responses=one)
    async def cancel_job(name: JobName) -> dict[str, Any]:
        """Cancel a live job: it leaves its group (or the queue); nodes no one uses are released."""
        with _errors_as_http():
            return await control.cancel(name)

    @app.post("/v1/jobs/{name}/sessions", status_code=201, response_model=SessionView, responses=one)
    async def begin_session(name: JobName, body: SessionBody) -> dict[str, Any]:
        """A new incarnation of the job (its driver started): the next epoch and a lease.
        Whatever an older incarnation held is revoked."""
        with _errors_as_http():
            return await control.begin_session(name, f"pid {body.pid} on {body.host}")

    @app.post("/v1/jobs/{name}/activate", response_model=JobView, responses=one)
    async def activate_job(name: JobName, body: ActivateBody) -> dict[str, Any]:
        """The job's roles are loaded: it joins its group's round-robin."""
        with _errors_as_http():
            return await control.activate(name, body.epoch, body.iteration, body.restored)

    @app.post("/v1/jobs/{name}/heartbeat", response_model=Lease, responses=one)
    async def heartbeat(name: JobName, body: EpochBody) -> JSONResponse:
        """Renew the session's lease (every call of the session renews it too). The hot
        endpoints answer with a plain JSON response: their models only document them."""
        with _errors_as_http():
            return JSONResponse(await control.heartbeat(name, body.epoch))

    @app.post("/v1/jobs/{name}/phases/{phase}/acquire", response_model=GrantView, responses=one)
    async def acquire_phase(
        name: JobName,
        phase: Phase,
        epoch: Annotated[int, Query(ge=0, le=2**62)],
        wait_s: Annotated[float, Query(ge=0, le=MAX_WAIT_S)] = 10.0,
    ) -> JSONResponse:
        """Long poll: the grant once the group's round-robin gives this job its turn, or
        ``granted: false`` after ``wait_s`` (ask again; the grant already made is returned)."""
        with _errors_as_http():
            return JSONResponse(_grant_view(control, await control.acquire(name, phase, epoch, wait_s)))

    @app.post("/v1/jobs/{name}/phases/{phase}/release", response_model=Released, responses=one)
    async def release_phase(
        name: JobName,
        phase: Phase,
        body: ReleaseBody,
        then_wait_s: Annotated[
            float | None, Query(ge=0, le=MAX_WAIT_S, description="also ask for the next phase, waiting this long")
        ] = None,
    ) -> JSONResponse:
        """The phase is over: it is logged and its nodes go to the next job in turn. With
        ``then_wait_s``, the job's next phase is asked for in the same call (``next``)."""
        timing = PhaseTiming(body.busy_s, body.wake_s, body.sleep_s)
        with _errors_as_http():
            progress = (body.progress.iteration, body.progress.metrics) if body.progress else None
            grant = await control.release(name, phase, body.epoch, body.token, timing, then_wait_s, progress)
        return JSONResponse(
            {"status": "released", "next": _grant_view(control, grant) if then_wait_s is not None else None}
        )

    @app.post("/v1/jobs/{name}/phases/{phase}/shed", response_model=GrantView, responses=one)
    async def shed_nodes(name: JobName, phase: Phase, body: ShedBody) -> JSONResponse:
        """An elastic rollout (a job with a tail to move) gives back every node it holds but
        ``keep``: they go to the next job in turn at once. Answers the grant as it is now."""
        with _errors_as_http():
            grant = await control.shed(name, phase, body.epoch, body.token, body.keep)
        return JSONResponse(_grant_view(control, grant))

    @app.post("/v1/jobs/{name}/progress", responses=one)
    async def progress(name: JobName, body: ProgressBody) -> dict[str, str]:
        """Metrics of one iteration (loss, reward, ...), kept per iteration."""
        with _errors_as_http():
            await control.report(name, body.epoch, body.iteration, body.metrics)
        return {"status": "recorded"}

    @app.post("/v1/jobs/{name}/complete", response_model=JobView, responses=one)
    async def complete_job(name: JobName, body: CompleteBody) -> dict[str, Any]:
        """The job's driver ends it: done, or failed with ``error``; its nodes are released."""
        with _errors_as_http():
            return await control.complete(name, body.epoch, body.error)

    @app.get("/v1/jobs/{name}/phases", response_model=list[PhaseEvent], responses=one)
    async def job_phases(name: JobName) -> list[dict[str, Any]]:
        """The job's phase log, in the order phases ended (released or revoked)."""
        with _errors_as_http():
            await control.view(name)
        return await control.phase_log(name)

    @app.get("/v1/phases", response_model=list[PhaseEvent], responses=base)
    async def all_phases(
        after: Annotated[int, Query(ge=-1, le=2**62, description="the last id of the previous page")] = -1,
        limit: Annotated[int, Query(ge=1, le=10_000)] = 1000,
    ) -> list[dict[str, Any]]:
        """The phase log of every job, in the order phases ended, a page at a time."""
        return await control.phase_log(None, after, limit)

    @app.get("/v1/jobs/{name}/events", response_model=list[EventView], responses=one)
    async def job_events(name: JobName) -> list[dict[str, Any]]:
        """Lifecycle events: submitted, placed, session, running, lost, restart, revoked, ended."""
        with _errors_as_http():
            await control.view(name)
        return await control.events(name)

    @app.get("/v1/jobs/{name}/metrics", response_model=list[dict[str, float]], responses=one)
    async def job_metrics(name: JobName) -> list[dict[str, float]]:
        """The metrics the job reported, one entry per iteration."""
        with _errors_as_http():
            await control.view(name)
        return await control.metrics(name)

    @app.get("/v1/groups", response_model=list[GroupView], responses=base)
    async def list_groups() -> list[dict[str, Any]]:
        return control.groups()

    @app.get("/v1/nodes", response_model=list[NodeView], responses=base)
    async def list_nodes() -> list[dict[str, Any]]:
        return control.nodes()

    @app.get("/v1/nodes/log", response_model=list[NodeChange], responses=base)
    async def node_log(
        after: Annotated[int, Query(ge=-1, le=2**62, description="the last id of the previous page")] = -1,
        limit: Annotated[int, Query(ge=1, le=10_000)] = 1000,
    ) -> list[dict[str, Any]]:
        """Every node taken (``held``) and given back, in order: the cluster's cost over time."""
        return await control.node_log(after, limit)

    @app.get("/v1/moves", response_model=list[MoveView], responses=base)
    async def list_moves(
        after: Annotated[int, Query(ge=-1, le=2**62, description="the last id of the previous page")] = -1,
        limit: Annotated[int, Query(ge=1, le=10_000)] = 1000,
    ) -> list[dict[str, Any]]:
        """Every move of a running job (regrouping, SLO guard), with its measured pause."""
        return await control.moves(after, limit)

    @app.get("/v1/regrouping/rounds", response_model=list[RoundView], responses=base)
    async def list_rounds(
        after: Annotated[int, Query(ge=-1, le=2**62, description="the last id of the previous page")] = -1,
        limit: Annotated[int, Query(ge=1, le=10_000)] = 1000,
    ) -> list[dict[str, Any]]:
        """Each regrouping round's planning and readying time: what ``rollmux replay`` feeds
        the virtual clock, and where to look when rounds plan slowly."""
        return control.rounds(after, limit)

    @app.get("/v1/cluster", response_model=ClusterSummary, responses=base)
    async def cluster_summary() -> dict[str, Any]:
        """Nodes per pool and capacity, jobs per state, queue, cost rate, busy fractions."""
        return control.summary()

    @app.get("/metrics", response_class=PlainTextResponse, responses=base)
    async def metrics() -> PlainTextResponse:
        """Prometheus exposition format."""
        return PlainTextResponse(generate_latest(registry).decode(), media_type="text/plain; version=0.0.4")

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        """Liveness: the process answers (no token needed)."""
        return {"status": "ok"}

    @app.get("/readyz", responses={503: {"model": Problem}})
    async def readyz() -> JSONResponse:
        """Readiness: state loaded, store writable, executor up (no token needed)."""
        if control.ready:
            return JSONResponse({"status": "ready"})
        return JSONResponse({"detail": "starting or stopping"}, status_code=503)

    return RequestGuard(app, token)
