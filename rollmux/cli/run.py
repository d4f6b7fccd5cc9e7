"""``rollmux run``: real GRPO jobs multiplexed on Ray, with a live view and a timeline."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.table import Table

from rollmux.inputs.runfile import RunFile
from rollmux.jobs.grpo import GRPOConfig, GRPOJob
from rollmux.report.timeline import chrome_trace, gantt, reward_curves
from rollmux.runtime.control import RuntimeConfig
from rollmux.runtime.launch import RunResult, run_jobs, start_ray


def live_table(snapshot: dict[str, Any], totals: dict[str, int]) -> Table:
    table = Table(
        title=f"RollMux run — cost ${snapshot.get('cost_per_hour', 0):,.2f}/h, nodes {snapshot.get('nodes', {})}"
    )
    for column in ("job", "state", "iteration", "reward", "loss", "phase", "slowdown"):
        table.add_column(column, justify="left" if column in ("job", "state", "phase") else "right")
    for name, total in totals.items():
        job = snapshot.get("jobs", {}).get(name)
        if job is None:
            table.add_row(name, "submitted", f"0/{total}", "-", "-", "-", "-")
            continue
        metrics = job["metrics"]
        table.add_row(
            name,
            job["state"],
            f"{job['iteration']}/{total}",
            f"{metrics['reward']:.3f}" if "reward" in metrics else "-",
            f"{metrics['loss']:+.4f}" if "loss" in metrics else "-",
            job["phase"],
            f"{job['slowdown']:.3f}" if job.get("slowdown") else "-",
        )
    return table


def execute(run: RunFile, out: Path, console: Console, fresh: bool = False) -> RunResult:
    """Start or join Ray, run every job to the end with a live table, write the artefacts.

    Each job checkpoints into ``out/checkpoints/<job>.pt`` after every iteration; running
    the same file again resumes every job where it stopped (``fresh`` starts over).
    """
    start_ray(run.cluster.ray_address, run.cluster.rollout_nodes, run.cluster.train_nodes)
    checkpoints = out / "checkpoints"
    if fresh:
        for job in run.jobs:
            (checkpoints / f"{job.name}.pt").unlink(missing_ok=True)
    jobs = [
        (job.spec(), GRPOJob(GRPOConfig(**job.grpo.model_dump()), job.iterations, str(checkpoints / f"{job.name}.pt")))
        for job in run.jobs
    ]
    totals = {job.name: job.iterations for job in run.jobs}
    config = RuntimeConfig(policy=run.policy, host_limit_bytes=int(run.cluster.host_memory_gb * 2**30))
    with Live(live_table({}, totals), console=console, refresh_per_second=4) as live:
        result = run_jobs(jobs, config, on_tick=lambda snapshot: live.update(live_table(snapshot, totals)))
        live.update(live_table(result.snapshot, totals))
    out.mkdir(parents=True, exist_ok=True)
    (out / "run.json").write_text(
        json.dumps(
            {"histories": result.histories, "errors": result.errors, "phases": [asdict(r) for r in result.records]},
            indent=1,
        )
    )
    if result.records:
        chrome_trace(result.records, out / "timeline.json")
        gantt(result.records, out / "gantt.png", "RollMux run: phases per node (hatched: training)")
    if result.histories:
        reward_curves(result.histories, out / "rewards.png", "GRPO reward per iteration")
    return result
