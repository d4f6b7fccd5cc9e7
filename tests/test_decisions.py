"""Placements and moves as one sequence both hosts are held to (``rollmux replay`` compares
the live plane's with the virtual clock's), and the virtual clock fed a live run's times."""

from __future__ import annotations

import pytest

from rollmux.core.control import Delta, EventEntry
from rollmux.core.placement import SoloPolicy
from rollmux.core.spec import JobSpec, PhaseTime, Pool
from rollmux.inputs.trace import Trace, TraceJob
from rollmux.sim.control_host import HostCosts, Recorded, simulate_control
from rollmux.sim.decisions import decisions, divergence


def event(at: float, job: str, kind: str, detail: str) -> dict:
    return {"at": at, "job": job, "kind": kind, "detail": detail}


def test_decisions_are_in_time_order_and_one_instants_in_submission_order():
    events = [
        event(5.0, "b", "moving", "to group 3 (regroup)"),
        event(5.0, "a", "moving", "to group 3 (regroup)"),
        event(1.0, "b", "placed", "group 2 (pack)"),
        event(0.5, "a", "placed", "group 1 (isolate)"),
        event(0.7, "a", "running", "epoch 1 from iteration 0"),
    ]
    found = decisions(events, {"b": 0, "a": 1})
    assert [d.what for d in found] == [("a", "placed", 1), ("b", "placed", 2), ("b", "moving", 3), ("a", "moving", 3)]


def test_the_first_place_two_hosts_part_is_named_with_both_sides():
    live = decisions([event(1.0, "a", "placed", "group 1 (isolate)"), event(9.0, "a", "moving", "to group 4")], {})
    same = decisions([event(1.2, "a", "placed", "group 1 (isolate)"), event(9.5, "a", "moving", "to group 4")], {})
    agreed = divergence(live, same)
    assert (agreed["live"], agreed["control"], agreed["same"], agreed["first_divergence"]) == (2, 2, True, None)
    assert agreed["live_by_kind"] == {"placed": 1, "reseated": 0, "moving": 1}
    other = decisions([event(1.2, "a", "placed", "group 1 (isolate)"), event(9.5, "a", "moving", "to group 5")], {})
    parted = divergence(live, other)
    assert not parted["same"] and parted["first_divergence"]["index"] == 1
    assert (parted["first_divergence"]["live"]["group"], parted["first_divergence"]["control"]["group"]) == (4, 5)
    shorter = divergence(live, other[:1])
    assert shorter["first_divergence"] == {"index": 1, "live": shorter["first_divergence"]["live"], "control": None}


def test_a_decision_event_without_its_group_is_refused_naming_the_job():
    with pytest.raises(ValueError, match="job a names no group"):
        decisions([event(1.0, "a", "placed", "somewhere")], {})


def test_a_landed_move_asks_for_a_round_as_an_arrival_does_and_a_grant_does_not():
    assert Delta(events=[EventEntry("a", 1.0, "moved", "pause 1 s")]).asks_for_round()
    assert Delta(events=[EventEntry("a", 1.0, "placed", "group 1")]).asks_for_round()
    assert not Delta(events=[EventEntry("a", 1.0, "session", "epoch 1")]).asks_for_round()


def test_recorded_times_replace_drawn_ones_phase_by_phase_and_the_first_session_too():
    job = JobSpec("a", PhaseTime.fixed(100), PhaseTime.fixed(300), 1.5)
    trace = Trace((TraceJob(job, 0, 195),))
    recorded = Recorded(
        phases={("a", "rollout", 0): 50.0, ("a", "train", 0): 70.0, ("a", "rollout", 1): 30.0},
        running_at={"a": 40.0},
    )
    run = simulate_control(trace, SoloPolicy(), costs=HostCosts(job_start_s=999.0), recorded=recorded)
    pools = run.result.pools
    # its first session at 40 s (not 999), rollouts of 50 and 30 s, a training of 70 s,
    # then 5 s of a drawn training (300 s) cut by its departure at 195 s
    assert pools[Pool.ROLLOUT].busy_node_seconds == pytest.approx(80.0)
    assert pools[Pool.TRAIN].busy_node_seconds == pytest.approx(75.0)
    assert [(e["job"], e["kind"], e["at"]) for e in run.decision_events] == [("a", "placed", 0.0)]
