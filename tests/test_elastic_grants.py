"""Elastic rollout grants (long-tail migration, issue 29): a job that moved its tail sheds
nodes within its rollout, the next job's rollout starts on them at once and is widened
onto the others as they free, each node still serves its jobs in the group's cyclic order,
no node ever holds two jobs' phases, and a control-plane restart keeps it all."""

from __future__ import annotations

import copy

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import invariant, precondition, rule

from rollmux.core.cluster import Cluster
from rollmux.core.control import RUNNING, ControlState, PhaseEntry, PhaseTiming
from rollmux.core.errors import PhaseOrderError, StaleEpoch
from rollmux.core.placement import make_policy
from rollmux.core.spec import JobSpec, PhaseTime, RolloutTail
from rollmux.service.store import Store
from tests.test_control import LEASE, Persisted, restored

TAIL = RolloutTail(0.4)


def tailed(name: str, tail: RolloutTail | None = TAIL) -> JobSpec:
    return JobSpec(name, PhaseTime.fixed(10.0), PhaseTime.fixed(3.0), slo=3.0, rollout_width=2, tail=tail)


def sharing(*specs: JobSpec) -> tuple[ControlState, dict[str, int]]:
    """The jobs running, all seated on the same two rollout nodes."""
    state = ControlState(Cluster(), make_policy("rollmux"), LEASE)
    for job in specs:
        state.submit(job, {}, 0.0)
    epochs = {}
    for job in specs:
        epochs[job.name] = state.begin_session(job.name, 0.0).epoch
        state.activate(job.name, epochs[job.name], 0, 0.0)
    assert len({state.seat(job.name).rollout_nodes for job in specs}) == 1
    return state, epochs


def spans(log: list[PhaseEntry]) -> dict[tuple[str, int], list[tuple[float, float]]]:
    """(job, node) -> the times the node was in that job's phases, from the phase log."""
    held: dict[tuple[str, int], list[tuple[float, float]]] = {}
    for entry in log:
        for node in entry.grant.nodes:
            held.setdefault((entry.grant.job, node), []).append((entry.grant.granted_at, entry.ended_at))
    return held


def test_the_next_rollout_starts_on_a_shed_node_before_the_tail_ends_and_widens_when_it_ends():
    state, epochs = sharing(tailed("a"), tailed("b"))
    a = state.acquire("a", "rollout", epochs["a"], 1.0)
    assert state.acquire("b", "rollout", epochs["b"], 1.0) is None and len(a.nodes) == 2
    tail_node, freed = a.nodes
    shrunk = state.shed("a", "rollout", epochs["a"], a.token, [tail_node], 6.0)
    assert shrunk.nodes == (tail_node,) and shrunk.token == a.token and shrunk.shed == (freed,)
    b = state.job("b").grant
    assert b is not None and b.nodes == (freed,) and b.granted_at == 6.0 and b.token > a.token
    state.release("a", "rollout", epochs["a"], a.token, PhaseTiming(9.0), 10.0)
    widened = state.job("b").grant
    assert widened.nodes == (freed, tail_node) and widened.held_since(tail_node) == 10.0
    assert widened.token == b.token
    state.release("b", "rollout", epochs["b"], b.token, PhaseTiming(8.0), 14.0)
    held = spans(state.drain().phases)
    assert held[("a", freed)] == [(1.0, 6.0)] and held[("a", tail_node)] == [(1.0, 10.0)]
    assert held[("b", freed)] == [(6.0, 14.0)] and held[("b", tail_node)] == [(10.0, 14.0)]


def test_a_rollout_whose_tail_moved_on_the_nodes_it_holds_is_widened_no_more():
    state, epochs = sharing(tailed("a"), tailed("b"))
    a = state.acquire("a", "rollout", epochs["a"], 1.0)
    state.acquire("b", "rollout", epochs["b"], 1.0)
    state.shed("a", "rollout", epochs["a"], a.token, [a.nodes[0]], 6.0)
    b = state.job("b").grant
    moved = state.shed("b", "rollout", epochs["b"], b.token, b.nodes, 7.0)
    assert moved.nodes == b.nodes and moved.tail_moved and not moved.shed
    assert state.shed("b", "rollout", epochs["b"], b.token, b.nodes, 7.5) == moved  # a retry is answered
    state.release("a", "rollout", epochs["a"], a.token, PhaseTiming(), 9.0)
    assert state.job("b").grant.nodes == b.nodes
    assert state.turns[state.cluster.group_of("a").id].holder.get(a.nodes[0]) is None


