"""The HTTP API of ``rollmux serve`` (FastAPI; the OpenAPI schema is at /openapi.json).

Every request needs ``Authorization: Bearer <token>``. Job specs arrive as JSON or YAML
and are validated with the same pydantic model as ``rollmux plan`` files; an invalid
spec gets 422 naming the field and the reason, and nothing is stored.
"""

from __future__ import annotations

import json
import secrets
from contextlib import contextmanager
from typing import Annotated, Any, Literal

import yaml
from fastapi import Depends, FastAPI, HTTPException, Query, Request, status
from fastapi import Path as PathParam
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from rollmux.core.errors import PhaseOrderError, ResidencyExceeded, UnknownJob
from rollmux.inputs.jobfile import NAME_PATTERN, PlanJob
from rollmux.service.control import DurableControl, JobEnded, JobExists, NoCapacity

MAX_BODY_BYTES = 64 * 1024
YAML_TYPES = ("application/yaml", "application/x-yaml", "text/yaml")
JobName = Annotated[str, PathParam(pattern=NAME_PATTERN, max_length=128)]
Phase = Literal["rollout", "train"]
MAX_WAIT_S = 30.0
Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(HTTPBearer(auto_error=False))]


class JobView(BaseModel):
    name: str
    state: str
    group_id: int | None
    rollout_nodes: list[int]
    train_nodes: list[int]
    slo: float
    slowdown: float | None
    iterations: int
    cost_usd: float
    submitted_at: float
    ended_at: float | None


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
    busy_fraction: float
    price_per_hour: float


class ClusterSummary(BaseModel):
    nodes: dict[str, int]
    groups: int
    jobs: dict[str, int]
    cost_usd_per_hour: float
    busy_fraction: dict[str, float]
    bubble_fraction: float
    accepted_since_start: int


class Problem(BaseModel):
    detail: Any


class Grant(BaseModel):
    granted: bool
    nodes: list[int]


