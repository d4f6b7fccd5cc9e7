"""Job specs, node types and the cost model: the vocabulary every other part speaks.

Plain frozen dataclasses: the core is pure, so these carry numbers only. Validation of
user input happens at the edges (``rollmux.inputs``) before anything reaches here.
"""

from __future__ import annotations

import math
import random
from dataclasses import asdict, dataclass, field
from enum import Enum
from statistics import NormalDist


class Pool(str, Enum):
    """The two disaggregated pools of a RollMux cluster."""

    ROLLOUT = "rollout"
    TRAIN = "train"


class Planning(str, Enum):
    """Which phase time the planner trusts: the mean, a quantile, or the worst-case bound."""

    MEAN = "mean"
    P90 = "p90"
    P95 = "p95"
    P99 = "p99"
    HIGH = "high"


DEFAULT_PLANNING = Planning.P95
"""Plan with each phase's 95th percentile: on the production trace with rollout CV 0.3 this
keeps SLO attainment above 99 %, while the mean does not (bench/stochastic.py)."""

PLANNING_QUANTILE = {Planning.P90: 0.90, Planning.P95: 0.95, Planning.P99: 0.99}
WORST_CASE_QUANTILE = 0.999
"""The worst-case bound of an unbounded (lognormal) phase time: its 99.9th percentile."""


@dataclass(frozen=True)
class PhaseTime:
    """Distribution of one phase's duration in seconds: lognormal with a mean and either a
    coefficient of variation ``cv`` or a high quantile ``high`` (at ``high_quantile``).

    A fixed time is the degenerate case (``cv == 0`` and ``high`` absent or equal to the
    mean). Rollout is long-tailed, so the planner may plan with a high quantile to keep
    SLOs in realisations and not only on average.
    """

    mean: float
    high: float | None = None
    high_quantile: float = 0.99
    cv: float = 0.0

    def __post_init__(self) -> None:
        if self.mean < 0:
            raise ValueError(f"phase time mean must be >= 0, got {self.mean}")
        if self.high is not None and self.high < self.mean:
            raise ValueError(f"phase time high quantile {self.high} is below its mean {self.mean}")
        if self.cv < 0:
            raise ValueError(f"coefficient of variation must be >= 0, got {self.cv}")

    @property
    def sigma(self) -> float:
        """Shape of the lognormal: from ``cv`` if given, else solved from ``high``."""
        if self.cv > 0:
            return math.sqrt(math.log1p(self.cv**2))
        if self.high is None or self.high <= self.mean or self.mean <= 0:
            return 0.0
        z = NormalDist().inv_cdf(self.high_quantile)
        # mean fixed: ln(high / mean) = z * sigma - sigma^2 / 2, the smaller root.
        return z - math.sqrt(max(0.0, z * z - 2 * math.log(self.high / self.mean)))

    def quantile(self, q: float) -> float:
        sigma = self.sigma
        if sigma == 0:
            return self.mean
        return self.mean * math.exp(NormalDist().inv_cdf(q) * sigma - sigma * sigma / 2)

    def sample(self, rng: random.Random) -> float:
        """One realised duration, drawn from ``rng`` (reproducible by its seed)."""
        sigma = self.sigma
        if sigma == 0:
            return self.mean
        return rng.lognormvariate(math.log(self.mean) - sigma * sigma / 2, sigma)

    def planned(self, planning: Planning) -> float:
        """The duration the planner uses under ``planning``."""
        if planning is Planning.MEAN:
            return self.mean
        if planning is Planning.HIGH:
            return max(self.high or 0.0, self.quantile(WORST_CASE_QUANTILE))
        return self.quantile(PLANNING_QUANTILE[planning])

    def with_cv(self, cv: float) -> PhaseTime:
        """The same mean with a lognormal spread of coefficient of variation ``cv``."""
        return PhaseTime(mean=self.mean, cv=cv)

    @staticmethod
    def fixed(seconds: float) -> PhaseTime:
        return PhaseTime(mean=seconds, high=seconds)


