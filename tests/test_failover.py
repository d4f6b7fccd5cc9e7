"""Node failures on a real ``rollmux serve`` with Ray: a worker process SIGKILLed in the
middle of a run (in a training step, or while it receives a weight sync) costs its two
multiplexed jobs a restart, not a step: the standby takes the node over with the
trainers' replicas, and both jobs' losses and rewards stay those of a run alone."""

from __future__ import annotations

import os
import pickle
import re
from typing import Any

import pytest
from pydantic import ValidationError

from rollmux.core.cluster import Cluster
from rollmux.core.control import Capacity, ControlState
from rollmux.core.errors import NoCapacity, ResidencyExceeded, StaleWeights
from rollmux.core.placement import make_policy
from rollmux.core.spec import JobSpec, PhaseTime
from rollmux.dataplane.portable import PortableRole
from rollmux.dataplane.workers import PoolWorker
from rollmux.inputs.runfile import JobSubmission
from rollmux.jobs.grpo import GRPOConfig, GRPORollout, GRPOTrainer, run_alone
from rollmux.wire.client import Client
from rollmux.wire.failpoints import ONCE_VARIABLE, SKIP_VARIABLE, VARIABLE
from tests.service_process import ServiceProcess
from tests.test_recovery import no_node_runs_two_jobs, wait_until

SMALL = {"prompts_per_iteration": 64, "train_groups": 32}
ITERATIONS = 40
SEEDS = {"a": 0, "b": 1}


def shipped(portable: PortableRole) -> Any:
    """What the receiving worker gets, as Ray ships it (protocol 5, buffers out of band)."""
    buffers: list = []
    blob = pickle.dumps(portable, protocol=5, buffer_callback=buffers.append)
    return pickle.loads(blob, buffers=buffers)


def trained_worker(node: int, limit: int = 2**30) -> PoolWorker:
    """A training worker on which job ``a`` ran one iteration (its trainer asleep)."""
    worker = PoolWorker(pool="train", host_limit_bytes=limit)
    worker.assign(node)
    config = GRPOConfig(**SMALL)
    worker.load("a", "train", 1, lambda: GRPOTrainer(config))
    worker.wake("a", "train", 1, 1)
    worker.call("a", "train", 1, 1, "train", GRPORollout(config).generate(0))
    worker.sleep("a", "train", 1, 1)
    return worker


def test_a_buddy_keeps_the_newest_replica_counted_in_its_host_memory_and_hands_it_over():
    worker = trained_worker(0)
    copy = shipped(worker.replica("a", "train", 1, 1))
    buddy = PoolWorker(pool="train", host_limit_bytes=2**30)
    empty = buddy.host_bytes()
    buddy.keep_replica("a", "train", 1, copy)
    assert buddy.host_bytes() - empty == worker.host_bytes() > 0
    with pytest.raises(StaleWeights):
        buddy.keep_replica("a", "train", 0, copy)
    buddy.assign(0)  # the buddy takes the dead node over; the job restarts in epoch 2
    loaded = buddy.load("a", "train", 2, lambda: pytest.fail("built"), keep=1)
    assert loaded["source"] == "replica" and buddy.progress("a", "train", 2) == worker.progress("a", "train", 1)
    assert not buddy.replicas


def test_a_replica_older_than_the_iterations_the_control_plane_counted_is_not_taken():
    buddy = PoolWorker(pool="train", host_limit_bytes=2**30)
    buddy.keep_replica("a", "train", 1, shipped(trained_worker(0).replica("a", "train", 1, 1)))
    fresh = GRPOTrainer(GRPOConfig(**SMALL))
    assert buddy.load("a", "train", 2, lambda: fresh, keep=2)["source"] == "built"
    assert buddy.roles[("a", "train")] is fresh


