"""What a run did, for people: a Perfetto/Chrome trace, a Gantt chart, reward curves.

Works on plain phase records (job, phase, nodes, wall-clock times), so it is the same for
any job and any number of workers.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from rollmux.core.turns import PhaseRecord  # noqa: E402
from rollmux.report.plots import save_figure  # noqa: E402


def _origin(records: Sequence[PhaseRecord]) -> float:
    return min(r.granted for r in records)


def node_pools(records: Sequence[PhaseRecord]) -> dict[int, str]:
    """Each node's pool, read off the phases it served."""
    return {node: r.phase for r in records for node in r.nodes}


def chrome_trace(records: Sequence[PhaseRecord], path: Path) -> Path:
    """Chrome/Perfetto trace JSON: one track per node, a slice per phase plus its switches."""
    origin = _origin(records)
    pools = node_pools(records)
    events: list[dict] = [
        {"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "RollMux nodes"}},
    ]
    for node, pool in sorted(pools.items()):
        events.append(
            {"ph": "M", "name": "thread_name", "pid": 1, "tid": node, "args": {"name": f"{pool} node {node}"}}
        )
    for r in records:
        for node in r.nodes:
            for name, start, end in (
                ("wake", r.granted, r.started),
                (f"{r.job} {r.phase} #{r.iteration}", r.started, r.ended),
                ("sleep", r.ended, r.released),
            ):
                events.append(
                    {
                        "name": name,
                        "cat": r.phase if name.startswith(r.job) else "switch",
                        "ph": "X",
                        "pid": 1,
                        "tid": node,
                        "ts": (start - origin) * 1e6,
                        "dur": max(0.0, end - start) * 1e6,
                        "args": {"job": r.job, "iteration": r.iteration},
                    }
                )
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"traceEvents": events, "displayTimeUnit": "ms"}))
    return path


def gantt(records: Sequence[PhaseRecord], path: Path, title: str) -> Path:
    """One row per node, one colour per job; hatched bars are training phases."""
    origin = _origin(records)
    pools = node_pools(records)
    jobs = sorted({r.job for r in records})
    colours = {job: plt.get_cmap("tab10")(i % 10) for i, job in enumerate(jobs)}
    rows = sorted(pools, key=lambda n: (pools[n] != "rollout", n))
    fig, ax = plt.subplots(figsize=(12, 1.0 + 0.6 * len(rows)), constrained_layout=True)
    for r in records:
        for node in r.nodes:
            ax.barh(
                rows.index(node),
                r.ended - r.started,
                left=r.started - origin,
                color=colours[r.job],
                hatch="//" if r.phase == "train" else None,
                edgecolor="white",
                linewidth=0.4,
            )
    ax.set_yticks(range(len(rows)), [f"{pools[n]} node {n}" for n in rows])
    ax.invert_yaxis()
    ax.set_xlabel("seconds since the first grant")
    ax.set_title(title)
    handles = [plt.Rectangle((0, 0), 1, 1, color=colours[j]) for j in jobs]
    ax.legend(handles, jobs, loc="upper right", ncols=min(len(jobs), 6), fontsize=8)
    return save_figure(fig, path)


REWARD = "reward"
"""The metric a job reports its mean reward as; ``reward/NAME`` metrics name its parts
(a TRL job reports one per reward function)."""


def reward_label(histories: Mapping[str, Sequence[Mapping[str, float]]]) -> str:
    """The reward axis's label, from the jobs' own metric names: the reward functions
    their ``reward/NAME`` metrics name (summed into ``reward``), or ``reward`` alone."""
    keys = {key for h in histories.values() for m in h for key in m}
    parts = sorted(key.partition("/")[2] for key in keys if key.startswith(f"{REWARD}/"))
    return f"mean reward ({' + '.join(parts)})" if parts else f"mean {REWARD}"


def reward_limits(histories: Mapping[str, Sequence[Mapping[str, float]]]) -> tuple[float, float]:
    """The reward axis's range: every reported reward, with a margin (none is cut off)."""
    values = [m[REWARD] for h in histories.values() for m in h if REWARD in m]
    low, high = min(values, default=0.0), max(values, default=1.0)
    margin = 0.05 * (high - low) or 0.05 * max(1.0, abs(high))
    return low - margin, high + margin


def reward_curves(histories: Mapping[str, Sequence[Mapping[str, float]]], path: Path, title: str) -> Path:
    """Mean reward of every job that reports one, against iterations and against
    wall-clock seconds; labelled and scaled from what the jobs reported."""
    rewarded = {job: [m for m in h if REWARD in m] for job, h in histories.items()}
    rewarded = {job: h for job, h in rewarded.items() if h}
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), constrained_layout=True, sharey=True)
    for job, history in sorted(rewarded.items()):
        rewards = [m[REWARD] for m in history]
        axes[0].plot([m["iteration"] for m in history], rewards, label=job, linewidth=1.4)
        axes[1].plot([m["elapsed_s"] for m in history], rewards, label=job, linewidth=1.4)
    axes[0].set_xlabel("iteration")
    axes[1].set_xlabel("wall-clock seconds since the job started")
    axes[0].set_ylabel(reward_label(rewarded))
    axes[0].set_ylim(*reward_limits(rewarded))
    for ax in axes:
        ax.grid(alpha=0.3)
    if rewarded:
        axes[1].legend()
    fig.suptitle(title)
    return save_figure(fig, path)
