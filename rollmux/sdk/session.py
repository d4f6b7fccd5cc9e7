"""The phase API that job code uses: ``with rollmux.phase("rollout"):`` and friends.

A job's driver holds one :class:`Session`: its turn-taking with the control plane (a
:class:`~rollmux.wire.client.TurnSession`: epoch, lease, grants) and the workers of its
nodes. Entering a phase asks the control plane for the grant (blocking until the group's
round-robin gives this job its turn) and wakes the job's roles on the phase's nodes with
the grant's fencing token; leaving puts them back to sleep in host memory and hands the
phase back with what it measured. Processes stay alive throughout.

A job with replicas leaves its training phase in three steps before handing it back: the
trainer sleeps, a copy of it goes to its buddy (another worker of the pool, named by the
control plane from the core's buddy plan), and only then do the new
weights go to its rollouts. So a rollout never holds weights newer than the trainer's
newest copy, and a trainer restored from its replica is never behind its rollouts.
"""

from __future__ import annotations

import threading
import time
from contextlib import ContextDecorator
from dataclasses import replace
from typing import Any

import ray

from rollmux.core.errors import ResidencyExceeded
from rollmux.core.roundrobin import ROLLOUT, TRAIN
from rollmux.core.spec import RolloutTail
from rollmux.dataplane.nodes import buddy_of, worker_of
from rollmux.wire.client import Grant, TurnSession

PHASES = (ROLLOUT, TRAIN)
_attached = threading.local()
"""The session of the driver running in this thread (a driver host runs several)."""