def test_a_replica_without_room_is_refused_and_the_older_one_dropped():
    worker = trained_worker(0)
    copy = shipped(worker.replica("a", "train", 1, 1))
    buddy = PoolWorker(pool="train", host_limit_bytes=worker.host_bytes() + 1024)
    buddy.keep_replica("a", "train", 1, copy)
    with pytest.raises(ResidencyExceeded, match="keeping b's train replica"):
        buddy.keep_replica("b", "train", 1, shipped(PortableRole(copy)))
    assert list(buddy.replicas) == [("a", "train")]
    buddy.host_limit_bytes = worker.host_bytes() // 2  # the next copy no longer fits: a restart must not
    with pytest.raises(ResidencyExceeded):  # find the older one, behind the weights about to be sent
        buddy.keep_replica("a", "train", 2, copy)
    assert not buddy.replicas


def test_a_restarted_job_keeps_its_surviving_trainer_asleep_even_if_a_revoked_grant_left_it_awake():
    worker = trained_worker(0)
    worker.wake("a", "train", 1, 2)  # its driver died holding the phase
    loaded = worker.load("a", "train", 2, lambda: pytest.fail("built"), keep=1)
    assert loaded["source"] == "kept" and worker.awake is None
    assert not worker.roles[("a", "train")].state.awake and len(worker.progress("a", "train", 2)) == 1


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"replicas": 1}, "'replicas' and 'checkpoint_every' are for jobs RollMux runs"),
        ({"kind": "grpo", "iterations": 3, "replicas": 2}, "Input should be 0 or 1"),
        ({"kind": "grpo", "iterations": 3, "checkpoint_every": 0}, "greater than or equal to 1"),
    ],
)
def test_replica_and_checkpoint_fields_are_checked(fields, message):
    with pytest.raises(ValidationError, match=message):
        JobSubmission.model_validate({"name": "x", **fields})


def test_a_job_the_units_left_beside_the_standbys_cannot_hold_is_refused_saying_so():
    state = ControlState(Cluster(), make_policy("rollmux"), capacity=Capacity(rollout=0, train=1, standby=1))
    with pytest.raises(NoCapacity, match=r"the cluster offers 0 \(1 more kept for standby workers\)"):
        state.validate(JobSpec("j", PhaseTime.fixed(1), PhaseTime.fixed(1), slo=2.0))


def serve(tmp_path, failpoint: str, skip: int, standby: int) -> ServiceProcess:
    """A service on two units per pool (with a standby: a node and a standby each), whose
    workers SIGKILL themselves once, at the ``skip + 1``-th pass of ``failpoint`` in one
    process."""
    os.environ.update({VARIABLE: failpoint, ONCE_VARIABLE: str(tmp_path / "killed"), SKIP_VARIABLE: str(skip)})
    arguments = ("--rollout-nodes", "2", "--train-nodes", "2", "--lease-s", "5", "--no-regroup", "--no-slo-guard")
    try:
        return ServiceProcess(tmp_path / "state", extra=(*arguments, "--standby", str(standby))).start(120)
    finally:
        for variable in (VARIABLE, ONCE_VARIABLE, SKIP_VARIABLE):
            os.environ.pop(variable, None)


def grpo_pair(iterations: int, replicas: int, checkpoint_every: int) -> list[dict]:
    """Two GRPO jobs (seeds 0 and 1) that share one rollout and one training node."""
    return [
        {
            "name": name,
            "kind": "grpo",
            "iterations": iterations,
            "slo": 3.0,
            "replicas": replicas,
            "checkpoint_every": checkpoint_every,
            "grpo": {"seed": seed, **SMALL},
        }
        for name, seed in SEEDS.items()
    ]


def run_two_jobs(service: ServiceProcess, replicas: int, checkpoint_every: int) -> tuple[Client, dict[str, dict]]:
    api = Client(service.url, service.token)
    api.request("POST", "/v1/plans", json={"jobs": grpo_pair(ITERATIONS, replicas, checkpoint_every)})
    views = wait_until(lambda: all_ended(api), timeout_s=300)
    return api, views


def all_ended(api: Client) -> dict[str, dict]:
    views = {n: api.request("GET", f"/v1/jobs/{n}") for n in SEEDS}
    return views if all(v["state"] in ("done", "failed", "cancelled") for v in views.values()) else {}


