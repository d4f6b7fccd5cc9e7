"""Pool workers: one Ray actor per RollMux node, hosting the roles of every job on it.

A worker never tears a role down between phases: roles sleep in host memory and wake
when their job is granted the node. Host memory used by sleeping roles is accounted per
node and the residency limit is enforced when a role is loaded.

Replicas: a job that asks for them (``replicas: 1``) leaves a copy of its sleeping trainer
on another worker of the pool after every training phase (its buddy: another held node or
a standby, as the core's buddy plan names it), counted in that worker's host memory, where
copies give way to the node's own roles. When the trainer's node dies, the worker that
takes the node over pulls the copy from the buddy (or holds it already, if it was the
buddy); a restarted job whose role survived keeps it as it is.

Co-located jobs: a job whose rollout and trainer share a node keeps one copy of its
weights there, its trainer's. Its rollout is parked by discarding its weights and gets
the trainer's at its next wake, as veRL's hybrid engine parks vLLM at sleep level 2 and
re-syncs from the actor; the node's host memory then holds the job's training state
only, which is what the core's residency model counts for a co-located job.

Fencing: every wake carries the grant's token, and the worker remembers the highest token
it has seen. A wake with an older token, or a call from anyone but the holder of the
newest one, is refused with :class:`StaleEpoch`; a role of an older epoch of its job is
refused too. Waking and calling hold the node's one execution lock, so a zombie's call
still running finishes before the next holder's role wakes: two jobs never compute on
one node at once.
"""

from __future__ import annotations

import gc
import importlib
import os
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import ray

from rollmux.core.errors import ResidencyExceeded, RollMuxError, StaleEpoch, StaleWeights, WeightsDiscarded
from rollmux.core.roundrobin import ROLLOUT, TRAIN
from rollmux.dataplane.portable import PortableRole
from rollmux.wire.failpoints import failpoint


class PhaseNotGranted(RollMuxError):
    """A role was called while asleep: its job does not hold this node now."""


class Role(Protocol):
    """What job code puts on a worker: an object whose tensors sit behind a
    :class:`rollmux.sdk.state.RoleState`, its ``state``.

    A role that implements the adapter (:mod:`rollmux.sdk.adapter`: ``sleep(mode)``,
    ``wake(tags)``, ``footprint()``) is switched through it, and sleeps between its phases
    in its ``park_mode`` (``offload`` unless it says ``discard``). The worker only calls
    them: it imports nothing of the job side (the control plane that starts it does not)."""

    state: Any


RoleKey = tuple[str, str]
"""A role on a worker: (job, phase). A co-located job keeps both of its roles on one node."""


