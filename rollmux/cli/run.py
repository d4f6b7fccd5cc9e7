"""``rollmux run``: a plan of real jobs on the one control plane, with a live view and a
timeline."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.markup import escape
from rich.table import Table

from rollmux.core.control import ENDED_STATES
from rollmux.inputs.runfile import RunFile
from rollmux.live.launch import PlanRun, RunResult, Target, forget, node_records
from rollmux.report.timeline import chrome_trace, gantt, reward_curves


def live_table(
    views: dict[str, dict[str, Any]], summary: dict[str, Any], totals: dict[str, int], note: str = ""
) -> Table:
    nodes = summary.get("nodes", {})
    ended = any(job["state"] in ENDED_STATES and job.get("realised_slowdown") for job in views.values())
    legend = "*: slowdown as run (first turn to last, over busy time)" if ended else ""
    table = Table(
        title=f"RollMux run — cost ${summary.get('cost_usd_per_hour', 0):,.2f}/h, "
        f"nodes rollout {nodes.get('rollout', 0)} train {nodes.get('train', 0)}, queued {summary.get('queued', 0)}",
        caption="; ".join(text for text in (note, legend) if text) or None,
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
            slowdown(job),
            str(job["restarts"]),
        )
    return table


def slowdown(job: dict[str, Any]) -> str:
    """The planned slowdown while the job is in a group; once it ended, the one it ran at
    (marked ``*``); ``-`` before either is known."""
    if job.get("slowdown"):
        return f"{job['slowdown']:.3f}"
    if job["state"] in ENDED_STATES and job.get("realised_slowdown"):
        return f"{job['realised_slowdown']:.3f}*"
    return "-"


class Board:
    """What the live view shows: the run's jobs and the cluster's totals, with a caption
    while the control plane waits for other runs' jobs. Notes (the control plane moving,
    whom it waits for) are printed above it, so that a log keeps them too."""

    def __init__(self, live: Live, totals: dict[str, int]):
        self.live, self.totals = live, totals
        self.views: dict[str, dict[str, Any]] = {}
        self.summary: dict[str, Any] = {}
        self.caption = ""
        self._waited_for: list[str] = []
        self._said = ""

    def tick(self, views: dict[str, dict[str, Any]], summary: dict[str, Any]) -> None:
        self.views, self.summary = views, summary
        self._show()

    def say(self, note: str) -> None:
        """Print a note, once however often it is repeated in a row (a wait's every look)."""
        if note != self._said:
            self._said = note
            self.live.console.print(f"[yellow]{escape(note)}[/]", soft_wrap=True)

    def waiting(self, jobs: list[dict[str, Any]]) -> None:
        names = [job["name"] for job in jobs]
        if names != self._waited_for:
            self._waited_for = names
            self.say(
                f"control plane shared with other runs: waiting for {len(jobs)} job(s) ({', '.join(names)}) "
                "before stopping it; Ctrl-C stops it now, and the run of each of those jobs takes it over and "
                "resumes them from their checkpoints"
            )
        progress = ", ".join(f"{job['name']} {job['state']} at iteration {job['iterations']}" for job in jobs)
        self.caption = f"waiting for other runs' jobs before stopping the control plane: {progress}"
        self._show()

    def done(self) -> None:
        self.caption = ""
        self._show()

    def _show(self) -> None:
        self.live.update(live_table(self.views, self.summary, self.totals, self.caption))


def execute(run: RunFile, out: Path, console: Console, fresh: bool = False, target: Target | None = None) -> RunResult:
    """Run every job of the file to its end with a live table, then write the artefacts.

    Embedded, the control plane keeps its state (and the jobs' checkpoints) in
    ``out/state``: running the same file again resumes where it stopped, or reports the
    jobs done; ``fresh`` starts over. A joined one is named in ``out/control-plane.json``,
    so that a run of the same file finds its jobs there again. An embedded control plane
    that other runs' jobs still use stays up until they ended; interrupted meanwhile
    (Ctrl-C), it stops, and the result names those jobs.
    """
    if fresh:
        forget(out)
    totals = {job.name: job.iterations or 0 for job in run.jobs}
    with Live(live_table({}, {}, totals), console=console, refresh_per_second=4) as live:
        board = Board(live, totals)
        with PlanRun(run, out, target, on_note=board.say) as plan:
            result = plan.run(on_tick=board.tick)
            for name, history in result.histories.items():
                if history:
                    result.views[name]["metrics"] = history[-1]
            board.tick(result.views, result.summary)
            write_artefacts(result, out)
            try:
                plan.wait_for_others(on_wait=board.waiting)
            except KeyboardInterrupt:
                result.stopped_with = plan.others
            board.done()
    return result


def write_artefacts(result: RunResult, out: Path) -> None:
    """run.json, the Perfetto timeline, the Gantt chart and the reward curves."""
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
        drawn = node_records(result.phase_log)
        gantt(drawn, out / "gantt.png", "RollMux run: phases per node (hatched: training)")
    if any(result.histories.values()):
        reward_curves(result.histories, out / "rewards.png", "reward per iteration")