def resumed_at(api: Client, name: str) -> int:
    running = [e for e in api.request("GET", f"/v1/jobs/{name}/events") if e["kind"] == "running"]
    return int(re.search(r"from iteration (\d+)", running[-1]["detail"]).group(1))


def as_if_alone(api: Client) -> None:
    for name, seed in SEEDS.items():
        served = [(m["loss"], m["reward"]) for m in api.request("GET", f"/v1/jobs/{name}/metrics")]
        alone = [(m["loss"], m["reward"]) for m in run_alone(GRPOConfig(seed=seed, **SMALL), ITERATIONS)]
        assert served == alone, name


@pytest.mark.parametrize(
    "failpoint",
    [
        pytest.param("call:train", id="in-a-step"),
        pytest.param("replica:copy", id="while-copying", marks=pytest.mark.slow),  # the suite's time is short
    ],
)
def test_a_trainer_killed_mid_step_fails_over_to_the_standby_with_its_replica_and_loses_no_step(tmp_path, failpoint):
    """Killed in a training step, or while its trainer is copied to the buddy (before the
    rollouts get the new weights): the older copy is where the job resumes."""
    killed_step = 25  # 50 training steps of the two jobs pass; the 51st is killed, well after the standbys are up
    service = serve(tmp_path, failpoint, 2 * killed_step, standby=1)
    try:
        api, views = run_two_jobs(service, replicas=1, checkpoint_every=1000)
        assert {v["state"] for v in views.values()} == {"done"}, views
        assert {v["restarts"] for v in views.values()} == {1}
        log = api.phase_log()
        revoked = [e for e in log if e["outcome"] == "revoked" and e["phase"] == "train"]
        assert revoked, log
        for name in SEEDS:  # no checkpoint since the start: only the replicas hold the progress
            trained = [e["iteration"] for e in log if e["job"] == name and e["phase"] == "train"]
            assert resumed_at(api, name) >= killed_step - 1
            assert sorted(set(trained)) == list(range(ITERATIONS))
        as_if_alone(api)
        no_node_runs_two_jobs(log)
    finally:
        service.stop()


@pytest.mark.slow  # a long live scenario: bench/scenarios.py runs it
@pytest.mark.parametrize(
    ("standby", "replicas"),
    [
        pytest.param(1, 1, id="standby-and-replicas"),
        pytest.param(0, 0, id="cold", marks=pytest.mark.slow),  # the cold path: bench/failover.py's third way
    ],
)
def test_a_rollout_worker_killed_while_receiving_a_weight_sync_leaves_both_jobs_recoverable(
    tmp_path, standby, replicas
):
    service = serve(tmp_path, "sync:deliver", 2 * 20, standby=standby)
    try:
        api, views = run_two_jobs(service, replicas=replicas, checkpoint_every=3)
        assert {v["state"] for v in views.values()} == {"done"}, views
        assert (tmp_path / "killed").exists()
        assert sum(v["restarts"] for v in views.values()) >= 1
        as_if_alone(api)
        no_node_runs_two_jobs(api.phase_log())
    finally:
        service.stop()


def test_replicas_give_way_to_the_roles_of_the_nodes_own_jobs():
    """A copy only takes the room placement leaves (as in the core's buddy plan): a role
    that needs the room drops the copy, and its job copies again after its next step."""
    worker = trained_worker(0)
    buddy = PoolWorker(pool="train", host_limit_bytes=worker.host_bytes() + 1024)  # room for the copy only
    buddy.assign(1)
    buddy.keep_replica("a", "train", 1, shipped(worker.replica("a", "train", 1, 1)))
    buddy.load("b", "train", 1, lambda: GRPOTrainer(GRPOConfig(**SMALL)))
    assert not buddy.replicas and ("b", "train") in buddy.roles


