"""Job specs as users write them (YAML/JSON), validated with pydantic at the edge.

``rollmux plan JOBS.yaml`` reads a :class:`JobFile`; the trace format reuses
:class:`JobFields` for its per-job columns. Errors name the file, the line of the
offending job in the YAML and the field.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from rollmux.core.spec import DEFAULT_PLANNING, CostModel, JobSpec, NodeType, PhaseTime, Planning, Pool, RolloutTail
from rollmux.inputs.errors import InputError, from_validation

M = TypeVar("M", bound=BaseModel)

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$"
"""Job names: letters, digits, '_', '.', '-'; never a path, a command or SQL text."""
MAX_PHASE_S = 1e7
MAX_WIDTH = 1024
MAX_MEM_GB = 1e6
MAX_SLO = 1000.0


def refuse_duplicates(names: list[str]) -> None:
    """Raise (as a validation error) on the first job name given twice."""
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise ValueError(f"job name {name!r} appears twice")
        seen.add(name)


class TailFields(BaseModel):
    """The long tail of a job's rollout and its migration (``tail:`` of a job): once
    ``threshold`` of a rollout's requests are done, the unfinished ones move onto ``nodes``
    of its rollout nodes and the others go to the next rollout in the group's turns."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    share: float = Field(ge=0, lt=1, description="share of the rollout's time its tail takes (planning)")
    nodes: int = Field(default=1, ge=1, le=MAX_WIDTH, description="rollout nodes that keep the tail")
    threshold: float = Field(default=0.8, gt=0, lt=1, description="share of requests done when the tail moves")
    resume_s: float = Field(default=0.0, ge=0, le=MAX_PHASE_S, description="seconds the moved requests take to resume")

    def to_tail(self) -> RolloutTail:
        return RolloutTail(self.share, self.nodes, self.threshold, self.resume_s)