class Session:
    """A job's connection to the control plane and to the workers of its placement."""

    def __init__(
        self,
        turns: TurnSession,
        workers: dict[int, Any],
        replicas: bool = False,
        restored: list[dict[str, float]] | None = None,
        tail: RolloutTail | None = None,
    ):
        self.turns = turns
        self.job = turns.job
        self.epoch = turns.epoch
        self.rollout_nodes: tuple[int, ...] = tuple(turns.info["rollout_nodes"])
        self.train_nodes: tuple[int, ...] = tuple(turns.info["train_nodes"])
        self.workers = workers
        self.began = time.time()
        self.grant: Grant | None = None
        self.handback_s = 0.0
        """Recent time from the end of a phase's work to its release (offload and the
        control plane's round trip), a moving average."""
        self._granted = 0.0
        self._started = 0.0
        self._wake_s = 0.0
        self._groups: dict[str, tuple[int, ...]] = {}
        """The nodes each wide phase's process group was built on."""
        self._generation = 0
        self.replicas = replicas and len(self.train_nodes) == 1
        """Copy the trainer to the pool's buddy after every training phase (one-node trainers)."""
        self.restored = restored
        self.tail = tail
        """The job's rollout tail as its spec gives it (None: it holds its rollout nodes to
        the end); the control plane plans with the same one."""
        """Every iteration's metrics, when this session resumed from a trainer that survived
        or came from its replica (None: it resumed from its checkpoint, or started)."""
        self._buddy: Any = None
        self._deferred_sync: ray.ObjectRef | None = None
        self._one_call: _OneCall | None = None
        """The phase held now is made of one call per node (see :class:`phase`)."""
        self._report: tuple[dict[str, float], int | None] | None = None
        """Metrics reported inside the phase held now: they go with its release."""

    @property
    def colocated(self) -> bool:
        """Both phases on the same nodes (its training nodes) where it sits now."""
        return self.rollout_nodes == self.train_nodes

    @property
    def iteration(self) -> int:
        return self.turns.iteration

    def workers_of(self, phase: str) -> list[Any]:
        """The workers of the job's nodes for ``phase``, where it sits now."""
        return [self._worker(n) for n in (self.rollout_nodes if phase == ROLLOUT else self.train_nodes)]

    def _granted_workers(self) -> list[Any]:
        """The workers of the phase held now: its grant names them."""
        assert self.grant is not None
        return [self._worker(n) for n in self.grant.nodes]

    def _worker(self, node: int) -> Any:
        if node not in self.workers:
            self.workers[node] = worker_of(node)
        return self.workers[node]

    def enter(self, phase: str, one_call: bool = False) -> None:
        """Wait for the grant of ``phase`` and wake the job's roles on its nodes; with
        ``one_call`` the roles stay asleep until the phase's one :meth:`call_all`."""
        if phase not in PHASES:
            raise ValueError(f"unknown phase {phase!r}; phases are {', '.join(PHASES)}")
        if self.grant is not None:
            raise RuntimeError(f"{self.job}: phase {phase} entered inside phase {self.grant.phase}")
        grant = self.turns.acquire(phase)
        self._granted = grant.granted_perf or time.perf_counter()
        self.grant = grant
        if grant.rollout_nodes or grant.train_nodes:  # the job may have moved since its last phase
            self.rollout_nodes, self.train_nodes = grant.rollout_nodes, grant.train_nodes
        self._one_call = _OneCall() if one_call else None
        if not one_call:
            wakes = [w.wake.remote(self.job, phase, self.epoch, grant.token) for w in self._granted_workers()]
            self._wake_s = max(ray.get(wakes))
        self._started = time.perf_counter()

    def leave(self, phase: str) -> None:
        grant = self.grant
        assert grant is not None and grant.phase == phase, f"{self.job}: left {phase} without holding it"
        workers = self._granted_workers()
        one_call, self._one_call = self._one_call, None
        if one_call is not None:
            wake_s, busy_s, sleep_s = one_call.timing
            self.grant = None
        else:
            wake_s, busy_s = self._wake_s, time.perf_counter() - self._started
            sleeps = [w.sleep.remote(self.job, phase, self.epoch, grant.token) for w in workers]
            self.grant = None
            sleep_s = max(ray.get(sleeps))
        if phase == TRAIN and self.replicas:
            self._replicate(workers[0], grant.token, grant.iteration + 1)
        if self._deferred_sync is not None:
            published, self._deferred_sync = self._deferred_sync, None
            self._deliver(published)
        report, self._report = self._report, None
        self.turns.release(grant, busy_s, wake_s, sleep_s, report)
        handback = time.perf_counter() - self._started - busy_s
        self.handback_s = handback if self.handback_s == 0 else 0.8 * self.handback_s + 0.2 * handback

    def widen(self) -> tuple[int, ...]:
        """The nodes the elastic rollout held now was widened onto since it last looked
        (the group's other rollouts freed them), their roles woken under its grant."""
        grant = self.grant
        if grant is None or grant.phase != ROLLOUT:
            raise RuntimeError(f"{self.job}: only a rollout under way widens")
        now = self.turns.current(ROLLOUT)
        added = tuple(node for node in now.nodes if node not in grant.nodes)
        if added:
            ray.get([self._worker(n).wake.remote(self.job, ROLLOUT, self.epoch, grant.token) for n in added])
            self.grant = replace(grant, nodes=grant.nodes + added)
        return added

    def shed(self, keep: tuple[int, ...]) -> None:
        """Give back every node of the rollout held now but ``keep`` (its tail moved onto
        those): the roles there sleep first, then the control plane hands the nodes on."""
        grant = self.grant
        if grant is None or grant.phase != ROLLOUT:
            raise RuntimeError(f"{self.job}: only a rollout under way sheds nodes")
        gone = [node for node in grant.nodes if node not in keep]
        ray.get([self._worker(n).sleep.remote(self.job, ROLLOUT, self.epoch, grant.token) for n in gone])
        self.grant = replace(grant, nodes=self.turns.shed(grant, keep).nodes)

    def submit(self, phase: str, node: int, method: str, *args: Any) -> ray.ObjectRef:
        """Start ``method`` of the job's role on one node of the phase held now, without
        waiting: a driver that spreads work over its nodes waits for what it needs."""
        if self.grant is None or self.grant.phase != phase or node not in self.grant.nodes:
            raise RuntimeError(f"{self.job}: {phase} role on node {node} called outside its grant")
        return self._worker(node).call.remote(self.job, phase, self.epoch, self.grant.token, method, *args)

    def since_grant(self) -> float:
        """Seconds since the current phase was granted (its wake included)."""
        return time.perf_counter() - self._granted

    def call(self, phase: str, method: str, *args: Any) -> ray.ObjectRef:
        """Run ``method`` of the job's role on the phase's first node and wait for it.

        Returns the result's reference, so large results (a rollout batch) can be passed
        to the other role without a copy through the driver.
        """
        if self.grant is None or self.grant.phase != phase:
            raise RuntimeError(f"{self.job}: {phase} role called outside its phase")
        if self._one_call is not None:
            raise RuntimeError(f"{self.job}: a one-call {phase} phase runs its roles with call_all")
        ref = self._granted_workers()[0].call.remote(self.job, phase, self.epoch, self.grant.token, method, *args)
        ray.wait([ref], fetch_local=False)
        return ref

    def call_all(self, phase: str, method: str, *args: Any, collective: bool = True) -> list[ray.ObjectRef]:
        """Run ``method`` of the job's role on every node of the phase at once, one rank per
        node, and wait for all; returns their results' references in rank order. A phase
        wider than one node gets its process group first (again after the job moved),
        unless its ranks never talk to each other (``collective=False``)."""
        if self.grant is None or self.grant.phase != phase:
            raise RuntimeError(f"{self.job}: {phase} role called outside its phase")
        grant = self.grant
        workers = self._granted_workers()
        if self._one_call is not None:
            return self._one_call.run(self, workers, method, args, collective)
        if collective and len(workers) > 1 and self._groups.get(phase) != grant.nodes:
            self._build_group(phase, grant.nodes, workers)
        refs = [w.call.remote(self.job, phase, self.epoch, grant.token, method, *args) for w in workers]
        ray.wait(refs, num_returns=len(refs), fetch_local=False)
        return refs

    def _build_group(self, phase: str, nodes: tuple[int, ...], workers: list[Any]) -> None:
        self._generation += 1
        name = f"{self.job}/{phase}/{self.epoch}/{self._generation}"
        address = ray.get(workers[0].open_group.remote(self.job, phase, self.epoch))
        ray.get(
            [
                w.join_group.remote(self.job, phase, self.epoch, rank, len(workers), address, name)
                for rank, w in enumerate(workers)
            ]
        )
        self._groups[phase] = nodes

    def fetch(self, ref: ray.ObjectRef) -> Any:
        """The value behind a reference returned by :meth:`call`."""
        return ray.get(ref)

    def sync_weights(self, published: ray.ObjectRef) -> None:
        """Weight sync: deliver (version, weights) to every rollout node of the job. A job
        with replicas delivers when it leaves the training phase, after its trainer's copy
        reached the buddy (see the module's docstring)."""
        if self.replicas and self.grant is not None and self.grant.phase == TRAIN:
            self._deferred_sync = published
        else:
            self._deliver(published)

    def _deliver(self, published: ray.ObjectRef) -> None:
        ray.get([w.deliver.remote(self.job, self.epoch, published) for w in self.workers_of(ROLLOUT)])

    def _replicate(self, trainer: Any, token: int, completed: int) -> None:
        """Copy the sleeping trainer to the job's buddy, worker to worker. Without a buddy
        (none has room, or it is the trainer's own worker while the job moves), the last
        copy (now older than the weights about to be sent) is dropped: a restart then goes
        back to the checkpoint, never to a stale replica."""
        buddy = buddy_of(self.job)
        if buddy is not None and buddy._actor_id == trainer._actor_id:
            buddy = None
        if self._buddy is not None and (buddy is None or buddy._actor_id != self._buddy._actor_id):
            try:
                ray.get(self._buddy.drop_replicas.remote(self.job))
            except ray.exceptions.RayActorError:
                pass  # it died, and the copies with it
        self._buddy = buddy
        if buddy is None:
            return
        copy = trainer.replica.remote(self.job, TRAIN, self.epoch, token)
        try:
            ray.get(buddy.keep_replica.remote(self.job, TRAIN, completed, copy))
        except ResidencyExceeded:
            self._buddy = None  # no room: the buddy dropped the older copy too
        except ray.exceptions.RayActorError:
            self._buddy = None
            try:
                ray.get(buddy.where.remote())
            except ray.exceptions.RayActorError:
                return  # the buddy died, its copies with it: the job goes on without one
            raise  # the trainer died while copying: the buddy's older copy is where it resumes

    def level_rollouts(self) -> None:
        """Give every rollout node the restored trainer's weights before the first rollout:
        a rollout that survived, or was rebuilt, may hold older ones."""
        trainer = self.workers_of(TRAIN)[0]
        self._deliver(trainer.weights_of.remote(self.job, self.epoch))

    def report(self, metrics: dict[str, float], iteration: int | None = None) -> dict[str, float]:
        """Tell the control plane how the job is doing (default: the iteration just trained);
        returns the metrics stamped with the seconds since the session began. Inside a
        phase it is sent with the phase's release, so a crash before that release loses it:
        a job that resumes calls :meth:`report_missing` with what it resumes after."""
        stamped = {"elapsed_s": time.time() - self.began, **metrics}
        if self.grant is not None:
            self._report = (stamped, iteration)  # sent with the phase's release: no round trip of its own
        else:
            self.turns.report(stamped, iteration)
        return stamped

    def report_missing(self, history: list[dict[str, float]]) -> None:
        """Report the iterations of ``history`` (one metrics dict per iteration, as a
        checkpoint or a restored trainer keeps them) that the control plane has not counted:
        they were checkpointed or copied in a phase whose release, carrying the report, a
        crash prevented."""
        for iteration in range(self.turns.info["iteration"], len(history)):
            # Sent now, even inside a phase: its release carries one report only.
            self.turns.report({"elapsed_s": time.time() - self.began, **history[iteration]}, iteration)