def test_a_copy_kept_beside_a_computing_role_never_walks_its_tensors():
    """A buddy is a held node whose own jobs compute while copies arrive: counting its
    memory then must not walk the awake role's tensors, which a training step changes
    under the walk (a buddy's worker died of a segmentation fault that way)."""
    worker = trained_worker(0)
    worker.wake("a", "train", 1, 2)
    woken = worker.host_bytes()
    worker.roles[("a", "train")].state._tensors = lambda: pytest.fail("walked the tensors of a computing role")
    copy = shipped(trained_worker(1).replica("a", "train", 1, 1))
    assert worker.keep_replica("b", "train", 1, copy) > 0
    assert worker.host_bytes() > woken


def test_a_buddy_hands_out_copies_of_its_replica_no_older_than_asked_and_keeps_it():
    worker = trained_worker(0)
    buddy = PoolWorker(pool="train", host_limit_bytes=2**30)
    buddy.keep_replica("a", "train", 1, shipped(worker.replica("a", "train", 1, 1)))
    assert buddy.replica_copy("a", "train", 2) is None and buddy.replica_copy("b", "train", 0) is None
    copy = shipped(buddy.replica_copy("a", "train", 1))
    assert copy.history == worker.progress("a", "train", 1) and ("a", "train") in buddy.replicas


@pytest.mark.slow  # a long live scenario: bench/scenarios.py runs it
@pytest.mark.parametrize(
    "failpoint",
    [
        pytest.param("call:train", id="in-a-step"),
        pytest.param("replica:keep", id="while-keeping-the-other-jobs-copy", marks=pytest.mark.slow),
    ],
)
def test_a_trainer_killed_without_a_standby_comes_back_from_its_buddy_on_another_training_node(tmp_path, failpoint):
    """Two jobs that cannot share a trainer (SLO 1) hold a training node each, and each
    job's buddy is the other's node. One training worker is killed with no standby and no
    checkpoint since the start — in a step, or while it receives the other job's copy (that
    job then goes on without one): a fresh worker pulls the killed node's job's copy from
    the other node, and that job resumes where it was killed."""
    killed_step = 25  # each trainer's worker runs one job's steps and keeps the other's copies
    service = serve(tmp_path, failpoint, killed_step, standby=0)
    try:
        api = Client(service.url, service.token)
        alone = {"slo": 1.0, "rollout_s": 0.1, "train_s": 1.0}  # two trainers on one node would be 2x slower
        jobs = [{**job, **alone} for job in grpo_pair(ITERATIONS, replicas=1, checkpoint_every=1000)]
        api.request("POST", "/v1/plans", json={"jobs": jobs})
        seats = wait_until(lambda: _seated_with_buddies(api), timeout_s=120)
        assert seats["a"][1] == f"node:{seats['b'][0]}" and seats["b"][1] == f"node:{seats['a'][0]}"
        views = wait_until(lambda: all_ended(api), timeout_s=300)
        assert {v["state"] for v in views.values()} == {"done"}, views
        (restarted,) = [name for name, view in views.items() if view["restarts"] == 1]
        events = api.request("GET", f"/v1/jobs/{restarted}/events")
        running = [e for e in events if e["kind"] == "running"]
        assert "(trainer: buddy)" in running[-1]["detail"], running
        lost_at = min(e["at"] for e in events if e["kind"] == "lost")
        log = api.phase_log()
        trained = [
            e["iteration"]
            for e in log
            if e["job"] == restarted and e["phase"] == "train" and e["outcome"] != "revoked" and e["ended_at"] < lost_at
        ]
        assert resumed_at(api, restarted) == max(trained) + 1  # every step it had trained was kept
        as_if_alone(api)
        no_node_runs_two_jobs(api.phase_log())
    finally:
        service.stop()


def _seated_with_buddies(api: Client) -> dict[str, tuple[int, str]]:
    """Each job's training node and its buddy, once both jobs have both."""
    views = {name: api.request("GET", f"/v1/jobs/{name}") for name in SEEDS}
    seats = {n: (v["train_nodes"][0], v["buddy"]) for n, v in views.items() if v["train_nodes"] and v["buddy"]}
    return seats if len(seats) == len(SEEDS) else {}