@dataclass(frozen=True)
class RolloutTail:
    """The long tail of a job's rollout and its migration (DESIGN.md 5b).

    Response lengths are long-tailed: once ``threshold`` of a rollout's requests are done,
    the unfinished ones move onto ``nodes`` of the job's rollout nodes, which run the last
    ``share`` of the rollout's time, plus ``resume_s`` for the moved requests to resume
    there (their prompts and tokens so far prefilled again). The job's other rollout nodes
    are free from that moment for the next rollout in the group's turns, which starts on
    the nodes it gets and takes the others as they come free (engines pulling requests from
    the job's queue: the head's work is shared out over the nodes it has). A rollout on no
    more than ``nodes`` nodes, or co-located, has no tail to move and runs as if it had none.
    """

    share: float
    nodes: int = 1
    threshold: float = 0.8
    resume_s: float = 0.0

    def __post_init__(self) -> None:
        if not 0.0 <= self.share < 1.0:
            raise ValueError(f"tail share must be in [0, 1), got {self.share}")
        if self.nodes < 1:
            raise ValueError(f"tail nodes must be >= 1, got {self.nodes}")
        if not 0.0 < self.threshold < 1.0:
            raise ValueError(f"tail threshold must be in (0, 1), got {self.threshold}")
        if self.resume_s < 0:
            raise ValueError(f"tail resume_s must be >= 0, got {self.resume_s}")

    @staticmethod
    def lognormal_share(sigma: float, requests: int, threshold: float = 0.8) -> float:
        """The share of a rollout's time its last ``1 - threshold`` of requests take when
        response lengths are lognormal of shape ``sigma`` and all ``requests`` decode at
        once at one pace (a batch that fits its engines): the rollout ends with its longest
        response (its expected order statistic, by Blom's approximation) and the threshold
        is reached at that quantile of the lengths. An assumed distribution, named as such
        wherever a share from it is used."""
        if sigma < 0 or requests < 1 or not 0.0 < threshold < 1.0:
            raise ValueError("sigma must be >= 0, requests >= 1 and threshold in (0, 1)")
        longest = NormalDist().inv_cdf((requests - 0.375) / (requests + 0.25)) if requests > 1 else 0.0
        return max(0.0, 1.0 - math.exp(sigma * (NormalDist().inv_cdf(threshold) - longest)))

    def applies(self, width: int) -> bool:
        """Whether a rollout ``width`` nodes wide frees any node by moving its tail."""
        return width > self.nodes and self.share > 0

    def rollout_s(self, planned: float) -> float:
        """The rollout's time with its tail moved: the resumption added."""
        return planned + self.resume_s

    def tail_s(self, planned: float) -> float:
        """Seconds at the end of the rollout in which only the tail nodes work."""
        return self.share * planned + self.resume_s


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
    iterations: int | None = None
    """Iterations the job runs in all, when it says (None: it runs until it ends): how long it
    is expected to run on, which a move of it must repay its price within."""
    tail: RolloutTail | None = None
    """Its rollout's long tail, moved onto fewer nodes (None: the rollout holds all its nodes
    to the end)."""

    def __post_init__(self) -> None:
        if self.slo < 1.0:
            raise ValueError(f"job {self.name}: slo must be >= 1, got {self.slo}")
        if self.rollout_width < 1 or self.train_width < 1:
            raise ValueError(f"job {self.name}: phase widths must be >= 1")
        if self.iterations is not None and self.iterations < 1:
            raise ValueError(f"job {self.name}: iterations must be >= 1, got {self.iterations}")

    @property
    def moves_tail(self) -> bool:
        """Whether its disaggregated rollout frees nodes before it ends."""
        return self.tail is not None and self.tail.applies(self.rollout_width)

    def rollout_node_seconds(self, rollout_s: float) -> float:
        """Node-seconds a disaggregated rollout of ``rollout_s`` planned seconds holds: all
        its nodes until the tail, the tail nodes to the end (and the resumption)."""
        if not self.moves_tail:
            return self.rollout_width * rollout_s
        tail = self.tail
        assert tail is not None
        whole = tail.rollout_s(rollout_s)
        return self.rollout_width * whole - (self.rollout_width - tail.nodes) * tail.tail_s(rollout_s)

    def rollout_from_node_seconds(self, node_s: float) -> float:
        """The planned rollout seconds that hold ``node_s`` node-seconds (the inverse of
        :meth:`rollout_node_seconds`): what an elastic rollout measured live is learnt
        as, since its time from grant to release depends on when it got its nodes."""
        if not self.moves_tail:
            return node_s / self.rollout_width
        tail = self.tail
        assert tail is not None
        width = self.rollout_width
        return max(0.0, node_s - tail.nodes * tail.resume_s) / (width - (width - tail.nodes) * tail.share)

    def solo_iteration(self) -> float:
        """Mean iteration time alone on dedicated disaggregated nodes: the slowdown's denominator."""
        return self.rollout.mean + self.train.mean

    def planned_rollout(self, planning: Planning) -> float:
        """Its disaggregated rollout's time as the planner sees it, a moved tail's
        resumption included."""
        rollout = self.rollout.planned(planning)
        return self.tail.rollout_s(rollout) if self.moves_tail and self.tail else rollout

    def planned_iteration(self, planning: Planning) -> float:
        """The job's own dependency chain as the planner sees it (disaggregated)."""
        return self.planned_rollout(planning) + self.train.planned(planning)

    @property
    def period_budget(self) -> float:
        """The longest period the job tolerates: its SLO times its mean solo iteration."""
        return self.slo * self.solo_iteration()

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
                "tail": RolloutTail(**data["tail"]) if data.get("tail") else None,
            }
        )

    def width(self, pool: Pool) -> int:
        return self.rollout_width if pool is Pool.ROLLOUT else self.train_width

    def mem_gb(self, pool: Pool) -> float:
        return self.rollout_mem_gb if pool is Pool.ROLLOUT else self.train_mem_gb


