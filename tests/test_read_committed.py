"""A log read after a view finds what the view showed (a real control plane and SQLite
store, no Ray).

Views are answered from memory, logs from the store. A clean-clone CI run once read a
job as unseated and then its node log without the release: the unseat was still
committing. A log read now waits for every change already made in memory to commit."""

from __future__ import annotations

import asyncio
import threading

from rollmux.inputs.runfile import JobSubmission
from rollmux.service.control import ControlOptions, ControlPlane
from rollmux.service.store import Store, default_url


def external(name: str) -> JobSubmission:
    return JobSubmission.model_validate(
        {"name": name, "kind": "external", "rollout_s": 10.0, "train_s": 10.0, "slo": 3.0}
    )


async def logs_read_while_committing(tmp_path) -> tuple[str, list[bool], list[str]]:
    """Submit a job while its commit is held; read its view, then its node and event logs
    before the commit is let go. Returns the view's state and what the logs held."""
    store = Store(default_url(tmp_path))
    control = ControlPlane(store, ControlOptions(regroup=None, slo_guard=False))
    await control.start()
    release = threading.Event()
    apply = store.apply

    def held_apply(deltas):
        release.wait(timeout=30)
        apply(deltas)

    try:
        store.apply = held_apply
        submitting = asyncio.create_task(control.submit([external("a")]))
        await asyncio.sleep(0.2)
        state = (await control.view("a"))["state"]
        nodes = asyncio.create_task(control.node_log(-1, 100))
        events = asyncio.create_task(control.events("a"))
        await asyncio.sleep(0.2)
        release.set()
        await submitting
        node_log, event_log = await nodes, await events
        return state, [entry["held"] for entry in node_log], [entry["kind"] for entry in event_log]
    finally:
        release.set()
        await control.stop()
        store.engine.dispose()


def test_a_log_read_while_a_change_commits_waits_for_it(tmp_path):
    state, held, kinds = asyncio.run(logs_read_while_committing(tmp_path))
    assert state == "placed"
    assert held == [True, True], "the node log must hold the nodes the placed job's view shows"
    assert "placed" in kinds
