"""Downtime of two multiplexed jobs when their training worker dies, three ways.

Two GRPO jobs share one rollout and one training node of a real ``rollmux serve`` on a
local Ray. In the middle of the run the training worker's process is SIGKILLed (a
failpoint at the start of a training step, after ``--kill-after`` steps of the two jobs),
and the two jobs recover:

- ``standby_buddy``: a standby worker per pool, jobs with ``replicas: 1`` — with one
  training node held, the core's buddy plan names the standby as both jobs' buddy, so
  the standby that takes the node over already holds both trainers' copies;
- ``standby_ckpt``: a standby per pool, no replicas — the roles are rebuilt from the last
  checkpoint (every ``--checkpoint-every`` iterations) on the standby;
- ``cold``: no standby — a new worker process is started for the node and the roles are
  rebuilt from the checkpoint.

For the job whose training was killed: downtime is the time from the kill (the instant
the failpoint fired) to its first phase granted after it recovered; steps lost are the
training steps it completed before the kill and had to train again. Both jobs' losses and
rewards are compared with the same training run alone in one process, without RollMux.
Last line: ``downtime_s standby_buddy=… standby_ckpt=… cold=… steps_lost=…`` (the buddy
mode's steps lost); target standby_buddy ≤ cold ÷ 10 and steps_lost 0.
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from rollmux.jobs.grpo import GRPOConfig, run_alone  # noqa: E402
from rollmux.wire.client import Client  # noqa: E402
from tests.test_failover import SEEDS as JOBS  # noqa: E402
from tests.test_failover import SMALL, grpo_pair, serve  # noqa: E402

MODES = {"standby_buddy": (1, 1), "standby_ckpt": (1, 0), "cold": (0, 0)}
"""mode -> (standby workers per pool, replicas per job)"""


@dataclass(frozen=True)
class Recovery:
    job: str
    downtime_s: float
    steps_lost: int
    resumed_from: str
    identical: bool


def run_mode(folder: Path, mode: str, iterations: int, kill_after: int, checkpoint_every: int) -> Recovery:
    standby, replicas = MODES[mode]
    service = serve(folder, "call:train", kill_after, standby)
    try:
        api = Client(service.url, service.token)
        api.request("POST", "/v1/plans", json={"jobs": grpo_pair(iterations, replicas, checkpoint_every)})
        views = wait_all_ended(api)
        failed = {n: v["reason"] for n, v in views.items() if v["state"] != "done"}
        if failed:
            raise SystemExit(f"{mode}: jobs did not finish: {failed}\n{service.errors()[-3000:]}")
        marker = folder / "killed"
        if not marker.exists():
            raise SystemExit(f"{mode}: the training worker was never killed (too few iterations?)")
        return recovery(api, marker.stat().st_mtime, iterations)
    finally:
        service.stop()


def wait_all_ended(api: Client, timeout_s: float = 600.0) -> dict[str, dict]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        views = {n: api.request("GET", f"/v1/jobs/{n}") for n in JOBS}
        if all(v["state"] in ("done", "failed", "cancelled") for v in views.values()):
            return views
        time.sleep(0.2)
    raise SystemExit("the jobs did not end within 10 minutes")


def recovery(api: Client, killed_at: float, iterations: int) -> Recovery:
    """What the kill cost the job whose training step it interrupted."""
    log = api.phase_log()
    held = [e for e in log if e["phase"] == "train" and e["granted_at"] <= killed_at <= e["ended_at"]]
    job = held[0]["job"]
    mine = [e for e in log if e["job"] == job]
    back = min(e["granted_at"] for e in mine if e["granted_at"] > killed_at)
    trained = {e["iteration"] for e in mine if e["phase"] == "train" and e["outcome"] == "released"}
    completed = len(
        [
            i
            for i in trained
            if any(e["iteration"] == i and e["phase"] == "train" and e["ended_at"] <= killed_at for e in mine)
        ]
    )
    running = [e for e in api.request("GET", f"/v1/jobs/{job}/events") if e["kind"] == "running"]
    resumed = int(re.search(r"from iteration (\d+)", running[-1]["detail"]).group(1))
    identical = all(same_as_alone(api, name, seed, iterations) for name, seed in JOBS.items())
    return Recovery(job, back - killed_at, completed - resumed, running[-1]["detail"], identical)


def same_as_alone(api: Client, name: str, seed: int, iterations: int) -> bool:
    served = [(m["loss"], m["reward"]) for m in api.request("GET", f"/v1/jobs/{name}/metrics")]
    alone = [(m["loss"], m["reward"]) for m in run_alone(GRPOConfig(seed=seed, **SMALL), iterations)]
    return served == alone


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=60)
    parser.add_argument("--kill-after", type=int, default=70, help="training steps (of both jobs) before the kill")
    parser.add_argument("--checkpoint-every", type=int, default=4)
    parser.add_argument("--modes", default=",".join(MODES))
    args = parser.parse_args()
    results = {}
    for mode in args.modes.split(","):
        with tempfile.TemporaryDirectory(prefix=f"failover-{mode}-") as folder:
            found = run_mode(Path(folder), mode, args.iterations, args.kill_after, args.checkpoint_every)
        results[mode] = found
        print(
            f"mode={mode} job={found.job} downtime_s={found.downtime_s:.3f} steps_lost={found.steps_lost} "
            f"resumed='{found.resumed_from}' losses_identical_to_alone={found.identical}",
            flush=True,
        )
    figures = " ".join(f"{mode}={r.downtime_s:.3f}" for mode, r in results.items())
    lost = results["standby_buddy"].steps_lost if "standby_buddy" in results else "n/a"
    print(f"downtime_s {figures} steps_lost={lost}")


if __name__ == "__main__":
    main()