HOUR = 3600.0
"""Seconds in an hour: prices are per hour, every clock counts seconds."""

TRAIN_GPU_HOUR_USD = 5.28
"""Published price of one training (H800) GPU-hour."""

MOVE_HORIZON_S = 7200.0
"""Within how long regrouping expects a move's saving to repay its pause, lost work and
risk (or within the mover's remaining life, when shorter). Longer horizons trade moves for
dollars: on the production trace 8 hours at a $20 risk gives Solo / RollMux 1.969 with 1.78
moves a job, but the bursty and long-lived 300-job mixes then move 2.7-2.8 times a job,
where a burst soon changes the best grouping again (docs/results.md, "The move horizon")."""

MOVE_RISK_USD = 10.0
"""What regrouping charges each move beyond its pause (a transfer that fails, a restart,
work the model does not see): a move must repay it within the horizon, or within the
mover's remaining life when that is shorter. Chosen by measurement (docs/results.md): the
largest price tried that kept the production trace's Solo / RollMux at 1.95 or above
(1.951 on SLO seed 0), with 1.0-2.1 moves a job on the five 300-job mixes, before a move's
wait for its phase boundary was paid. With that wait paid, $10 gives 1.933 and at most 1.94
moves a job; $0 would give 1.952 and 3.1 moves a job on average (docs/results.md)."""

MOVE_RISK_GROWTH = 0.35
"""Share of ``MOVE_RISK_USD`` each earlier move of a job adds to the risk of its next,
counted past ``MOVE_RISK_GRACE``. With a 48-job neighbourhood, 0.35 past 2 moves came
closest to both of issue 27's bars on seed 0 before the wait for a boundary was paid: at
most 2.003 moves a job on the 300-job mixes, the production trace's Solo / RollMux at
1.952, each mix cheaper than with a flat price (docs/results.md)."""

MOVE_RISK_GRACE = 2
"""Moves of a job whose risk does not grow: growth counts only the earlier moves beyond these."""


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
