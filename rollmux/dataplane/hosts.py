"""Driver hosts: warm Ray processes that run job drivers, started (and restarted) by the
executor.

A driver host is a detached Ray actor, a process with the libraries already imported,
that runs job drivers in threads of its own: by default one at a time (a job's crash or
kill takes only itself down), or many (emulated jobs in a replay, which need no
isolation but would otherwise each pay a process start). A host whose driver ended runs
the next one, so a job starts without starting a process.

What a driver does is the job side's (:func:`rollmux.sdk.driver.drive`): a host is given
it when it starts (see :class:`rollmux.dataplane.executor.JobCode`), so the control plane
that starts hosts imports none of the job side.
"""

from __future__ import annotations

import gc
import importlib
import os
import threading
import uuid
from collections.abc import Callable

import ray

from rollmux.dataplane.nodes import NAMESPACE

HOST_PREFIX = "rollmux-drivers-"
Drive = Callable[[str, str, str], str]
"""Runs one job's driver to its end: (control plane URL, token, job) -> how it ended."""


class DriverHost:
    """A warm process running job drivers, each in a thread of the actor."""

    def __init__(self, drive: Drive) -> None:
        importlib.import_module("torch")  # what job programs load, imported while the host warms up
        gc.freeze()  # what was imported is never collected: full collections stay short, not ~80 ms
        self.drive = drive
        self.running: dict[str, int] = {}
        self.changed = threading.Condition()
        self.url: str | None = None
        """The control plane its drivers call (None: it has run none yet)."""

    def pid(self) -> int:
        return os.getpid()

    def serves(self) -> str | None:
        """The control plane its drivers call: a control plane started at another address
        (one embedded by a run that took another's state over) has no use for them."""
        return self.url

    def drivers(self) -> dict[str, int]:
        """The jobs whose drivers run here, with their incarnations."""
        return dict(self.running)

    def run(self, url: str, token: str, job: str, incarnation: int) -> str:
        """Run one incarnation of the job to its end (with the host's ``drive``)."""
        with self.changed:
            self.running[job] = incarnation
            self.url = url
        try:
            return self.drive(url, token, job)
        finally:
            with self.changed:
                if self.running.get(job) == incarnation:
                    del self.running[job]
                self.changed.notify_all()

    def until_ended(self, job: str, incarnation: int) -> None:
        """Return once that driver ended (a control plane restarted meanwhile waits here)."""
        with self.changed:
            self.changed.wait_for(lambda: self.running.get(job) != incarnation)


REMOTE_HOST = ray.remote(DriverHost)
"""One actor class for every driver host (Ray exports a class once per class object)."""


def start_host(capacity: int, drive: Drive) -> tuple[str, ray.actor.ActorHandle]:
    """A new detached driver host for up to ``capacity`` drivers at once, running ``drive``,
    and its name."""
    name = f"{HOST_PREFIX}{uuid.uuid4().hex[:12]}"
    handle = REMOTE_HOST.options(
        name=name,
        namespace=NAMESPACE,
        lifetime="detached",
        num_cpus=0,
        max_concurrency=2 * capacity + 2,  # a watcher per driver, and `pid` and `drivers` answer
    ).remote(drive)
    return name, handle
