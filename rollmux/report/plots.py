"""Matplotlib figures of simulation results (headless: the Agg backend)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

DAY = 86400.0


def save_figure(fig: plt.Figure, path: Path, dpi: int = 120) -> Path:
    """Write the figure as a PNG (its folder made if missing) and free it: pyplot keeps
    every open figure, and a long report would otherwise hold them all."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path


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
    return save_figure(fig, path)


def _time_weighted_mean(points: Sequence[tuple[float, float]]) -> float:
    total = sum(r * (t1 - t0) for (t0, r), (t1, _) in zip(points, points[1:], strict=False))
    span = points[-1][0] - points[0][0]
    return total / span if span > 0 else points[0][1]


def frontier_plot(
    points: Sequence[tuple[str, float, float]],
    path: Path,
    title: str,
    axes: tuple[str, str],
    target: tuple[float, float, str],
    target_label: str,
) -> Path:
    """One labelled point per setting, (label, x, y), and the target shaded: x at most
    ``target[0]`` and y at most (``"below"``) or at least (``"above"``) ``target[1]``, named ``target_label``.
    Where settings trade one figure for another, the frontier shows which targets any of
    them reaches together."""
    x_bar, y_bar, side = target
    if side not in ("below", "above"):
        raise ValueError(f"the target's side is 'below' or 'above', not {side!r}")
    fig, ax = plt.subplots(figsize=(7.5, 5), constrained_layout=True)
    ax.scatter([x for _, x, _ in points], [y for _, _, y in points], zorder=3)
    for label, x, y in points:
        ax.annotate(label, (x, y), textcoords="offset points", xytext=(5, 4), fontsize=8)
    ax.axvline(x_bar, linestyle="--", color="grey", linewidth=1)
    ax.axhline(y_bar, linestyle="--", color="grey", linewidth=1)
    (x_low, _), (y_low, y_high) = ax.get_xlim(), ax.get_ylim()
    y_far = min(y_low, y_bar) if side == "below" else max(y_high, y_bar)
    ax.fill_between([min(x_low, x_bar), x_bar], y_bar, y_far, color="tab:green", alpha=0.12, label=target_label)
    ax.set_xlim(left=x_low)
    ax.set_ylim(min(y_low, y_bar), max(y_high, y_bar))
    ax.set_xlabel(axes[0])
    ax.set_ylabel(axes[1])
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(loc="best")
    return save_figure(fig, path)