class PhaseDone(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    busy_s: float = Field(ge=0, le=1e7, description="measured duration of the phase's work")


class PhaseEvent(BaseModel):
    phase: str
    iteration: int
    nodes: list[int]
    busy_s: float
    ended_at: float


class _Metrics:
    """Prometheus collector reading the control plane at scrape time."""

    def __init__(self, control: DurableControl):
        self.control = control

    def collect(self):
        summary = self.control.summary()
        nodes = GaugeMetricFamily("rollmux_nodes", "Nodes held, per pool", labels=["pool"])
        busy = GaugeMetricFamily("rollmux_busy_fraction", "Busy fraction of held nodes, per pool", labels=["pool"])
        for pool, count in summary["nodes"].items():
            nodes.add_metric([pool], count)
            busy.add_metric([pool], summary["busy_fraction"][pool])
        jobs = GaugeMetricFamily("rollmux_jobs", "Jobs known to the service, per state", labels=["state"])
        for state, count in summary["jobs"].items():
            jobs.add_metric([state], count)
        yield nodes
        yield busy
        yield jobs
        yield GaugeMetricFamily("rollmux_groups", "Co-execution groups", value=summary["groups"])
        yield GaugeMetricFamily(
            "rollmux_cost_usd_per_hour", "Price of the nodes held", value=summary["cost_usd_per_hour"]
        )
        yield GaugeMetricFamily("rollmux_bubble_fraction", "Idle share of held nodes", value=summary["bubble_fraction"])
        yield CounterMetricFamily(
            "rollmux_submissions", "Jobs accepted since start", value=summary["accepted_since_start"]
        )


def _errors(error: ValidationError | RequestValidationError, prefix: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    return [{"loc": [*prefix, *e["loc"]], "msg": e["msg"], "type": e["type"]} for e in error.errors()]


async def _job_body(request: Request) -> dict[str, Any]:
    """The submitted spec as plain data, from JSON or YAML; 413/415/422 when it is not one."""
    raw = await request.body()
    if len(raw) > MAX_BODY_BYTES:
        raise HTTPException(status.HTTP_413_CONTENT_TOO_LARGE, f"body over {MAX_BODY_BYTES} bytes")
    kind = request.headers.get("content-type", "application/json").split(";")[0].strip().lower()
    try:
        if kind in YAML_TYPES:
            data = yaml.safe_load(raw.decode("utf-8"))
        elif kind == "application/json":
            data = json.loads(raw)
        else:
            raise HTTPException(status.HTTP_415_UNSUPPORTED_MEDIA_TYPE, "send application/json or application/yaml")
    except (ValueError, yaml.YAMLError) as error:
        raise HTTPException(
            status.HTTP_422_UNPROCESSABLE_CONTENT, [{"loc": ["body"], "msg": f"not parseable: {error}"}]
        ) from None
    if not isinstance(data, dict):
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, [{"loc": ["body"], "msg": "expected an object"}])
    return data


@contextmanager
def _errors_as_http():
    """The control plane's refusals as HTTP answers: unknown job 404, out of turn 409."""
    try:
        yield
    except UnknownJob as error:
        raise HTTPException(status.HTTP_404_NOT_FOUND, str(error)) from None
    except (JobEnded, PhaseOrderError) as error:
        raise HTTPException(status.HTTP_409_CONFLICT, str(error)) from None


def create_app(control: DurableControl, token: str) -> FastAPI:
    app = FastAPI(
        openapi_url=None,
        docs_url=None,
        redoc_url=None,
        title="RollMux",
        version="0.1.0",
        description="Cluster scheduler for RL post-training jobs on disaggregated rollout and training pools.",
    )

    def authorised(credentials: Credentials) -> None:
        if credentials is None or not secrets.compare_digest(credentials.credentials.encode(), token.encode()):
            raise HTTPException(
                status.HTTP_401_UNAUTHORIZED, "missing or wrong bearer token", headers={"WWW-Authenticate": "Bearer"}
            )

    registry = CollectorRegistry()
    registry.register(_Metrics(control))
    guarded = [Depends(authorised)]
    failures = {401: {"model": Problem}, 404: {"model": Problem}}

    @app.exception_handler(RequestValidationError)
    async def _invalid(_request: Request, error: RequestValidationError) -> JSONResponse:
        return JSONResponse({"detail": _errors(error)}, status_code=422)

    @app.post(
        "/v1/jobs",
        status_code=201,
        response_model=JobView,
        dependencies=guarded,
        responses={401: {"model": Problem}, 409: {"model": Problem}, 422: {"model": Problem}},
        openapi_extra={
            "requestBody": {
                "required": True,
                "content": {
                    "application/json": {"schema": PlanJob.model_json_schema()},
                    "application/yaml": {"schema": PlanJob.model_json_schema()},
                },
            }
        },
    )
    async def submit(request: Request) -> dict[str, Any]:
        """Submit a job spec (JSON or YAML). 201 once it is placed and durably stored."""
        data = await _job_body(request)
        try:
            job = PlanJob.model_validate(data)
        except ValidationError as error:
            raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, _errors(error, ("body",))) from None
        try:
            return control.submit(job.to_spec(job.name, job.slo))
        except JobExists as error:
            raise HTTPException(status.HTTP_409_CONFLICT, str(error)) from None
        except (NoCapacity, ResidencyExceeded) as error:
            raise HTTPException(status.HTTP_409_CONFLICT, str(error)) from None

    @app.get("/v1/jobs", response_model=list[JobView], dependencies=guarded, responses={401: {"model": Problem}})
    def list_jobs() -> list[dict[str, Any]]:
        """Every job ever accepted, in submission order."""
        return control.jobs()

    @app.get("/v1/jobs/{name}", response_model=JobView, dependencies=guarded, responses=failures)
    def get_job(name: JobName) -> dict[str, Any]:
        with _errors_as_http():
            return control.job(name)

    @app.delete(
        "/v1/jobs/{name}", response_model=JobView, dependencies=guarded, responses={**failures, 409: {"model": Problem}}
    )
    def cancel_job(name: JobName) -> dict[str, Any]:
        """Cancel a live job: it leaves its group; nodes no one uses are released."""
        with _errors_as_http():
            return control.cancel(name)

    lifecycle = {**failures, 400: {"model": Problem}, 409: {"model": Problem}}

    @app.post("/v1/jobs/{name}/activate", response_model=JobView, dependencies=guarded, responses=lifecycle)
    def activate_job(name: JobName) -> dict[str, Any]:
        """The job's processes are up: it joins its group's round-robin (again, after a restart)."""
        with _errors_as_http():
            return control.activate(name)

    @app.post("/v1/jobs/{name}/complete", response_model=JobView, dependencies=guarded, responses=lifecycle)
    def complete_job(name: JobName) -> dict[str, Any]:
        """The job ran all its iterations: it leaves its group, unused nodes are released."""
        with _errors_as_http():
            return control.complete(name)

    @app.post("/v1/jobs/{name}/phases/{phase}/acquire", response_model=Grant, dependencies=guarded, responses=lifecycle)
    def acquire_phase(
        name: JobName, phase: Phase, wait_s: Annotated[float, Query(ge=0, le=MAX_WAIT_S)] = 10.0
    ) -> dict[str, Any]:
        """Long poll: the phase's nodes once the group's round-robin grants it to this job, or
        ``granted: false`` after ``wait_s`` seconds (ask again)."""
        with _errors_as_http():
            nodes = control.acquire(name, phase, wait_s)
        return {"granted": nodes is not None, "nodes": list(nodes or ())}

    @app.post("/v1/jobs/{name}/phases/{phase}/release", dependencies=guarded, responses=lifecycle)
    def release_phase(name: JobName, phase: Phase, done: PhaseDone) -> dict[str, str]:
        """The phase is over: it is recorded and its nodes go to the next job in turn."""
        with _errors_as_http():
            control.release(name, phase, done.busy_s)
        return {"status": "released"}

    @app.get("/v1/jobs/{name}/phases", response_model=list[PhaseEvent], dependencies=guarded, responses=failures)
    def list_phases(name: JobName) -> list[dict[str, Any]]:
        """Every phase the job reported, in order."""
        with _errors_as_http():
            return control.phases(name)

    @app.get("/v1/groups", response_model=list[GroupView], dependencies=guarded, responses={401: {"model": Problem}})
    def list_groups() -> list[dict[str, Any]]:
        return control.groups()

    @app.get("/v1/nodes", response_model=list[NodeView], dependencies=guarded, responses={401: {"model": Problem}})
    def list_nodes() -> list[dict[str, Any]]:
        return control.nodes()

    @app.get("/v1/cluster", response_model=ClusterSummary, dependencies=guarded, responses={401: {"model": Problem}})
    def cluster_summary() -> dict[str, Any]:
        """Nodes per pool, cost rate, busy and bubble fractions."""
        return control.summary()

    @app.get("/metrics", response_class=PlainTextResponse, dependencies=guarded, responses={401: {"model": Problem}})
    def metrics() -> PlainTextResponse:
        """Prometheus exposition format."""
        return PlainTextResponse(generate_latest(registry).decode(), media_type="text/plain; version=0.0.4")

    @app.get("/openapi.json", dependencies=guarded, include_in_schema=False)
    def openapi_schema() -> dict[str, Any]:
        """The OpenAPI schema of this API (behind the token, like everything else)."""
        return app.openapi()

    @app.get("/healthz", dependencies=guarded, responses={401: {"model": Problem}})
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    return app