def test_a_node_never_taken_goes_on_once_the_tail_moved_without_it():
    state, epochs = sharing(tailed("a"), tailed("b"))
    a = state.acquire("a", "rollout", epochs["a"], 1.0)
    state.acquire("b", "rollout", epochs["b"], 1.0)
    state.shed("a", "rollout", epochs["a"], a.token, [a.nodes[0]], 2.0)
    b = state.job("b").grant  # on the node a shed; a's tail holds the other
    state.shed("b", "rollout", epochs["b"], b.token, b.nodes, 3.0)  # b's tail moves where it is
    state.release("a", "rollout", epochs["a"], a.token, PhaseTiming(), 4.0)
    state.release("a", "train", epochs["a"], state.acquire("a", "train", epochs["a"], 4.0).token, PhaseTiming(), 5.0)
    again = state.acquire("a", "rollout", epochs["a"], 5.0)
    assert again is not None and again.nodes == (a.nodes[0],)  # not kept waiting for b, which will not take it


def test_an_elastic_rollout_is_learnt_by_the_node_seconds_it_held_not_by_its_span():
    state, epochs = sharing(tailed("a"), tailed("b"))
    a = state.acquire("a", "rollout", epochs["a"], 0.0)
    state.acquire("b", "rollout", epochs["b"], 0.0)
    state.shed("a", "rollout", epochs["a"], a.token, [a.nodes[0]], 6.0)  # 2 nodes x 6 s, then 1 node x 4 s
    state.release("a", "rollout", epochs["a"], a.token, PhaseTiming(), 10.0)
    b = state.job("b").grant  # 1 node from 6 s, 2 nodes from 10 s: a span of 10 s, 12 node-seconds
    state.shed("b", "rollout", epochs["b"], b.token, [b.nodes[0]], 16.0)
    state.release("b", "rollout", epochs["b"], b.token, PhaseTiming(), 20.0)
    assert state.measured[("a", "rollout")] == [pytest.approx(10.0)]  # (2 x 6 + 4) / (2 - 0.4)
    assert state.measured[("b", "rollout")] == [pytest.approx(20.0 / 1.6)]  # 6 + 2 x 4 + ... = 20 node-s


def test_a_shed_is_refused_without_a_tail_to_move_or_a_node_to_keep_and_a_retry_changes_nothing():
    state, epochs = sharing(tailed("a"), tailed("plain", tail=None))
    a = state.acquire("a", "rollout", epochs["a"], 1.0)
    with pytest.raises(PhaseOrderError, match="keep at least one"):
        state.shed("a", "rollout", epochs["a"], a.token, [], 2.0)
    with pytest.raises(PhaseOrderError, match="keep at least one"):
        state.shed("a", "rollout", epochs["a"], a.token, [99], 2.0)
    with pytest.raises(StaleEpoch):
        state.shed("a", "rollout", epochs["a"], a.token + 1, [a.nodes[0]], 2.0)
    with pytest.raises(PhaseOrderError, match="without holding it"):
        state.shed("a", "train", epochs["a"], a.token, [a.nodes[0]], 2.0)
    once = state.shed("a", "rollout", epochs["a"], a.token, [a.nodes[0]], 2.0)
    assert state.shed("a", "rollout", epochs["a"], a.token, [a.nodes[0]], 3.0) == once
    state.release("a", "rollout", epochs["a"], a.token, PhaseTiming(), 4.0)
    plain = state.acquire("plain", "rollout", epochs["plain"], 4.0)
    assert plain is not None and len(plain.nodes) == 2
    with pytest.raises(PhaseOrderError, match="no tail to move"):
        state.shed("plain", "rollout", epochs["plain"], plain.token, [plain.nodes[0]], 5.0)


