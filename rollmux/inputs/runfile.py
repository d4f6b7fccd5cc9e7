"""``rollmux run`` files: which jobs to run on which Ray cluster, validated at the edge."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from rollmux.core.placement import POLICIES
from rollmux.core.spec import JobSpec, PhaseTime
from rollmux.inputs.jobfile import NAME_PATTERN, load_yaml_model, refuse_duplicates


class GRPOFields(BaseModel):
    """Hyper-parameters of the shipped GRPO job (see ``rollmux.jobs.grpo.GRPOConfig``)."""

    model_config = ConfigDict(extra="forbid")
    seed: int = Field(default=0, ge=0)
    operands: int = Field(default=2, ge=2, le=8)
    answer_digits: int = Field(default=1, ge=1, le=2)
    prompts_per_iteration: int = Field(default=64, ge=1, le=65536)
    group_size: int = Field(default=8, ge=2, le=256)
    train_groups: int = Field(default=64, ge=1)
    d_model: int = Field(default=64, ge=8, le=1024)
    layers: int = Field(default=2, ge=1, le=24)
    heads: int = Field(default=4, ge=1, le=32)
    lr: float = Field(default=3e-3, gt=0, le=1)
    clip: float = Field(default=0.2, gt=0, le=1)
    entropy_coef: float = Field(default=0.1, ge=0)
    epochs: int = Field(default=1, ge=1, le=16)
    threads: int = Field(default=1, ge=1, le=64)

    @model_validator(mode="after")
    def _heads_divide_width(self) -> GRPOFields:
        if self.d_model % self.heads:
            raise ValueError(f"d_model {self.d_model} is not a multiple of heads {self.heads}")
        return self


class RunJob(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(pattern=NAME_PATTERN)
    kind: Literal["grpo"] = "grpo"
    iterations: int = Field(ge=1, le=1_000_000)
    slo: float = Field(default=1.5, ge=1)
    rollout_s: float = Field(default=1.0, gt=0, description="planning estimate until phases are measured")
    train_s: float = Field(default=1.0, gt=0, description="planning estimate until phases are measured")
    grpo: GRPOFields = Field(default_factory=GRPOFields)

    def spec(self) -> JobSpec:
        return JobSpec(self.name, PhaseTime.fixed(self.rollout_s), PhaseTime.fixed(self.train_s), slo=self.slo)


class ClusterFields(BaseModel):
    model_config = ConfigDict(extra="forbid")
    ray_address: str | None = Field(default=None, description="join this Ray cluster instead of starting one")
    rollout_nodes: int = Field(default=1, ge=1, le=1024, description="logical rollout nodes of a local Ray")
    train_nodes: int = Field(default=1, ge=1, le=1024, description="logical training nodes of a local Ray")
    host_memory_gb: float = Field(default=8.0, gt=0, description="residency limit per node")


class RunFile(BaseModel):
    model_config = ConfigDict(extra="forbid")
    policy: str = "rollmux"
    cluster: ClusterFields = Field(default_factory=ClusterFields)
    jobs: list[RunJob] = Field(min_length=1)

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


def load_run_file(path: Path) -> RunFile:
    return load_yaml_model(path, RunFile)
