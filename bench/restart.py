"""Restart time of the control plane does not grow with the finished history it stores.

Two state folders are written through the real store: both with the same live jobs (in
groups, holding grants), one of them also with ``--finished`` finished jobs and ten
logged phases each. For each, in the same run: the time to load the state and rebuild the
control plane in this process, and the time from starting ``rollmux serve --no-ray`` to
its ``/readyz`` answering. Last line: ``restart_s finished=… empty=… ratio=…``
(target: ≤ 2 s with 10,000 finished jobs, and a ratio near 1).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from rollmux.core.cluster import Cluster  # noqa: E402
from rollmux.core.control import DONE, ControlState, Delta, JobRecord, PhaseEntry, PhaseTiming  # noqa: E402
from rollmux.core.placement import make_policy  # noqa: E402
from rollmux.core.spec import JobSpec, PhaseTime  # noqa: E402
from rollmux.service.control import ControlOptions, ControlPlane  # noqa: E402
from rollmux.service.store import Store, default_url  # noqa: E402
from tests.service_process import ServiceProcess  # noqa: E402

LIVE = 40


def write_state(folder: Path, finished: int) -> None:
    """Live jobs holding grants, and ``finished`` ended jobs with their phase logs."""
    store = Store(default_url(folder))
    state = ControlState(Cluster(), make_policy("rollmux"))
    for i in range(LIVE):
        state.submit(JobSpec(f"live-{i}", PhaseTime.fixed(60), PhaseTime.fixed(60), slo=2.0), {}, 0.0)
        epoch = state.begin_session(f"live-{i}", 0.0).epoch
        state.activate(f"live-{i}", epoch, 0, 0.0)
        state.acquire(f"live-{i}", "rollout", epoch, 0.0)
    store.apply([state.drain()])
    template = next(iter(state.jobs.values()))
    for start in range(0, finished, 1000):
        history = Delta()
        for seq in range(LIVE + start, LIVE + min(finished, start + 1000)):
            job = replace(template, name=f"done-{seq}", seq=seq, state=DONE, grant=None, ended_at=1.0)
            history.jobs[job.name] = JobRecord(job, 0, (0,), (1,))
            grant = replace(template.grant, job=job.name) if template.grant else None
            history.phases += [PhaseEntry(grant, 1.0, PhaseTiming(1.0), "released")] * 10 if grant else []
        store.apply([history])
    store.engine.dispose()


def load_seconds(folder: Path, repeats: int = 5) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        store = Store(default_url(folder))
        ControlPlane(store, ControlOptions())
        times.append(time.perf_counter() - start)
        store.engine.dispose()
    return statistics.median(times)


def ready_seconds(folder: Path, repeats: int = 3) -> float:
    times = []
    for _ in range(repeats):
        service = ServiceProcess(folder)
        start = time.perf_counter()
        service.start()
        times.append(time.perf_counter() - start)
        service.stop()
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--finished", type=int, default=10_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as root:
        results = {}
        for finished in (0, args.finished):
            folder = Path(root) / f"finished-{finished}" / "state"
            folder.mkdir(parents=True)
            write_state(folder, finished)
            results[finished] = (load_seconds(folder), ready_seconds(folder))
            load_s, ready_s = results[finished]
            print(f"finished={finished} live={LIVE} load_ms={1000 * load_s:.1f} ready_s={ready_s:.2f}")
    empty, full = results[0][1], results[args.finished][1]
    print(f"restart_s finished={full:.2f} empty={empty:.2f} ratio={full / empty:.2f}")


if __name__ == "__main__":
    main()
