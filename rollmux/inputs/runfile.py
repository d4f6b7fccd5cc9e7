"""What users submit to the control plane: one job, a plan of jobs, or a ``rollmux run`` file.

One pydantic model, :class:`JobSubmission`, validates a job wherever it comes from (the
HTTP API, a plan, a run file), so the same field gets the same error everywhere. A job is
run by RollMux (``kind: grpo``, or ``entrypoint: package.module:callable`` for a user's
job program) or by its owner, who takes its turns through the API (``kind: external``).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from rollmux.core.placement import POLICIES
from rollmux.core.spec import JobSpec
from rollmux.inputs.errors import MissingField
from rollmux.inputs.jobfile import MAX_SLO, PlanJob, load_yaml_model, refuse_duplicates

ENTRYPOINT_PATTERN = (
    r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$"
)
"""``package.module:callable`` (the callable may be ``Class.method``), as in entry points."""
GRPO_ENTRYPOINT = "rollmux.jobs.grpo:GRPOJob.from_context"
MAX_PLAN_JOBS = 1000
IMPLIED_GRPO = ", as it names no 'entrypoint'"
"""Why a run file's job without ``kind`` is the shipped GRPO job."""


class GRPOFields(BaseModel):
    """Hyper-parameters of the shipped GRPO job (see ``rollmux.jobs.grpo.GRPOConfig``)."""

    model_config = ConfigDict(extra="forbid")
    seed: int = Field(default=0, ge=0, le=2**31)
    operands: int = Field(default=2, ge=2, le=8)
    answer_digits: int = Field(default=1, ge=1, le=2)
    prompts_per_iteration: int = Field(default=64, ge=1, le=65536)
    group_size: int = Field(default=8, ge=2, le=256)
    train_groups: int = Field(default=64, ge=1, le=65536)
    d_model: int = Field(default=64, ge=8, le=1024)
    layers: int = Field(default=2, ge=1, le=24)
    heads: int = Field(default=4, ge=1, le=32)
    lr: float = Field(default=3e-3, gt=0, le=1)
    clip: float = Field(default=0.2, gt=0, le=1)
    entropy_coef: float = Field(default=0.1, ge=0, le=10)
    epochs: int = Field(default=1, ge=1, le=16)
    threads: int = Field(default=1, ge=1, le=64)

    @model_validator(mode="after")
    def _heads_divide_width(self) -> GRPOFields:
        if self.d_model % self.heads:
            raise ValueError(f"d_model {self.d_model} is not a multiple of heads {self.heads}")
        return self


class JobSubmission(PlanJob):
    """A job for the control plane: its planning fields, what runs it, and its policy knobs."""

    rollout_s: float = Field(default=1.0, ge=0, le=1e7, description="planning estimate until phases are measured")
    train_s: float = Field(default=1.0, ge=0, le=1e7, description="planning estimate until phases are measured")
    slo: float = Field(default=1.5, ge=1, le=MAX_SLO)
    kind: Literal["external", "grpo", "program"] = "external"
    entrypoint: str | None = Field(default=None, pattern=ENTRYPOINT_PATTERN, max_length=256)
    args: dict[str, Any] = Field(default_factory=dict, description="keyword arguments of the job program")
    iterations: int | None = Field(default=None, ge=1, le=10_000_000)
    grpo: GRPOFields | None = None
    max_restarts: int = Field(
        default=3, ge=0, le=100, description="restarts after a lost session or a platform failure before it fails"
    )
    checkpoint_every: int = Field(default=1, ge=1, le=1_000_000, description="iterations between checkpoints")
    replicas: Literal[0, 1] = Field(
        default=0, description="1: a copy of the trainer kept on a buddy node of the pool after every training phase"
    )
    priority: int = Field(default=0, ge=-1000, le=1000, description="higher is admitted first; FIFO within one")

    @model_validator(mode="after")
    def _program_is_complete(self) -> JobSubmission:
        if self.entrypoint is not None and self.kind != "program":
            self.kind = "program"
        if self.kind == "program" and self.entrypoint is None:
            raise ValueError("kind 'program' needs an entrypoint: package.module:callable")
        if self.kind == "grpo" and self.grpo is None:
            self.grpo = GRPOFields()
        if self.grpo is not None and self.kind != "grpo":
            raise ValueError("'grpo' hyper-parameters are only for kind 'grpo'")
        if self.args and self.kind != "program":
            raise ValueError("'args' are for a job program named by 'entrypoint'")
        if self.kind != "external" and self.iterations is None:
            implied = "" if "kind" in self.model_fields_set or self.kind != "grpo" else IMPLIED_GRPO
            raise MissingField(
                "iterations",
                f"job {self.name!r} (kind {self.kind}{implied}): field 'iterations' is required for a {self.kind} job",
            )
        if self.kind == "external" and (self.replicas or self.checkpoint_every != 1):
            raise ValueError("'replicas' and 'checkpoint_every' are for jobs RollMux runs (grpo, or an entrypoint)")
        return self

    @property
    def managed(self) -> bool:
        """RollMux starts and restarts the job's driver (else its owner runs it)."""
        return self.kind != "external"

    def spec(self) -> JobSpec:
        return replace(self.to_spec(self.name, self.slo), iterations=self.iterations)

    def program(self) -> dict[str, Any]:
        """What the driver needs to run the job; stored with it, and compared when the same
        name is submitted again (an identical resubmission is answered, not refused)."""
        return self.model_dump(mode="json")

    @property
    def callable_path(self) -> str | None:
        return GRPO_ENTRYPOINT if self.kind == "grpo" else self.entrypoint

    @property
    def program_args(self) -> dict[str, Any]:
        return self.grpo.model_dump() if self.grpo is not None else dict(self.args)


