"""Run a plan of jobs on the one control plane and collect what happened.

``run_plan`` is ``rollmux run`` without the display: it submits the plan to a control
plane (the one given by URL, the one the Ray cluster already has, or one embedded here
with its state in the output folder), waits until every job of the plan ended, and reads
back their metrics and the phase log. Running the same plan again resumes it: the
control plane answers identical resubmissions with the jobs it has, restarts the ones
whose drivers are gone from their checkpoints, and reports the finished ones as done.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ray

from rollmux.core.control import ENDED_STATES, FAILED
from rollmux.core.spec import Pool
from rollmux.core.turns import PhaseRecord
from rollmux.inputs.runfile import RunFile
from rollmux.runtime.nodes import NAMESPACE, pool_resources
from rollmux.runtime.rayauth import settle_token_auth
from rollmux.service.client import Client


def start_ray(address: str | None = None, rollout_nodes: int = 1, train_nodes: int = 1) -> None:
    """Join the Ray cluster at ``address`` (with its token where it uses token
    authentication), or start a local instance offering this many logical nodes of each
    pool. Does nothing if Ray is already up in this process."""
    if ray.is_initialized():
        return
    if address:
        settle_token_auth(address)
        ray.init(address=address, namespace=NAMESPACE, log_to_driver=False)
        return
    ray.init(
        address="local",  # a new instance, even where another one's address file is left behind
        num_cpus=max(4, os.cpu_count() or 1),
        resources=pool_resources(rollout_nodes, train_nodes),
        include_dashboard=False,
        namespace=NAMESPACE,
        log_to_driver=False,
    )


@dataclass
class RunResult:
    histories: dict[str, list[dict[str, float]]] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    records: list[PhaseRecord] = field(default_factory=list)
    phase_log: list[dict[str, Any]] = field(default_factory=list)
    views: dict[str, dict[str, Any]] = field(default_factory=dict)
    summary: dict[str, Any] = field(default_factory=dict)
    url: str = ""


@dataclass(frozen=True)
class Target:
    """Where to submit: a running control plane, or None to embed one."""

    url: str | None = None
    token: str | None = None


def run_plan(
    run: RunFile,
    out: Path,
    target: Target | None = None,
    on_tick: Callable[[dict[str, dict[str, Any]], dict[str, Any]], None] | None = None,
    tick_s: float = 0.5,
) -> RunResult:
    """Submit the run file's jobs in one transaction and wait until all of them ended."""
    service = None
    if target is not None and target.url is not None:
        client = Client(target.url, target.token)
    else:
        client, service = _local_control_plane(run, out)
    try:
        client.request("POST", "/v1/plans", json={"jobs": [job.model_dump(mode="json") for job in run.jobs]})
        names = [job.name for job in run.jobs]
        views = _views(client, names)
        while True:
            summary = client.request("GET", "/v1/cluster")
            if on_tick:
                on_tick(views, summary)
            if all(v["state"] in ENDED_STATES for v in views.values()):
                break
            time.sleep(tick_s)
            views = _views(client, names)
        return _collect(client, names, views, summary)
    finally:
        if service is not None:
            service.stop()


def _local_control_plane(run: RunFile, out: Path):
    """The Ray cluster's control plane if it has one, else one embedded here (state in
    ``out/state``). Returns the client and the embedded service (None when joined)."""
    from rollmux.core.regroup import RegroupConfig
    from rollmux.runtime import registry
    from rollmux.runtime.warm import WarmOptions
    from rollmux.service.server import ServeOptions, Service

    cluster = run.cluster
    standby = cluster.standby_workers
    start_ray(cluster.ray_address, cluster.rollout_nodes + standby, cluster.train_nodes + standby)
    joined = registry.lookup()
    if joined is not None:
        return Client(joined["url"], joined["token"]), None
    options = ServeOptions(
        host="0.0.0.0" if cluster.ray_address else "127.0.0.1",
        port=0,
        state_dir=out / "state",
        policy=run.policy,
        ray_address=cluster.ray_address,
        lease_s=cluster.lease_s,
        host_memory_gb=cluster.host_memory_gb,
        gpus_per_node={Pool(pool): gpus for pool, gpus in cluster.gpus_per_node.items()},
        regroup=RegroupConfig() if cluster.regroup else None,
        slo_guard=cluster.slo_guard,
        warm=WarmOptions(standby_workers=standby),
    )
    service = Service(options).start()
    return Client(service.url, service.token), service


def _views(client: Client, names: list[str]) -> dict[str, dict[str, Any]]:
    return {name: client.request("GET", f"/v1/jobs/{name}") for name in names}


def _collect(client: Client, names: list[str], views: dict[str, dict[str, Any]], summary: dict) -> RunResult:
    result = RunResult(views=views, summary=summary, url=client.url)
    for name in names:
        result.histories[name] = client.request("GET", f"/v1/jobs/{name}/metrics")
        if views[name]["state"] == FAILED:
            result.errors[name] = views[name]["reason"]
        result.phase_log += client.request("GET", f"/v1/jobs/{name}/phases")
    result.records = phase_records(result.phase_log)
    return result


def phase_records(log: list[dict[str, Any]]) -> list[PhaseRecord]:
    """The released phases of a phase log as the timeline draws them, in grant order."""
    return sorted((_record(entry) for entry in log if entry["outcome"] == "released"), key=lambda r: r.granted)


def _record(entry: dict[str, Any]) -> PhaseRecord:
    """A released phase as the timeline draws it: server times, the holder's durations."""
    started = entry["granted_at"] + entry["wake_s"]
    return PhaseRecord(
        job=entry["job"],
        phase=entry["phase"],
        iteration=entry["iteration"],
        nodes=tuple(entry["nodes"]),
        requested=entry["requested_at"],
        granted=entry["granted_at"],
        started=started,
        ended=min(started + entry["busy_s"], entry["ended_at"]),
        released=entry["ended_at"],
        wake_s=entry["wake_s"],
        sleep_s=entry["sleep_s"],
    )
