"""``rollmux run``: a plan of real jobs on the one control plane, with a live view and a
timeline."""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.table import Table

from rollmux.inputs.runfile import RunFile
from rollmux.report.timeline import chrome_trace, gantt, reward_curves
from rollmux.runtime.launch import RunResult, Target, run_plan


def live_table(views: dict[str, dict[str, Any]], summary: dict[str, Any], totals: dict[str, int]) -> Table:
    nodes = summary.get("nodes", {})
    table = Table(
        title=f"RollMux run — cost ${summary.get('cost_usd_per_hour', 0):,.2f}/h, "
        f"nodes rollout {nodes.get('rollout', 0)} train {nodes.get('train', 0)}, queued {summary.get('queued', 0)}"
    )
    for column in ("job", "state", "iteration", "reward", "loss", "phase", "slowdown", "restarts"):
        table.add_column(column, justify="left" if column in ("job", "state", "phase") else "right")
    for name, total in totals.items():
        job = views.get(name)
        if job is None:
            table.add_row(name, "submitting", f"0/{total}", "-", "-", "-", "-", "-")
            continue
        metrics = job.get("metrics") or {}
        state = job["state"] + (f" ({job['reason']})" if job["reason"] and job["state"] != "done" else "")
        table.add_row(
            name,
            state,
            f"{job['iterations']}/{total}",
            f"{metrics['reward']:.3f}" if "reward" in metrics else "-",
            f"{metrics['loss']:+.4f}" if "loss" in metrics else "-",
            job["phase"] or "-",
            f"{job['slowdown']:.3f}" if job.get("slowdown") else "-",
            str(job["restarts"]),
        )
    return table


def execute(run: RunFile, out: Path, console: Console, fresh: bool = False, target: Target | None = None) -> RunResult:
    """Run every job of the file to its end with a live table, then write the artefacts.

    Embedded, the control plane keeps its state (and the jobs' checkpoints) in
    ``out/state``: running the same file again resumes where it stopped, or reports the
    jobs done; ``fresh`` starts over.
    """
    if fresh:
        shutil.rmtree(out / "state", ignore_errors=True)
    totals = {job.name: job.iterations or 0 for job in run.jobs}
    with Live(live_table({}, {}, totals), console=console, refresh_per_second=4) as live:
        result = run_plan(
            run, out, target, on_tick=lambda views, summary: live.update(live_table(views, summary, totals))
        )
        for name, history in result.histories.items():
            if history:
                result.views[name]["metrics"] = history[-1]
        live.update(live_table(result.views, result.summary, totals))
    out.mkdir(parents=True, exist_ok=True)
    (out / "run.json").write_text(
        json.dumps(
            {
                "control_plane": result.url,
                "jobs": result.views,
                "histories": result.histories,
                "errors": result.errors,
                "phases": [asdict(r) for r in result.records],
                "phase_log": result.phase_log,
            },
            indent=1,
        )
    )
    if result.records:
        chrome_trace(result.records, out / "timeline.json")
        gantt(result.records, out / "gantt.png", "RollMux run: phases per node (hatched: training)")
    if any(result.histories.values()):
        reward_curves(result.histories, out / "rewards.png", "GRPO reward per iteration")
    return result
