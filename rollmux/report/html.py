"""``rollmux report RESULTS.json``: one HTML page (and its PNGs) for a cluster owner.

Reads the JSON that ``rollmux replay --json`` writes (the live system next to the
simulator: realised and simulated cost rate on one plot, the agreement, every move and its
pause) or the JSON that ``rollmux simulate --json`` writes, and draws for the latter: cost rate over time per
policy, nodes per pool over time, busy fraction per pool, the CDF of slowdowns against
SLOs, and the Gantt chart of one group's meta-iterations. Every number on the page comes
from the file.
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from rollmux.core.roundrobin import Seat, timeline  # noqa: E402
from rollmux.core.turns import PhaseRecord  # noqa: E402
from rollmux.inputs.errors import InputError, read_json  # noqa: E402
from rollmux.report.plots import cost_rate_plot, save_figure  # noqa: E402
from rollmux.report.timeline import gantt  # noqa: E402

DAY = 86400.0
REQUIRED = ("policies", "cost_rate", "nodes_over_time", "jobs", "example_group", "reference")


def load_results(path: Path) -> dict[str, Any]:
    data = read_json(path)
    missing = [key for key in REQUIRED if not isinstance(data, dict) or key not in data]
    if missing:
        raise InputError(path, "not a `rollmux simulate --json` result", field=missing[0])
    return data


def nodes_plot(data: dict[str, Any], path: Path) -> Path:
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8), constrained_layout=True, sharey=True)
    for policy, points in data["nodes_over_time"].items():
        if not points:
            continue
        days = [t / DAY for t, _, _ in points]
        for ax, column in zip(axes, (1, 2), strict=True):
            ax.step(days, [p[column] for p in points], where="post", label=policy, linewidth=1.1)
    for ax, pool in zip(axes, ("rollout", "training"), strict=True):
        ax.set_title(f"{pool} nodes held")
        ax.set_xlabel("days")
        ax.grid(alpha=0.3)
    axes[0].legend()
    return save_figure(fig, path, dpi=110)


def busy_plot(data: dict[str, Any], path: Path) -> Path:
    policies = list(data["policies"])
    fig, ax = plt.subplots(figsize=(7, 3.6), constrained_layout=True)
    width = 0.38
    for k, pool in enumerate(("rollout", "train")):
        values = [100 * data["policies"][p][f"{pool}_busy_fraction"] for p in policies]
        ax.bar([i + (k - 0.5) * width for i in range(len(policies))], values, width, label=pool)
    ax.set_xticks(range(len(policies)), policies)
    ax.set_ylabel("busy share of held node-time (%)")
    ax.set_ylim(0, 100)
    ax.legend()
    ax.grid(axis="y", alpha=0.3)
    return save_figure(fig, path, dpi=110)


def slowdown_cdf(data: dict[str, Any], path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(7, 4), constrained_layout=True)
    for policy, jobs in data["jobs"].items():
        values = sorted(j["slowdown"] for j in jobs.values())
        if values:
            ax.step(values, [(i + 1) / len(values) for i in range(len(values))], where="post", label=policy)
    slos = sorted(j["slo"] for j in data["jobs"][data["reference"]].values())
    if slos:
        ax.step(
            slos,
            [(i + 1) / len(slos) for i in range(len(slos))],
            where="post",
            color="black",
            linestyle="--",
            label="SLOs",
        )
    ax.set_xlabel("job slowdown (time-averaged)")
    ax.set_ylabel("share of jobs")
    ax.grid(alpha=0.3)
    ax.legend()
    return save_figure(fig, path, dpi=110)


def group_gantt(data: dict[str, Any], path: Path, iterations: int = 3) -> Path | None:
    """The largest group's first meta-iterations, drawn like a run's Gantt chart."""
    example = data["example_group"]
    if not example:
        return None
    seats = [
        Seat(
            e["rollout_s"],
            e["train_s"],
            tuple(e["rollout_nodes"]),
            tuple(e["train_nodes"]),
            e.get("tail_share", 0.0),
            e.get("tail_width", 0),
        )
        for e in example
    ]
    phases = [
        PhaseRecord(
            example[r.seat]["job"], r.phase, r.iteration, r.nodes, r.start, r.start, r.start, r.end, r.end, 0, 0
        )
        for r in timeline(seats, iterations)
    ]
    return gantt(
        phases, path, f"largest group of {data['reference']}: {iterations} meta-iterations (hatched: training)"
    )


def _summary_table(data: dict[str, Any]) -> str:
    columns = (
        "cost_usd",
        "cost_usd_per_hour",
        "work_efficiency",
        "slo_attainment",
        "mean_slowdown",
        "p99_slowdown",
        "migrations",
    )
    head = "".join(f"<th>{html.escape(c)}</th>" for c in ("policy", *columns))
    rows = []
    for policy, summary in data["policies"].items():
        cells = "".join(f"<td>{summary.get(c, 0):,.4g}</td>" for c in columns)
        rows.append(f"<tr><td>{html.escape(policy)}</td>{cells}</tr>")
    return f"<table><tr>{head}</tr>{''.join(rows)}</table>"


def is_replay(data: Any) -> bool:
    return isinstance(data, dict) and "realised" in data and "simulated" in data


def replay_cost_plot(data: dict[str, Any], path: Path) -> Path:
    """Realised (live) and simulated cost rate of one replay on one plot."""
    series = {"realised (live)": data["realised"]["cost_rate"], "simulated": data["simulated"]["cost_rate"]}
    title = f"Replay of {data['jobs']} jobs at 1/{data['time_scale']:g} time: live system against simulator"
    return cost_rate_plot(series, path, title)


def _replay_tables(data: dict[str, Any]) -> str:
    rows = "".join(
        f"<tr><td>{html.escape(key.removesuffix('_realised_over_simulated'))}</td>"
        f"<td>{data['realised'][key.removesuffix('_realised_over_simulated')]:,.4g}</td>"
        f"<td>{data['simulated'][key.removesuffix('_realised_over_simulated')]:,.4g}</td>"
        f"<td>{value:,.3f}</td></tr>"
        for key, value in data["agreement"].items()
        if value is not None
    )
    moves = "".join(
        f"<tr><td>{html.escape(m['job'])}</td><td>{html.escape(m['reason'])}</td><td>{m['at_h']:,.2f}</td>"
        f"<td>{m['pause_s']:,.1f}</td><td>{html.escape(m['outcome'])}</td></tr>"
        for m in data["realised"].get("moves", [])
    )
    return (
        "<table><tr><th>figure</th><th>realised</th><th>simulated</th><th>realised / simulated</th></tr>"
        f"{rows}<tr><td>overlaps</td><td>{len(data['overlaps'])}</td><td>0</td><td></td></tr></table>"
        "<h2>Moves of running jobs</h2><table><tr><th>job</th><th>why</th><th>trace hour</th>"
        f"<th>pause (trace s)</th><th>outcome</th></tr>{moves}</table>"
    )


def _render_replay(data: dict[str, Any], source: Path, out_dir: Path) -> str:
    picture = replay_cost_plot(data, out_dir / "cost-rate.png")
    return (
        f"<h1>RollMux replay: {html.escape(source.name)}</h1>{_replay_tables(data)}"
        f"<h2>Cost rate, live and simulated</h2><img src='{picture.name}' alt='cost rate'>"
    )


def render(results: Path, out_dir: Path) -> Path:
    """Write index.html and its pictures into ``out_dir``; returns the page's path."""
    data = read_json(results)
    out_dir.mkdir(parents=True, exist_ok=True)
    body = _render_replay(data, Path(results), out_dir) if is_replay(data) else _render_simulation(results, out_dir)
    page = (
        "<!doctype html><html><head><meta charset='utf-8'><title>RollMux report</title>"
        "<style>body{font-family:sans-serif;max-width:1150px;margin:2em auto}img{max-width:100%}"
        "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}</style>"
        f"</head><body>{body}</body></html>"
    )
    index = out_dir / "index.html"
    index.write_text(page)
    return index


def _render_simulation(results: Path, out_dir: Path) -> str:
    data = load_results(results)
    pictures = [
        ("Cost rate over time", cost_rate_plot(data["cost_rate"], out_dir / "cost-rate.png", "Cost rate per policy")),
        ("Nodes per pool over time", nodes_plot(data, out_dir / "nodes.png")),
        ("Busy fraction per pool", busy_plot(data, out_dir / "busy.png")),
        ("Slowdowns against SLOs", slowdown_cdf(data, out_dir / "slowdown-cdf.png")),
        ("One group's meta-iterations", group_gantt(data, out_dir / "group-gantt.png")),
    ]
    figures = "".join(
        f"<h2>{html.escape(title)}</h2><img src='{picture.name}' alt='{html.escape(title)}'>"
        for title, picture in pictures
        if picture is not None
    )
    return f"<h1>RollMux report: {html.escape(Path(results).name)}</h1>{_summary_table(data)}{figures}"
