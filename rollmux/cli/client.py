"""Tables and output of the CLI commands that talk to a running ``rollmux serve``."""

from __future__ import annotations

import json
from typing import Any

from rich.console import Console
from rich.table import Table


def jobs_table(jobs: list[dict[str, Any]]) -> Table:
    table = Table(title="jobs")
    columns = ("name", "state", "group", "rollout nodes", "train nodes", "slowdown", "SLO", "iterations", "cost $")
    for column in (*columns, "why"):
        table.add_column(column, justify="left" if column in ("name", "state", "why") else "right")
    for job in jobs:
        table.add_row(
            job["name"],
            job["state"],
            "-" if job["group_id"] is None else str(job["group_id"]),
            " ".join(map(str, job["rollout_nodes"])),
            " ".join(map(str, job["train_nodes"])),
            "-" if job["slowdown"] is None else f"{job['slowdown']:.3f}",
            f"{job['slo']:.2f}",
            str(job["iterations"]),
            f"{job['cost_usd']:.2f}",
            job["reason"],
        )
    return table


def groups_table(groups: list[dict[str, Any]]) -> Table:
    table = Table(title="co-execution groups")
    for column in ("group", "rollout nodes", "train nodes", "cycle s", "jobs (slowdown / SLO)"):
        table.add_column(column, justify="right" if column == "cycle s" else "left")
    for g in groups:
        jobs = ", ".join(f"{j['name']} {j['slowdown']:.3f}/{j['slo']:.2f}" for j in g["jobs"])
        table.add_row(
            str(g["id"]),
            " ".join(map(str, g["rollout_nodes"])),
            " ".join(map(str, g["train_nodes"])),
            f"{g['cycle_s']:.1f}",
            jobs,
        )
    return table


def emit(console: Console, data: Any, as_json: bool, table: Table | None = None) -> None:
    if as_json:
        console.print_json(json.dumps(data))
    elif table is not None:
        console.print(table)
