"""Job specs, node types and the cost model: the vocabulary every other part speaks.

Plain frozen dataclasses: the core is pure, so these carry numbers only. Validation of
user input happens at the edges (``rollmux.inputs``) before anything reaches here.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import Enum


class Pool(str, Enum):
    """The two disaggregated pools of a RollMux cluster."""

    ROLLOUT = "rollout"
    TRAIN = "train"


class Planning(str, Enum):
    """Which phase time the planner trusts: the mean, or the pessimistic high quantile."""

    MEAN = "mean"
    HIGH = "high"


@dataclass(frozen=True)
class PhaseTime:
    """Distribution of one phase's duration in seconds: its mean and a high quantile.

    A fixed time is the degenerate case ``high == mean``. Rollout is long-tailed, so the
    planner may plan with ``high`` to keep SLOs in realisations and not only on average.
    """

    mean: float
    high: float | None = None
    high_quantile: float = 0.99

    def __post_init__(self) -> None:
        if self.mean < 0:
            raise ValueError(f"phase time mean must be >= 0, got {self.mean}")
        if self.high is not None and self.high < self.mean:
            raise ValueError(f"phase time high quantile {self.high} is below its mean {self.mean}")

    def planned(self, planning: Planning) -> float:
        """The duration the planner uses under ``planning``."""
        if planning is Planning.HIGH and self.high is not None:
            return self.high
        return self.mean

    @staticmethod
    def fixed(seconds: float) -> PhaseTime:
        return PhaseTime(mean=seconds, high=seconds)


@dataclass(frozen=True)
class JobSpec:
    """What the scheduler needs to know of one RL job.

    ``slo`` is the largest allowed slowdown of the job's iteration time relative to
    running alone on dedicated disaggregated nodes. ``colocated`` holds the phase times
    when both phases time-share training nodes (used by the co-located baseline only).
    """

    name: str
    rollout: PhaseTime
    train: PhaseTime
    slo: float
    rollout_width: int = 1
    train_width: int = 1
    rollout_mem_gb: float = 0.0
    train_mem_gb: float = 0.0
    colocated: tuple[PhaseTime, PhaseTime] | None = None
    kind: str = ""

    def __post_init__(self) -> None:
        if self.slo < 1.0:
            raise ValueError(f"job {self.name}: slo must be >= 1, got {self.slo}")
        if self.rollout_width < 1 or self.train_width < 1:
            raise ValueError(f"job {self.name}: phase widths must be >= 1")

    def solo_iteration(self, planning: Planning = Planning.MEAN) -> float:
        """Iteration time alone on dedicated disaggregated nodes: the slowdown's denominator."""
        return self.rollout.planned(planning) + self.train.planned(planning)

    def to_dict(self) -> dict:
        """Plain data (for a store or a wire); :meth:`from_dict` reverses it exactly."""
        return asdict(self)

    @staticmethod
    def from_dict(data: dict) -> JobSpec:
        colocated = data.get("colocated")
        return JobSpec(
            **{
                **data,
                "rollout": PhaseTime(**data["rollout"]),
                "train": PhaseTime(**data["train"]),
                "colocated": tuple(PhaseTime(**p) for p in colocated) if colocated else None,
            }
        )

    def width(self, pool: Pool) -> int:
        return self.rollout_width if pool is Pool.ROLLOUT else self.train_width

    def mem_gb(self, pool: Pool) -> float:
        return self.rollout_mem_gb if pool is Pool.ROLLOUT else self.train_mem_gb


TRAIN_GPU_HOUR_USD = 5.28
"""Published price of one training (H800) GPU-hour."""


@dataclass(frozen=True)
class NodeType:
    """A node model of one pool: its price, GPU count and host DRAM (for residency)."""

    name: str
    pool: Pool
    price_per_hour: float
    gpus: int = 8
    dram_gb: float = 1800.0


@dataclass(frozen=True)
class CostModel:
    """Node types of both pools plus the host-memory reserve kept free on every node.

    The default is the published model: a rollout (H20) node costs 1/3 of a training
    (H800) node and an H800 GPU-hour is $5.28.
    """

    rollout: NodeType = field(default_factory=lambda: NodeType("H20", Pool.ROLLOUT, 8 * TRAIN_GPU_HOUR_USD / 3))
    train: NodeType = field(default_factory=lambda: NodeType("H800", Pool.TRAIN, 8 * TRAIN_GPU_HOUR_USD))
    dram_reserve_gb: float = 200.0

    def node(self, pool: Pool) -> NodeType:
        return self.rollout if pool is Pool.ROLLOUT else self.train

    def price(self, pool: Pool) -> float:
        return self.node(pool).price_per_hour

    def usable_dram_gb(self, pool: Pool) -> float:
        return self.node(pool).dram_gb - self.dram_reserve_gb
