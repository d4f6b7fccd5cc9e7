"""Job drivers: one Ray actor per job, running the job's loop against the control plane."""

from __future__ import annotations

import traceback
from typing import Any

import ray

from rollmux.core.roundrobin import ROLLOUT, TRAIN
from rollmux.core.spec import JobSpec
from rollmux.runtime.session import JobProgram, Session, attach


class JobDriver:
    """Submits the job, cold-starts its roles on its nodes, then runs its loop."""

    def __init__(self, control: Any):
        self.control = control

    def run(self, spec: JobSpec, program: JobProgram) -> list[dict[str, float]]:
        placement = ray.get(self.control.submit.remote(spec))
        error = ""
        try:
            loads = [
                worker.load.remote(spec.name, program.role_factory(phase))
                for phase in (ROLLOUT, TRAIN)
                for worker in placement.workers_of(phase)
            ]
            ray.get(loads)
            ray.get(self.control.activate.remote(spec.name))
            session = Session(self.control, placement)
            attach(session)
            return program.run(session)
        except BaseException as failure:
            error = "".join(traceback.format_exception_only(type(failure), failure)).strip()
            raise
        finally:
            attach(None)
            ray.get(self.control.complete.remote(spec.name, error))


def driver_actor(control: Any):
    return ray.remote(JobDriver).options(num_cpus=0).remote(control)
