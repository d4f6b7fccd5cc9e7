"""The job side's code that the data plane runs in its processes, for the entry points to
hand to a control plane they start (:class:`rollmux.dataplane.executor.JobCode`).

The control plane drives the data plane but imports nothing of the job side, torch least
of all: this module imports torch only inside the sandbox, in the worker that runs it.
"""

from __future__ import annotations

import time

from rollmux.dataplane.executor import JobCode
from rollmux.sdk.driver import drive


def sandbox_phase() -> float:
    """A training step on a throw-away role, then a sleep and a wake: run by a warm worker
    before it counts; returns the seconds it took."""
    import torch

    from rollmux.sdk.state import RoleState

    start = time.perf_counter()
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64))
    optimizer = torch.optim.Adam(model.parameters())
    state = RoleState(model, optimizer)
    model(torch.randn(8, 64, device=state.device)).square().mean().backward()
    optimizer.step()
    state.sleep()
    state.wake()
    return time.perf_counter() - start


JOB_CODE = JobCode(drive=drive, sandbox=sandbox_phase)
