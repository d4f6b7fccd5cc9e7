"""Matplotlib figures of simulation results (headless: the Agg backend)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

DAY = 86400.0


def cost_rate_plot(series: Mapping[str, Sequence[tuple[float, float]]], path: Path, title: str) -> Path:
    """Step plot of each policy's cost rate ($/h) over trace time, one line per policy."""
    fig, ax = plt.subplots(figsize=(10, 4.5), constrained_layout=True)
    for policy, points in series.items():
        if not points:
            continue
        times = [t / DAY for t, _ in points]
        rates = [r for _, r in points]
        mean = _time_weighted_mean(points)
        ax.step(times, rates, where="post", label=f"{policy} (mean ${mean:,.0f}/h)", linewidth=1.2)
    ax.set_xlabel("days since the first event")
    ax.set_ylabel("provisioned cost ($/h)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _time_weighted_mean(points: Sequence[tuple[float, float]]) -> float:
    total = sum(r * (t1 - t0) for (t0, r), (t1, _) in zip(points, points[1:], strict=False))
    span = points[-1][0] - points[0][0]
    return total / span if span > 0 else points[0][1]
