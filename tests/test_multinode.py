"""A multi-node Ray cluster started in-process: workers land on nodes of their pool, a
group's jobs share exactly their group's nodes, and Ray refuses a node twice."""

from __future__ import annotations

import pytest
import ray
from ray.cluster_utils import Cluster

from rollmux.core.spec import JobSpec, PhaseTime, Pool
from rollmux.jobs.grpo import GRPOConfig, GRPOJob
from rollmux.runtime.control import NAMESPACE, RuntimeConfig, control_actor
from rollmux.runtime.launch import run_jobs
from rollmux.runtime.nodes import POOL_RESOURCE

SMALL = GRPOConfig(prompts_per_iteration=64, train_groups=32)


@pytest.fixture(scope="module")
def cluster():
    if ray.is_initialized():
        ray.shutdown()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2})
    cluster.add_node(num_cpus=1, resources={POOL_RESOURCE[Pool.ROLLOUT]: 1})
    cluster.add_node(num_cpus=1, resources={POOL_RESOURCE[Pool.TRAIN]: 1})
    cluster.add_node(num_cpus=1, resources={POOL_RESOURCE[Pool.TRAIN]: 1})
    ray.init(address=cluster.address, namespace=NAMESPACE)
    yield cluster
    ray.shutdown()
    cluster.shutdown()


def pool_of_ray_node() -> dict[str, Pool]:
    pools = {}
    for node in ray.nodes():
        for pool, resource in POOL_RESOURCE.items():
            if node["Resources"].get(resource):
                pools[node["NodeID"]] = pool
    return pools


def spec(name: str) -> JobSpec:
    return JobSpec(name, PhaseTime.fixed(1.0), PhaseTime.fixed(1.0), slo=2.0)


def test_workers_land_on_their_pool_and_a_group_shares_its_nodes(cluster):
    control = control_actor(RuntimeConfig())
    placements = [ray.get(control.submit.remote(spec(name))) for name in ("a", "b")]
    a, b = placements
    assert a.group_id == b.group_id
    assert (a.rollout_nodes, a.train_nodes) == (b.rollout_nodes, b.train_nodes)
    pools = pool_of_ray_node()
    for placement in placements:
        for node_id, worker in placement.workers.items():
            where = ray.get(worker.where.remote())
            expected = Pool.ROLLOUT if node_id in placement.rollout_nodes else Pool.TRAIN
            assert where["pool"] == expected.value
            assert pools[where["ray_node_id"]] is expected
    ray.get(control.shutdown.remote())
    ray.kill(control)


def test_a_group_runs_its_jobs_across_ray_nodes(cluster):
    result = run_jobs([(spec("a"), GRPOJob(SMALL, 3)), (spec("b"), GRPOJob(SMALL, 3))])
    assert not result.errors and set(result.histories) == {"a", "b"}
    assert len({r.nodes for r in result.records}) == 2  # one rollout node, one training node, shared


def test_ray_refuses_to_give_the_only_rollout_node_twice(cluster):
    control = control_actor(RuntimeConfig(ready_timeout_s=3.0))
    ray.get(control.submit.remote(spec("a")))
    # Needs its own group (an SLO of 1 forbids sharing), but the only rollout node is reserved.
    loner = JobSpec("c", PhaseTime.fixed(5.0), PhaseTime.fixed(1.0), slo=1.0)
    with pytest.raises(ray.exceptions.RayTaskError, match="no free rollout node"):
        ray.get(control.submit.remote(loner))
    snapshot = ray.get(control.snapshot.remote())
    assert list(snapshot["jobs"]) == ["a"] and snapshot["nodes"] == {"rollout": 1, "train": 1}
    ray.get(control.shutdown.remote())
    ray.kill(control)
