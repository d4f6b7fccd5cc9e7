"""How many processes the live system keeps started ahead of need.

Starting a Ray process and importing the job libraries costs seconds of CPU. A job whose
driver, or a node whose worker, waits for that is paid for while doing nothing, and on a
small machine the start-ups steal the cores from the jobs already running.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class WarmOptions:
    """How many processes the executor keeps started ahead of need."""

    drivers_per_process: int = 1
    """Drivers one driver process runs at once: 1 isolates jobs from each other (a crash or
    a kill takes one job down); more saves a process per job (emulated jobs)."""
    spare_driver_slots: int = 0
    """Drivers that the started driver processes can still take at any time: when fewer,
    another process is started ahead of need (0: a process is started when a job needs it)."""
    spare_workers: int = 0
    """Empty workers kept per pool for the next nodes (each holds a unit of its pool)."""
    standby_workers: int = 0
    """Standby workers kept per pool for nodes whose worker dies (each holds a unit of its
    pool, has run a sandbox phase and holds no job; new nodes never take them). They keep
    the replicas that no held node of their pool has room for (the core's buddy plan)."""