RUN_FILE_KEYS = ("policy", "cluster")
"""What only a run file has at its top level (a plan has ``jobs:`` alone)."""


def is_run_file(data: Any) -> bool:
    """Whether a file's content is a run file (``rollmux run``'s: the cluster and its jobs)
    rather than a job spec or a plan (``rollmux submit``'s, the HTTP API's)."""
    return isinstance(data, dict) and any(key in data for key in RUN_FILE_KEYS)


class Plan(BaseModel):
    """Several jobs submitted in one transaction (all accepted, or none)."""

    model_config = ConfigDict(extra="forbid")
    jobs: list[JobSubmission] = Field(min_length=1, max_length=MAX_PLAN_JOBS)

    @model_validator(mode="before")
    @classmethod
    def _not_a_run_file(cls, data: Any) -> Any:
        if is_run_file(data):
            raise ValueError(
                "this is a run file (it has 'policy' or 'cluster'), not a plan: `rollmux submit FILE` submits its "
                "jobs, `rollmux run FILE --url URL` runs them and follows them to their end"
            )
        return data

    @model_validator(mode="after")
    def _unique_names(self) -> Plan:
        refuse_duplicates([j.name for j in self.jobs])
        return self


class RunJob(JobSubmission):
    """A job of a run file: RollMux runs it, so it is the shipped GRPO job unless it names
    an entrypoint."""

    kind: Literal["grpo", "program"] = "grpo"


class ClusterFields(BaseModel):
    model_config = ConfigDict(extra="forbid")
    ray_address: str | None = Field(default=None, description="join this Ray cluster instead of starting one")
    rollout_nodes: int = Field(default=1, ge=1, le=1024, description="logical rollout nodes of a local Ray")
    train_nodes: int = Field(default=1, ge=1, le=1024, description="logical training nodes of a local Ray")
    host_memory_gb: float = Field(default=8.0, gt=0, le=1e5, description="residency limit per node")
    gpus_per_node: dict[str, float] = Field(
        default_factory=dict, description="GPUs each worker asks Ray for, per pool (e.g. {train: 8})"
    )
    lease_s: float = Field(default=10.0, ge=0.5, le=3600, description="a session not heard from for this long is lost")
    regroup: bool = Field(default=True, description="move running jobs when a re-placement pays for its move")
    slo_guard: bool = Field(default=True, description="move a job out of a group whose real times break an SLO")
    standby_workers: int = Field(
        default=0, ge=0, le=64, description="standby workers per pool (a local Ray offers them beyond the nodes)"
    )

    @field_validator("gpus_per_node")
    @classmethod
    def _pools(cls, value: dict[str, float]) -> dict[str, float]:
        unknown = set(value) - {"rollout", "train"}
        if unknown:
            raise ValueError(f"unknown pool {', '.join(sorted(unknown))}; pools are rollout and train")
        if any(v < 0 or v > 64 for v in value.values()):
            raise ValueError("GPUs per node must be between 0 and 64")
        return value


class RunFile(BaseModel):
    model_config = ConfigDict(extra="forbid")
    policy: str = "rollmux"
    cluster: ClusterFields = Field(default_factory=ClusterFields)
    jobs: list[RunJob] = Field(min_length=1, max_length=MAX_PLAN_JOBS)

    @field_validator("policy")
    @classmethod
    def _known_policy(cls, value: str) -> str:
        if value not in POLICIES:
            raise ValueError(f"unknown policy {value!r}; choose from {', '.join(POLICIES)}")
        return value

    @model_validator(mode="after")
    def _unique_names(self) -> RunFile:
        refuse_duplicates([j.name for j in self.jobs])
        return self

    def plan(self) -> dict[str, Any]:
        """The run's jobs as a plan for the control plane (``POST /v1/plans``): its policy
        and cluster are the embedded control plane's settings, not a plan's."""
        return {"jobs": [job.model_dump(mode="json") for job in self.jobs]}


def load_run_file(path: Path) -> RunFile:
    return load_yaml_model(path, RunFile)
