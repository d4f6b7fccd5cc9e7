"""The control plane's state machine: jobs, their placement and their phase turns.

Pure (no I/O, no clock, no Ray): the Ray actor of the runtime and the HTTP service both
wrap this one class, adding only what their host needs (an event loop and node
provisioning; a database and HTTP). Placement is the core's policy, the intra-group order
is ``fcfs_order`` and turns are ``CyclicTurns``, exactly what the simulator uses.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field
from typing import Any

from rollmux.core.cluster import Cluster, Group, Member, Placement, Removal
from rollmux.core.errors import PhaseOrderError
from rollmux.core.placement import Policy, place
from rollmux.core.roundrobin import ROLLOUT, TRAIN, fcfs_order
from rollmux.core.spec import JobSpec, PhaseTime, Pool
from rollmux.core.turns import CyclicTurns, JobNodes

PROFILE_WINDOW = 20
"""Measured phases kept per job and phase to re-estimate its profile."""


@dataclass
class JobStatus:
    state: str = "placed"
    phase: str = "-"
    iteration: int = 0
    metrics: dict[str, float] = field(default_factory=dict)
    error: str = ""


class ControlState:
    """Cluster state plus who may run which phase now, for one control plane."""

    def __init__(self, cluster: Cluster, policy: Policy):
        self.cluster = cluster
        self.policy = policy
        self.active: dict[int, list[str]] = {}
        self.turns: dict[int, CyclicTurns] = {}
        self.status: dict[str, JobStatus] = {}
        self.measured: dict[tuple[str, str], list[float]] = {}

    def submit(self, spec: JobSpec) -> Placement:
        """Place a job with the policy; it waits (``placed``) until activated."""
        placement = place(self.cluster, self.policy, spec)
        self.status[spec.name] = JobStatus()
        return placement

    def undo_submit(self, job: str) -> None:
        """Forget a placement whose nodes could not be provided: nothing half-done."""
        self.cluster.remove(job)
        del self.status[job]

    def member(self, job: str) -> Member:
        return next(m for m in self.cluster.group_of(job).members if m.job.name == job)

    def activate(self, job: str) -> None:
        """The job is ready to run: it joins its group's turn-taking."""
        group = self.cluster.group_of(job)
        self.active.setdefault(group.id, []).append(job)
        self._rebuild_turns(group)
        self.status[job].state = "running"

    def check_order(self, job: str, phase: str) -> None:
        """Refuse a phase out of order at once: waiting for it would wait forever."""
        group = self.cluster.group_of(job)
        if job not in self.active.get(group.id, []):
            raise PhaseOrderError(f"job {job} is not active: activate it before asking for phases")
        due = self.turns[group.id].next_phase[job]
        if phase != due:
            raise PhaseOrderError(f"job {job} asked for its {phase} phase, but its {due} phase comes first")

    def may_start(self, job: str, phase: str) -> bool:
        return self._turns_of(job).may_start(job, phase)

    def start(self, job: str, phase: str) -> tuple[int, ...]:
        nodes = self._turns_of(job).start(job, phase)
        self.status[job].phase = phase
        return nodes

    def finish(self, job: str, phase: str, busy_s: float) -> None:
        """The phase is over: its nodes go to the next job in turn; its duration is learnt."""
        self._turns_of(job).finish(job, phase)
        self.status[job].phase = "-"
        window = self.measured.setdefault((job, phase), [])
        window.append(busy_s)
        del window[:-PROFILE_WINDOW]
        if phase == TRAIN:
            self._update_profile(job)

    def progress(self, job: str, iteration: int, metrics: dict[str, float]) -> None:
        self.status[job].iteration = iteration
        self.status[job].metrics = dict(metrics)

    def complete(self, job: str, state: str = "done", error: str = "") -> Removal:
        """The job ended, failed or was cancelled: it leaves its turns and its group."""
        group = self.cluster.group_of(job)
        if job in self.active.get(group.id, []):
            self.active[group.id].remove(job)
        removal = self.cluster.remove(job)
        if group.id in self.cluster.groups and self.active.get(group.id):
            self._rebuild_turns(self.cluster.groups[group.id])
        else:
            self.turns.pop(group.id, None)
            self.active.pop(group.id, None)
        self.status[job].state = state
        self.status[job].error = error
        self.status[job].phase = "-"
        return removal

    def snapshot(self) -> dict[str, Any]:
        """Jobs, groups, nodes and cost rate, for displays, reports and the API."""
        slowdowns = self.cluster.slowdowns()
        return {
            "jobs": {name: {**asdict(s), "slowdown": slowdowns.get(name)} for name, s in self.status.items()},
            "groups": {
                g.id: {
                    "rollout_nodes": list(g.rollout_nodes),
                    "train_nodes": list(g.train_nodes),
                    "jobs": [m.job.name for m in g.members],
                    "cycle_s": g.schedule.cycle,
                }
                for g in self.cluster.groups.values()
            },
            "cost_per_hour": self.cluster.cost_per_hour(),
            "nodes": {pool.value: self.cluster.nodes(pool) for pool in Pool},
        }

    def _turns_of(self, job: str) -> CyclicTurns:
        return self.turns[self.cluster.group_of(job).id]

    def _rebuild_turns(self, group: Group) -> None:
        """Turns of the group's active jobs in the core's FCFS cyclic order."""
        active = [m for m in group.members if m.job.name in self.active.get(group.id, [])]
        seats = [m.seat(self.cluster.planning) for m in active]
        nodes = {m.job.name: JobNodes(m.rollout_nodes, m.train_nodes) for m in active}
        jobs = [m.job.name for m in active]
        self.turns[group.id] = CyclicTurns.build(jobs, nodes, fcfs_order(seats), self.turns.get(group.id))

    def _update_profile(self, job: str) -> None:
        """Feed measured phase durations back into the job's profile in the core."""
        times = {phase: self.measured.get((job, phase), []) for phase in (ROLLOUT, TRAIN)}
        if not all(times.values()):
            return
        profile = {phase: _profile(values) for phase, values in times.items()}
        self.cluster.update_phase_times(job, profile[ROLLOUT], profile[TRAIN])


def _profile(values: list[float]) -> PhaseTime:
    """Mean and a high quantile (p95, or the max of few samples) of measured durations."""
    mean = statistics.fmean(values)
    high = max(values) if len(values) < 20 else statistics.quantiles(values, n=20)[-1]
    return PhaseTime(mean=mean, high=max(high, mean), high_quantile=0.95)