class PoolWorker:
    """Hosts job roles on one logical node; wrapped by ``ray.remote`` in :mod:`nodes`."""

    def __init__(self, pool: str, host_limit_bytes: int):
        importlib.import_module("torch")  # the roles' library, loaded while the worker warms up, not when a role lands
        gc.freeze()  # what was imported is never collected: full collections stay short
        self.node_id: int | None = None
        """The node it serves now (None: a warm spare)."""
        self.pool = pool
        self.host_limit_bytes = host_limit_bytes
        self.roles: dict[RoleKey, Role] = {}
        self.epochs: dict[str, int] = {}
        self.pending_weights: dict[str, tuple[int, dict]] = {}
        self.ranks: dict[RoleKey, Any] = {}
        """Wide roles' places in their process groups (see :mod:`rollmux.dataplane.ranks`)."""
        self.stores: dict[RoleKey, Any] = {}
        """Rendezvous stores this worker serves as rank 0 of a wide role."""
        self.replicas: dict[RoleKey, tuple[int, Role]] = {}
        """Copies of other nodes' sleeping roles (this worker is their buddy), each with the
        iterations its job had completed when it was taken."""
        self.fence = 0
        self.awake: RoleKey | None = None
        self.awake_bytes = 0
        """The awake role's host bytes, counted as it woke: calls that count the node's
        memory outside the execution lock (a buddy keeping a copy, a weight delivery)
        never walk the tensors of a role that is computing (a training step changes them
        under the walk)."""
        self.running = threading.Lock()
        self.accounting = threading.Lock()

    def assign(self, node_id: int) -> None:
        """Serve node ``node_id`` from now on (a warm spare taking a node over)."""
        self.node_id = node_id

    def warm_up(self, sandbox: Callable[[], float]) -> float:
        """Run ``sandbox``, a phase on a throw-away role (the job side's: see
        :class:`rollmux.dataplane.executor.JobCode`), so the first real switch onto this
        worker (a standby taking a dead node over) finds the library's code paths, allocator
        and threads warm; returns the seconds it took."""
        return sandbox()

    def reset(self) -> None:
        """Empty the worker for its next node: every role and undelivered weight is dropped
        (replicas it keeps as a buddy stay: their jobs run elsewhere). Epochs and the fence
        are kept, so a call from a job that was here is still refused."""
        with self.running, self.accounting:
            self.roles.clear()
            self.pending_weights.clear()
            self.ranks.clear()
            self.stores.clear()
            self.awake = None
            self.node_id = None

    def where(self) -> dict[str, Any]:
        """The logical node, the Ray node and the process this worker runs on."""
        return {
            "node_id": self.node_id,
            "pool": self.pool,
            "ray_node_id": ray.get_runtime_context().get_node_id(),
            "pid": os.getpid(),
        }

    def load(
        self,
        job: str,
        phase: str,
        epoch: int,
        factory: Callable[[], Role],
        keep: int | None = None,
        buddy: Any = None,
    ) -> dict[str, Any]:
        """Start of a job's ``phase`` role for session ``epoch``, put to sleep in host memory;
        it replaces the roles of an older epoch of the same job. With ``keep`` (a restart of
        a job with replicas: the iterations the control plane counted), the role of its last
        session is kept where it survived here, else its replica is taken if that recent:
        from this worker's memory if it keeps it (a standby that took the node over), else
        pulled from the job's ``buddy`` worker. Otherwise the role is built (cold: from the
        job's checkpoint). Says where the role came from."""
        self._check_epoch(job, epoch)
        start = time.perf_counter()
        role, source = (self._survivor(job, phase) if keep is not None else None), "kept"
        replica = self.replicas.get((job, phase))
        if role is None and keep is not None and replica is not None and replica[0] >= keep:
            role, source = self.replicas.pop((job, phase))[1], "replica"
        if role is None and keep is not None and buddy is not None:
            role, source = _pulled(buddy, job, phase, keep), "buddy"
        if role is None:
            role, source = factory(), "built"
            _sleep(role, "offload")  # a discarded role would have no weights to start from
        self._seat(job, phase, epoch, role, None)
        return {"source": source, "cold_s": time.perf_counter() - start, "host_bytes": float(_host_bytes(role))}

    def _survivor(self, job: str, phase: str) -> Role | None:
        """The job's role of its last session, asleep (a role a revoked grant left awake is
        put to sleep once any call still running on it has finished)."""
        with self.running:
            role = self.roles.get((job, phase))
            if role is not None and self.awake == (job, phase):
                self._park((job, phase))
                with self.accounting:
                    self.awake = None
            return role

    def replica(self, job: str, phase: str, epoch: int, token: int) -> PortableRole:
        """The job's role, asleep, for its buddy: Ray puts it into the object store as it is
        returned (its buffers out of band, see :class:`PortableRole`), so the buddy gets a
        copy and the role stays here. Only for the holder of the phase's grant, after its
        sleep: the copy is of a finished phase."""
        with self.running:
            self._check_epoch(job, epoch, exact=True)
            if token != self.fence or self.awake is not None:
                raise StaleEpoch(f"node {self.node_id}: grant {token} of {job} no longer holds it")
            role = self._role((job, phase))
            if role.state.awake:
                raise PhaseNotGranted(f"{job}'s {phase} role is awake on node {self.node_id}: copy it asleep")
            failpoint("replica:copy")
            return PortableRole(role)

    def keep_replica(self, job: str, phase: str, completed: int, role: Role) -> int:
        """Keep a copy of the job's sleeping role, taken after ``completed`` iterations, in
        place of any older one; refused (and the older one dropped too, so a restart never
        takes a replica older than the job's other roles) when host memory has no room."""
        failpoint("replica:keep")
        with self.accounting:
            held = self.replicas.get((job, phase))
            if held is not None and held[0] > completed:
                raise StaleWeights(f"node {self.node_id}: {job}'s replica of {completed} iterations, holds {held[0]}")
            self.replicas[(job, phase)] = (completed, role)
            try:
                self._check_residency(f"keeping {job}'s {phase} replica", evict=False)
            except ResidencyExceeded:
                del self.replicas[(job, phase)]
                raise
        return _host_bytes(role)

    def replica_copy(self, job: str, phase: str, at_least: int) -> PortableRole | None:
        """A copy of the job's replica kept here, if it was taken after ``at_least``
        iterations (None otherwise): for the worker that now serves the job's dead node.
        The replica stays: this worker is still the job's buddy."""
        with self.accounting:
            held = self.replicas.get((job, phase))
            if held is None or held[0] < at_least:
                return None
            return PortableRole(held[1])

    def drop_replicas(self, job: str) -> None:
        with self.accounting:
            for key in [k for k in self.replicas if k[0] == job]:
                del self.replicas[key]

    def progress(self, job: str, phase: str, epoch: int) -> list[dict[str, float]] | None:
        """Every iteration's metrics the job's (trainer) role has recorded: where a restarted
        job resumes when its trainer was kept or came from a replica (None: the role keeps
        no history, so it cannot say)."""
        self._check_epoch(job, epoch, exact=True)
        history = getattr(self._role((job, phase)), "history", None)
        return None if history is None else list(history)

    def weights_of(self, job: str, epoch: int) -> tuple[int, Any]:
        """The job's sleeping trainer's weights, for rollouts that must be brought level with
        a trainer restored from a replica. Reads host memory only, so it runs beside another
        job's phase."""
        self._check_epoch(job, epoch, exact=True)
        role = self._role((job, "train"))
        if role.state.awake:
            raise PhaseNotGranted(f"{job}'s trainer is awake on node {self.node_id}")
        return role.weights()  # type: ignore[attr-defined]

    def unload(self, job: str) -> None:
        """Drop every role (and replica) of the job from this node."""
        with self.accounting:
            for key in [k for k in self.replicas if k[0] == job]:
                del self.replicas[key]
            for key in [k for k in self.roles if k[0] == job]:
                del self.roles[key]
                self.ranks.pop(key, None)
                self.stores.pop(key, None)
            self.pending_weights.pop(job, None)
            if self.awake is not None and self.awake[0] == job:
                self.awake = None

    def wake(self, job: str, phase: str, epoch: int, token: int) -> float:
        """Bring the job's role onto the device for the grant ``token``; apply weights
        delivered while it slept. A role still awake from a revoked grant is put to sleep."""
        with self.running:
            return self._wake(job, phase, epoch, token)

    def sleep(self, job: str, phase: str, epoch: int, token: int) -> float:
        with self.running:
            return self._sleep_holder(job, phase, epoch, token)

    @ray.method(num_returns=2)
    def run_phase(
        self, job: str, phase: str, epoch: int, token: int, method: str, *args: Any
    ) -> tuple[Any, tuple[float, float, float]]:
        """A whole phase in one round trip, for phases whose work is one call per node: wake
        the role for grant ``token``, run ``method``, put the role back to sleep (also when
        the method raised). Two returns, so the result stays its own object (a rollout batch
        goes to the trainer by reference): the result, and (wake_s, busy_s, sleep_s)."""
        with self.running:
            wake_s = self._wake(job, phase, epoch, token)
            started = time.perf_counter()
            try:
                result = self._run(job, phase, epoch, token, method, *args)
            finally:
                busy_s = time.perf_counter() - started
                sleep_s = self._sleep_holder(job, phase, epoch, token) if self.awake == (job, phase) else 0.0
            return result, (wake_s, busy_s, sleep_s)

    def _wake(self, job: str, phase: str, epoch: int, token: int) -> float:
        """:meth:`wake`, with the node's execution lock held."""
        self._check_epoch(job, epoch, exact=True)
        if token < self.fence:
            raise StaleEpoch(f"node {self.node_id}: grant {token} of {job} is older than grant {self.fence}")
        self.fence = token
        seconds = 0.0
        key = (job, phase)
        if self.awake is not None and self.awake != key and self.awake in self.roles:
            seconds += self._park(self.awake)
        role = self._role(key)
        with self.accounting:
            self._check_residency(f"waking {job}'s {phase} role")
            self.awake_bytes, self.awake = self._resident_bytes(key, role), key
        seconds += _wake(role)
        if phase == ROLLOUT:
            seconds += self._refill(job, role)
        return seconds

    def _refill(self, job: str, rollout: Role) -> float:
        """Give a woken rollout the weights delivered while it slept, else, if it was parked
        without weights beside its trainer (co-located), the trainer's, asleep on this node."""
        start = time.perf_counter()
        if job in self.pending_weights:
            version, weights = self.pending_weights.pop(job)
        elif rollout.state.needs_weights and (job, TRAIN) in self.roles:
            version, weights = self.roles[(job, TRAIN)].weights()  # type: ignore[attr-defined]
        else:
            return 0.0
        rollout.load_weights(version, weights)  # type: ignore[attr-defined]
        rollout.state.weights_loaded()
        return time.perf_counter() - start

    def _park(self, key: RoleKey) -> float:
        """Put a role to sleep between its phases: a co-located rollout discards its weights
        (its trainer here holds them), any other in its own park mode."""
        return _sleep(self.roles[key], "discard" if self._shares_trainer(key) else None)

    def _shares_trainer(self, key: RoleKey, roles: Mapping[RoleKey, Role] | None = None) -> bool:
        """Whether ``key`` is a rollout whose job's trainer is on this node (in ``roles``, by
        default the node's), so that it needs no host copy of its own."""
        roles = self.roles if roles is None else roles
        job, phase = key
        rollout, trainer = roles.get((job, ROLLOUT)), roles.get((job, TRAIN))
        return (
            phase == ROLLOUT
            and rollout is not None
            and callable(getattr(trainer, "weights", None))
            and callable(getattr(getattr(rollout, "state", None), "discard", None))
            and getattr(rollout.state, "optimizer", None) is None
        )

    def _resident_bytes(self, key: RoleKey, role: Role, roles: Mapping[RoleKey, Role] | None = None) -> int:
        """What the role holds in this node's host memory: nothing for a co-located rollout
        (parked without a copy), else its own count."""
        return 0 if self._shares_trainer(key, roles) else _host_bytes(role)

    def _sleep_holder(self, job: str, phase: str, epoch: int, token: int) -> float:
        """Put the grant holder's role back to sleep, with the node's execution lock held."""
        self._check_holder(job, phase, epoch, token)
        self._role((job, phase))  # a role unloaded meanwhile: refused before the node is marked asleep
        try:
            return self._park((job, phase))  # still marked awake: counted as it woke while it changes
        finally:
            with self.accounting:
                self.awake = None

    def deliver(self, job: str, epoch: int, published: tuple[int, dict]) -> int:
        """Receive a job's new weights (version, tensors) for its rollout role; they are
        applied at its next wake.

        Runs beside another job's phase (the actor is threaded) and only stores a reference.
        """
        self._check_epoch(job, epoch, exact=True)
        self._role((job, ROLLOUT))
        failpoint("sync:deliver")
        version, weights = published
        with self.accounting:
            waiting = self.pending_weights.get(job)
            if waiting is not None and waiting[0] > version:
                raise StaleWeights(f"node {self.node_id}: {job} weights {version} arrived after version {waiting[0]}")
            self.pending_weights[job] = (version, weights)
            try:
                self._check_residency(f"receiving {job}'s weights version {version}")
            except ResidencyExceeded:
                self.pending_weights.pop(job)
                raise
        return version

    def call(self, job: str, phase: str, epoch: int, token: int, method: str, *args: Any) -> Any:
        """Run one method of the job's role; only while its grant is the node's newest."""
        with self.running:
            return self._run(job, phase, epoch, token, method, *args)

    def _run(self, job: str, phase: str, epoch: int, token: int, method: str, *args: Any) -> Any:
        """:meth:`call`, with the node's execution lock held."""
        self._check_epoch(job, epoch, exact=True)
        state = self._role((job, phase)).state
        if not state.awake:
            raise PhaseNotGranted(f"{job} called {method} on node {self.node_id} outside its phase")
        if state.needs_weights:
            raise WeightsDiscarded(
                f"{job}'s {phase} role on node {self.node_id} was discarded and got no weights since"
            )
        self._check_holder(job, phase, epoch, token)
        failpoint(f"call:{method}")
        from rollmux.dataplane.ranks import ALONE, serving

        with serving(self.ranks.get((job, phase), ALONE)):
            return getattr(self.roles[(job, phase)], method)(*args)

    def open_group(self, job: str, phase: str, epoch: int) -> tuple[str, int]:
        """As rank 0 of the job's wide ``phase`` role: serve the rendezvous of its group."""
        self._check_epoch(job, epoch, exact=True)
        self._role((job, phase))
        from rollmux.dataplane.ranks import open_store

        store, host, port = open_store()
        self.stores[(job, phase)] = store
        return host, port

    def join_group(
        self, job: str, phase: str, epoch: int, rank: int, world: int, address: tuple[str, int], name: str
    ) -> int:
        """Make this node's role rank ``rank`` of the ``world`` ranks of the job's ``phase``
        (group ``name``, new at every rebuild); blocks until all have joined."""
        self._check_epoch(job, epoch, exact=True)
        self._role((job, phase))
        from rollmux.dataplane.ranks import join

        store = self.stores.get((job, phase)) if rank == 0 else None
        self.ranks[(job, phase)] = join(store, *address, rank, world, name)
        return rank

    def export(self, job: str, phase: str, epoch: int) -> tuple[PortableRole, tuple[int, dict] | None]:
        """The job's sleeping role and its undelivered weights, for the worker of its new
        node (a move). The role stays here until the move is complete."""
        self._check_epoch(job, epoch, exact=True)
        failpoint("move:export")
        role = self._role((job, phase))
        if role.state.awake:
            raise PhaseNotGranted(f"{job} is awake on node {self.node_id}: it moves between phases only")
        pending = self.pending_weights.get(job) if phase == ROLLOUT else None
        if phase == ROLLOUT and pending is None and role.state.needs_weights and (job, TRAIN) in self.roles:
            # a co-located rollout leaving its trainer takes the trainer's weights along
            pending = self.roles[(job, TRAIN)].weights()  # type: ignore[attr-defined]
        return PortableRole(role), pending

    def holds(self, job: str, phase: str, epoch: int) -> bool:
        """Whether the job's role of this session is here already (a move carried out before
        a restart of the control plane is not carried out twice)."""
        return self.epochs.get(job) == epoch and (job, phase) in self.roles

    def adopt(self, job: str, phase: str, epoch: int, exported: tuple[Role, tuple[int, dict] | None]) -> int:
        """Take over the job's role exported by the worker of its old node: Ray resolves the
        export into this call's argument, so the bytes go worker to worker (the control plane
        passes a reference only) and no thread here waits for the other worker. Returns the
        bytes moved (0: it was already here)."""
        self._check_epoch(job, epoch)
        if self.holds(job, phase, epoch):
            return 0
        role, pending = exported
        self._seat(job, phase, epoch, role, pending)
        return _host_bytes(role)

    def host_bytes(self) -> int:
        """Every byte the node's jobs keep in its host memory: each role's host copy (the
        optimizer's state included once it exists), replicas it keeps as a buddy, and
        weights delivered but not applied yet."""
        awake = self.awake
        roles = sum(
            self.awake_bytes if key == awake else self._resident_bytes(key, role) for key, role in self.roles.items()
        )
        replicas = sum(_host_bytes(role) for _, role in self.replicas.values())
        return roles + replicas + sum(payload_bytes(w) for _, w in self.pending_weights.values())

    def _check_residency(self, doing: str, evict: bool = True) -> None:
        used = self.host_bytes()
        if evict and used > self.host_limit_bytes:
            used -= self._yield_replicas(used - self.host_limit_bytes)
        if used > self.host_limit_bytes:
            raise ResidencyExceeded(
                f"node {self.node_id} ({self.pool}): {doing} would hold {used / 2**20:.1f} MiB of host memory, "
                f"over its {self.host_limit_bytes / 2**20:.1f} MiB"
            )

    def _yield_replicas(self, over: int, first: str | None = None) -> int:
        """Replicas give way to the roles of the node's own jobs, as in the core's buddy
        plan (copies only take the room placement leaves): drop copies, ``first``'s own
        (useless beside its role) then the largest, until ``over`` bytes are free. Their
        jobs copy to their buddy again after their next training phase. Returns the bytes
        freed."""
        freed = 0
        for key in sorted(self.replicas, key=lambda k: (k[0] != first, -_host_bytes(self.replicas[k][1]))):
            if freed >= over:
                break
            freed += _host_bytes(self.replicas.pop(key)[1])
        return freed

    def _seat(self, job: str, phase: str, epoch: int, role: Role, pending: tuple[int, dict] | None) -> None:
        """Keep a sleeping role here if the node's host memory has room for it (a rollout
        joining its trainer, or a trainer its rollout, then gives the rollout's copy up)."""
        with self.accounting:
            self._check_epoch(job, epoch)
            if self.epochs.get(job, epoch) != epoch:  # a newer session: the older one's roles go
                for key in [k for k in self.roles if k[0] == job]:
                    del self.roles[key]
            after = {**self.roles, (job, phase): role}
            needed = self._resident_bytes((job, phase), role, after)
            used = (
                sum(
                    self.awake_bytes if k == self.awake else self._resident_bytes(k, r, after)
                    for k, r in after.items()
                    if k != (job, phase)
                )
                + sum(_host_bytes(r) for _, r in self.replicas.values())
                + sum(payload_bytes(weights) for j, (_, weights) in self.pending_weights.items() if j != job)
            )
            if used + needed > self.host_limit_bytes:
                used -= self._yield_replicas(used + needed - self.host_limit_bytes, first=job)
            if used + needed > self.host_limit_bytes:
                raise ResidencyExceeded(
                    f"node {self.node_id} ({self.pool}): {job} needs {needed / 2**20:.1f} MiB of host memory, "
                    f"{(self.host_limit_bytes - used) / 2**20:.1f} MiB of {self.host_limit_bytes / 2**20:.1f} MiB left"
                )
            self.epochs[job] = epoch
            self.roles[(job, phase)] = role
            if pending is not None:
                self.pending_weights[job] = pending
            elif phase == ROLLOUT:
                self.pending_weights.pop(job, None)
            if self.awake == (job, phase):
                self.awake = None
            rollout = self.roles.get((job, ROLLOUT))
            if self._shares_trainer((job, ROLLOUT)) and not rollout.state.awake:
                rollout.state.discard()

    def _check_epoch(self, job: str, epoch: int, exact: bool = False) -> None:
        known = self.epochs.get(job, 0)
        if epoch < known or (exact and epoch != known):
            raise StaleEpoch(f"node {self.node_id}: {job} epoch {epoch} is stale (the node holds epoch {known})")

    def _check_holder(self, job: str, phase: str, epoch: int, token: int) -> None:
        self._check_epoch(job, epoch, exact=True)
        if token != self.fence or self.awake != (job, phase):
            raise StaleEpoch(f"node {self.node_id}: grant {token} of {job} no longer holds it (newest: {self.fence})")

    def _role(self, key: RoleKey) -> Role:
        if key not in self.roles:
            raise KeyError(f"job {key[0]} has no {key[1]} role on node {self.node_id}")
        return self.roles[key]