class _OneCall:
    """A phase whose work is one call per node: each worker wakes the role, runs the call
    and puts the role back to sleep in one round trip (three otherwise), which is what a
    switch costs most of where phases are short (an emulated trace at a high time scale)."""

    def __init__(self) -> None:
        self.timing = (0.0, 0.0, 0.0)
        """(wake_s, busy_s, sleep_s), the slowest node's each; zeros until the call ran."""
        self.called = False

    def run(
        self, session: Session, workers: list[Any], method: str, args: tuple[Any, ...], collective: bool
    ) -> list[ray.ObjectRef]:
        grant = session.grant
        assert grant is not None
        if self.called:
            raise RuntimeError(f"{session.job}: a one-call {grant.phase} phase calls its roles once")
        if collective and len(workers) > 1:
            raise RuntimeError(f"{session.job}: a one-call phase has no process group; pass collective=False")
        self.called = True
        job, epoch = session.job, session.epoch
        calls = [w.run_phase.remote(job, grant.phase, epoch, grant.token, method, *args) for w in workers]
        results = [result for result, _ in calls]
        ray.wait(results, num_returns=len(results), fetch_local=False)
        timings = ray.get([timing for _, timing in calls])
        self.timing = tuple(max(t[i] for t in timings) for i in range(3))  # type: ignore[assignment]
        return results


def attach(session: Session | None) -> None:
    """Make ``session`` the one ``rollmux.phase`` uses in this thread."""
    _attached.session = session


def current_session() -> Session:
    session = getattr(_attached, "session", None)
    if session is None:
        raise RuntimeError("rollmux.phase used outside a RollMux job: no session is attached")
    return session


class phase(ContextDecorator):  # noqa: N801 - reads as a keyword: `with rollmux.phase("rollout"):`
    """Context manager and decorator marking one phase of the job's iteration.

    ``one_call=True`` declares that the phase's work is one ``call_all`` (no process
    group): the roles then wake, work and sleep in that one round trip per node.
    """

    def __init__(self, name: str, one_call: bool = False):
        if name not in PHASES:
            raise ValueError(f"unknown phase {name!r}; phases are {', '.join(PHASES)}")
        self.name = name
        self.one_call = one_call

    def __enter__(self) -> phase:
        current_session().enter(self.name, self.one_call)
        return self

    def __exit__(self, *exc: object) -> bool:
        current_session().leave(self.name)
        return False