def test_a_restart_keeps_a_shed_and_a_widening_so_nothing_is_granted_twice(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'state.db'}")
    state, epochs = sharing(tailed("a"), tailed("b"))
    a = state.acquire("a", "rollout", epochs["a"], 1.0)
    state.acquire("b", "rollout", epochs["b"], 1.0)
    state.shed("a", "rollout", epochs["a"], a.token, [a.nodes[0]], 6.0)
    store.apply([state.drain()])
    after = restored(store, 7.0)
    assert after.job("a").grant == state.job("a").grant and after.job("b").grant == state.job("b").grant
    after.release("a", "rollout", epochs["a"], a.token, PhaseTiming(), 9.0)
    assert after.job("b").grant.nodes == (a.nodes[1], a.nodes[0])
    store.apply([after.drain()])
    again = restored(store, 10.0)
    assert again.job("b").grant == after.job("b").grant


class ElasticGroup(Persisted):
    """Three elastic jobs on the same two rollout nodes asking, shedding and releasing at
    random moments, with control-plane crashes."""

    def __init__(self):
        super().__init__()
        self.state, self.epochs = sharing(tailed("a"), tailed("b"), tailed("c"))
        self.persist()

    def holding(self, phase: str | None = None) -> list[str]:
        jobs = self.state.jobs.items()
        return sorted(n for n, j in jobs if j.grant and (phase is None or j.grant.phase == phase))

    @rule(name=st.sampled_from("abc"), elapsed=st.floats(0.0, 2.0))
    def ask(self, name, elapsed):
        self.now += elapsed
        job = self.state.job(name)
        self.state.acquire(name, job.grant.phase if job.grant else job.next_phase, job.epoch, self.now)
        self.persist()

    @precondition(lambda self: self.holding("rollout"))
    @rule(data=st.data(), elapsed=st.floats(0.0, 2.0))
    def shed(self, data, elapsed):
        name = data.draw(st.sampled_from(self.holding("rollout")))
        grant = self.state.job(name).grant
        keep = data.draw(st.sets(st.sampled_from(grant.nodes), min_size=1))
        self.now += elapsed
        self.state.shed(name, "rollout", grant.epoch, grant.token, keep, self.now)
        self.persist()

    @precondition(lambda self: self.holding())
    @rule(data=st.data(), elapsed=st.floats(0.0, 5.0))
    def release(self, data, elapsed):
        name = data.draw(st.sampled_from(self.holding()))
        grant = self.state.job(name).grant
        self.now += elapsed
        self.state.release(name, grant.phase, grant.epoch, grant.token, PhaseTiming(elapsed), self.now)
        self.persist()

    @rule()
    def crash_and_restore(self):
        grants = {n: j.grant for n, j in self.state.jobs.items()}
        self.state = restored(self.store, self.now)
        for name in "abc":
            self.state.heartbeat(name, self.epochs[name], self.now)
        assert {n: j.grant for n, j in self.state.jobs.items()} == grants

    @invariant()
    def every_free_node_due_to_an_asking_job_is_taken(self):
        group = next(iter(self.state.turns.values()))
        for name, job in self.state.jobs.items():
            if job.state != RUNNING:
                continue
            asking = job.request is not None or (job.grant is not None and job.grant.phase == "rollout")
            assert not asking or not group._ready(name, job.next_phase), f"{name} could take a node it is due on"

    @invariant()
    def every_job_goes_on_and_none_gets_two_cycles_ahead(self):
        """A rollout that ends before a node it is due on frees counts as served there (the
        core's zero-length visit), so one job may lead another by a rollout more than the
        rigid cycle allows, never by more; and from any state, jobs that keep asking and
        releasing all go on (no node waits for a job that waits for it)."""
        turns = next(iter(self.state.turns.values()))
        counts = {name: turns.rollout_count(name) for name in "abc"}
        assert max(counts.values()) - min(counts.values()) <= 2
        probe, now = copy.deepcopy(self.state), self.now
        for _ in range(12):
            now += 1.0
            for name in "abc":
                job = probe.heartbeat(name, self.epochs[name], now)
                if job.grant is not None:
                    probe.release(name, job.grant.phase, job.epoch, job.grant.token, PhaseTiming(1.0), now)
                else:
                    probe.acquire(name, job.next_phase, job.epoch, now)
        ahead = next(iter(probe.turns.values()))
        assert all(ahead.rollout_count(name) >= counts[name] + 2 for name in "abc"), "a job stopped"


ElasticGroup.TestCase.settings = settings(max_examples=40, stateful_step_count=40, deadline=None)
test_random_elastic_rollouts_never_share_a_node_and_keep_the_cyclic_order = ElasticGroup.TestCase