def _pulled(buddy: Any, job: str, phase: str, at_least: int) -> Any:
    """The job's replica pulled from its buddy, worker to worker through Ray's object store
    (None: the buddy keeps none that recent, or it died with its copies)."""
    try:
        return ray.get(buddy.replica_copy.remote(job, phase, at_least))
    except ray.exceptions.RayActorError:
        return None


def payload_bytes(weights: Any) -> int:
    """Host bytes held by delivered weights: packed (``nbytes``) or a dict of tensors.
    Duck-typed, so the control plane importing this module does not import torch."""
    if isinstance(weights, dict):
        return sum(t.numel() * t.element_size() for t in weights.values() if hasattr(t, "element_size"))
    return int(getattr(weights, "nbytes", 0))


def _is_adapter(role: Any) -> bool:
    return all(callable(getattr(role, name, None)) for name in ("sleep", "wake", "footprint"))


def _sleep(role: Any, mode: str | None = None) -> float:
    """Park a role between its phases: by its adapter in its ``park_mode``, else its state."""
    mode = mode or getattr(role, "park_mode", "offload")
    return role.sleep(mode) if _is_adapter(role) else role.state.sleep(mode)


def _wake(role: Any) -> float:
    return role.wake(("weights", "kv_cache")) if _is_adapter(role) else role.state.wake()


def _host_bytes(role: Any) -> int:
    """What the role holds in host memory, by its adapter's footprint where it has one."""
    return role.footprint().host_bytes if _is_adapter(role) else role.state.host_bytes()