class JobFields(BaseModel):
    """Phase times (mean and optional p99), widths, resident memory and SLO of one job."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    rollout_s: float = Field(ge=0, le=MAX_PHASE_S)
    train_s: float = Field(ge=0, le=MAX_PHASE_S)
    rollout_p99_s: float | None = Field(default=None, ge=0, le=MAX_PHASE_S)
    train_p99_s: float | None = Field(default=None, ge=0, le=MAX_PHASE_S)
    colo_rollout_s: float | None = Field(default=None, ge=0, le=MAX_PHASE_S)
    colo_train_s: float | None = Field(default=None, ge=0, le=MAX_PHASE_S)
    rollout_width: int = Field(default=1, ge=1, le=MAX_WIDTH)
    train_width: int = Field(default=1, ge=1, le=MAX_WIDTH)
    rollout_mem_gb: float = Field(default=0.0, ge=0, le=MAX_MEM_GB)
    train_mem_gb: float = Field(default=0.0, ge=0, le=MAX_MEM_GB)
    slo: float | None = Field(default=None, ge=1, le=MAX_SLO)
    tail: TailFields | None = None

    @model_validator(mode="after")
    def _consistent_times(self) -> JobFields:
        if self.rollout_p99_s is not None and self.rollout_p99_s < self.rollout_s:
            raise ValueError("rollout_p99_s is below rollout_s (the mean)")
        if self.train_p99_s is not None and self.train_p99_s < self.train_s:
            raise ValueError("train_p99_s is below train_s (the mean)")
        if self.rollout_s + self.train_s <= 0:
            raise ValueError("rollout_s + train_s must be positive")
        if (self.colo_rollout_s is None) != (self.colo_train_s is None):
            raise ValueError("give both colo_rollout_s and colo_train_s, or neither")
        return self

    def to_spec(self, name: str, slo: float) -> JobSpec:
        colo = None
        if self.colo_rollout_s is not None and self.colo_train_s is not None:
            colo = (PhaseTime.fixed(self.colo_rollout_s), PhaseTime.fixed(self.colo_train_s))
        return JobSpec(
            name=name,
            rollout=PhaseTime(self.rollout_s, self.rollout_p99_s or self.rollout_s),
            train=PhaseTime(self.train_s, self.train_p99_s or self.train_s),
            slo=slo,
            rollout_width=self.rollout_width,
            train_width=self.train_width,
            rollout_mem_gb=self.rollout_mem_gb,
            train_mem_gb=self.train_mem_gb,
            colocated=colo,
            tail=self.tail.to_tail() if self.tail is not None else None,
        )


class PlanJob(JobFields):
    name: str = Field(pattern=NAME_PATTERN)
    slo: float = Field(ge=1, le=MAX_SLO)


class CostFields(BaseModel):
    """Optional override of the published cost model."""

    model_config = ConfigDict(extra="forbid")
    rollout_price_per_hour: float = Field(default=CostModel().rollout.price_per_hour, gt=0)
    train_price_per_hour: float = Field(default=CostModel().train.price_per_hour, gt=0)
    rollout_dram_gb: float = Field(default=CostModel().rollout.dram_gb, gt=0)
    train_dram_gb: float = Field(default=CostModel().train.dram_gb, gt=0)
    dram_reserve_gb: float = Field(default=CostModel().dram_reserve_gb, ge=0)

    def to_model(self) -> CostModel:
        return CostModel(
            rollout=NodeType("rollout", Pool.ROLLOUT, self.rollout_price_per_hour, dram_gb=self.rollout_dram_gb),
            train=NodeType("train", Pool.TRAIN, self.train_price_per_hour, dram_gb=self.train_dram_gb),
            dram_reserve_gb=self.dram_reserve_gb,
        )


class JobFile(BaseModel):
    model_config = ConfigDict(extra="forbid")
    planning: Planning = DEFAULT_PLANNING
    cost: CostFields = Field(default_factory=CostFields)
    jobs: list[PlanJob] = Field(min_length=1)

    @model_validator(mode="after")
    def _unique_names(self) -> JobFile:
        refuse_duplicates([j.name for j in self.jobs])
        return self

    def specs(self) -> list[JobSpec]:
        return [j.to_spec(j.name, j.slo) for j in self.jobs]


def _line_of(node: yaml.Node | None, loc: tuple[Any, ...]) -> int | None:
    """1-based line of the YAML node at ``loc`` (or of its nearest existing parent)."""
    line = node.start_mark.line + 1 if node is not None else None
    for key in loc:
        if isinstance(node, yaml.MappingNode):
            node = next((v for k, v in node.value if k.value == key), None)
        elif isinstance(node, yaml.SequenceNode) and isinstance(key, int) and key < len(node.value):
            node = node.value[key]
        else:
            break
        if node is None:
            break
        line = node.start_mark.line + 1
    return line


def line_of(path: Path, loc: tuple[Any, ...]) -> int | None:
    """1-based line of the field at ``loc`` in a YAML (or JSON) file, or of its nearest
    existing parent; None where the file cannot be read."""
    try:
        return _line_of(yaml.compose(path.read_text()), loc)
    except (OSError, yaml.YAMLError, RecursionError):
        return None


def load_yaml_model(path: Path, model: type[M]) -> M:
    """Read a YAML file into ``model``; errors name the file, the YAML line and the field."""
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise InputError(path, "file not found") from None
    try:
        root = yaml.compose(text)
        raw = yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        line = mark.line + 1 if mark else None
        raise InputError(path, f"not valid YAML: {getattr(err, 'problem', err)}", line=line) from None
    except RecursionError:
        raise InputError(path, "nested too deeply to be a RollMux file") from None
    if not isinstance(raw, dict):
        raise InputError(path, "expected a mapping at the top level", line=1)
    try:
        return model.model_validate(raw)
    except ValidationError as err:
        raise from_validation(path, err, line=_line_of(root, err.errors()[0]["loc"])) from None


def load_job_file(path: Path) -> JobFile:
    return load_yaml_model(path, JobFile)
