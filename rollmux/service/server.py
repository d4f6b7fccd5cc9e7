"""Start the control plane: token, store and its writer lock, Ray and the executor, HTTP.

``rollmux serve`` runs a :class:`Service` in the foreground; ``rollmux run`` runs the same
service embedded, in a background thread of its own process, with its state in the run's
output folder. Either way there is one control plane per store (the writer lock) and one
per Ray cluster (the registry).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import resource
import socket
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import uvicorn

from rollmux.core.errors import RollMuxError
from rollmux.core.regroup import RegroupConfig
from rollmux.core.spec import Pool
from rollmux.service.api import create_app
from rollmux.service.auth import ensure_token
from rollmux.service.control import ControlOptions, ControlPlane
from rollmux.service.lock import WriterLock, acquire_writer_lock
from rollmux.service.private import private_dir
from rollmux.service.store import Store, default_url
from rollmux.wire.client import DEFAULT_PORT, DEFAULT_STATE_DIR

if TYPE_CHECKING:
    from rollmux.dataplane.executor import JobCode
    from rollmux.dataplane.warm import WarmOptions

log = logging.getLogger("rollmux.service")


class ClusterTaken(RollMuxError):
    """The Ray cluster already has a control plane that answers."""


@dataclass(frozen=True)
class ServeOptions:
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    """0: any free port (an embedded service)."""
    state_dir: Path = DEFAULT_STATE_DIR
    db_url: str | None = None
    policy: str = "rollmux"
    use_ray: bool = True
    ray_address: str | None = None
    rollout_nodes: int = 64
    train_nodes: int = 64
    lease_s: float = 10.0
    lost_grace_s: float | None = None
    """A job seated without a session for this long stops holding its nodes (None: the
    default, ``rollmux.core.control.default_lost_grace``)."""
    host_memory_gb: float = 8.0
    gpus_per_node: dict[Pool, float] = field(default_factory=dict)
    advertise_url: str | None = None
    """The URL job drivers use to reach the service (default: from host and port)."""
    regroup: RegroupConfig | None = field(default_factory=RegroupConfig)
    """Move running jobs when a re-placement pays for its migration (None: never)."""
    slo_guard: bool = True
    warm: WarmOptions | None = None
    """Processes kept started ahead of need (None: the executor's defaults)."""
    job_code: JobCode | None = None
    """What the data plane runs of the job side (with Ray: ``rollmux.sdk.jobcode.JOB_CODE``).
    The entry point that starts the service hands it in: the service imports nothing of
    the job side, so the control plane's process loads no job library."""
    embedded: bool = False
    """Embedded by ``rollmux run``: when it goes, a run whose jobs it holds takes its state
    over (a ``rollmux serve`` is waited for instead: its operator restarts it)."""


class Service:
    """One control plane with its HTTP API, ready to serve on a bound socket."""

    def __init__(self, options: ServeOptions):
        self.options = options
        _raise_open_files_limit()
        self.token = ensure_token(options.state_dir)  # creates the private state folder
        self.socket = _bind(options.host, options.port)
        self.url = options.advertise_url or _url(options.host, self.socket.getsockname()[1])
        self.lock: WriterLock | None = None
        self.record: dict[str, Any] = {}
        """What the Ray cluster's registry says of this control plane (with Ray only)."""
        self.server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        try:
            self.store = Store(options.db_url or default_url(options.state_dir))
            self.lock = acquire_writer_lock(self.store.engine, self.url)
            executor = self._ray_executor() if options.use_ray else None
        except BaseException:
            self.close()
            raise
        control_options = ControlOptions(
            policy=options.policy,
            lease_s=options.lease_s,
            lost_grace_s=options.lost_grace_s,
            checkpoint_dir=options.state_dir / "checkpoints",
            runs_jobs=executor is not None,
            regroup=options.regroup,
            slo_guard=options.slo_guard,
        )
        private_dir(control_options.checkpoint_dir)
        self.control = ControlPlane(self.store, control_options, executor)
        self.app = create_app(self.control, self.token)
        _tune_garbage_collector()

    def _ray_executor(self):
        """Start or join Ray, refuse a cluster that already has a control plane, register."""
        from rollmux.dataplane import registry
        from rollmux.dataplane.connect import start_ray
        from rollmux.dataplane.executor import RayExecutor

        if self.options.job_code is None:
            raise RollMuxError(
                "a control plane on Ray runs job drivers: give it the job side's code "
                "(ServeOptions(job_code=rollmux.sdk.jobcode.JOB_CODE))"
            )
        start_ray(self.options.ray_address, self.options.rollout_nodes, self.options.train_nodes)
        other = registry.lookup()
        if other is not None:
            raise ClusterTaken(
                f"this Ray cluster already has a RollMux control plane at {other['url']} "
                f"(pid {other['pid']} on {other['host']}, state in {other['state']}): "
                "submit to it (rollmux submit/run --url) instead of starting another"
            )
        executor = RayExecutor(
            int(self.options.host_memory_gb * 2**30),
            self.options.job_code,
            self.options.gpus_per_node,
            self.options.warm,
        )
        executor.connect(self.url, self.token)
        self.record = {
            "url": self.url,
            "token": self.token,
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "state": str(self.options.db_url or self.options.state_dir.resolve()),
            "embedded": self.options.embedded,
            "since": time.time(),
        }
        registry.register(self.record)
        return executor

    def _server(self) -> uvicorn.Server:
        # Keep-alive outlives a long poll, so a waiting job's connection is not closed under it.
        config = uvicorn.Config(self.app, log_level="warning", lifespan="on", timeout_keep_alive=75)
        return uvicorn.Server(config)

    def run(self) -> None:
        """Serve in the foreground until interrupted."""
        self.server = self._server()
        try:
            self.server.run(sockets=[self.socket])
        finally:
            self.close()

    def start(self, timeout_s: float = 120.0) -> Service:
        """Serve from a background thread; returns once the control plane is ready."""
        self.server = self._server()
        self._thread = threading.Thread(
            target=lambda: asyncio.run(self.server.serve(sockets=[self.socket])), name="rollmux-service", daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self.control.ready:
            if not self._thread.is_alive():
                raise RollMuxError("the embedded control plane did not start (see the log above)")
            if time.monotonic() > deadline:
                warm = self.options.warm
                raise RollMuxError(
                    f"the embedded control plane was not ready after {timeout_s:g} s: it starts its warm processes "
                    f"first ({warm.spare_workers if warm else 0} spare and {warm.standby_workers if warm else 0} "
                    "standby workers per pool), a few seconds of CPU each; keep fewer"
                )
            time.sleep(0.05)
        return self

    def stop(self) -> None:
        """Stop serving and wait until the control plane gave its nodes and drivers back.
        It leaves the Ray cluster's registry first: a run looking for the cluster's control
        plane meanwhile would otherwise join one about to go."""
        self._unregister()
        if self.server is not None:
            self.server.should_exit = True
        if self._thread is not None:
            self._thread.join()
        self.close()

    def close(self) -> None:
        self._unregister()
        if self.lock is not None:
            self.lock.release()
            self.lock = None
        self.socket.close()

    def _unregister(self) -> None:
        if self.options.use_ray:
            from rollmux.dataplane import registry

            registry.unregister(self.url)


GC_THRESHOLDS = (50_000, 20, 100)


def _tune_garbage_collector() -> None:
    """Keep full collections rare: a thousand waiting long polls are ~400k live objects,
    and with the default thresholds a full collection every few seconds stops the event
    loop for ~200 ms (the tail of every grant and probe: bench/grants.py). What the process
    loaded to start is frozen out of collections altogether."""
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


def _raise_open_files_limit() -> None:
    """Every waiting job holds a connection: allow as many as the system lets this process."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)  # TCP: asyncio then sets TCP_NODELAY
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as error:
        sock.close()
        raise RollMuxError(f"cannot listen on {host}:{port}: {error.strerror}") from None
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def _url(host: str, port: int) -> str:
    if host in ("0.0.0.0", "::", ""):
        host = socket.gethostbyname(socket.gethostname())
    return f"http://{host}:{port}"


def serve(options: ServeOptions) -> None:
    Service(options).run()
