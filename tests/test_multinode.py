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


def test_workers_land_on_their_pool_and_a_group_shares_its_nodes(cluster):
    control = control_actor(RuntimeConfig())
    spec = lambda name: JobSpec(name, PhaseTime.fixed(1.0), PhaseTime.fixed(1.0), slo=2.0)  # noqa: E731
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


def test_jobs_run_across_ray_nodes_and_the_last_rollout_node_is_not_given_twice(cluster):
    config = RuntimeConfig(ready_timeout_s=3.0)
    same = JobSpec("a", PhaseTime.fixed(1.0), PhaseTime.fixed(1.0), slo=2.0)
    mate = JobSpec("b", PhaseTime.fixed(1.0), PhaseTime.fixed(1.0), slo=2.0)
    # Needs its own group (SLO 1 forbids sharing), but the only rollout node is taken.
    loner = JobSpec("c", PhaseTime.fixed(5.0), PhaseTime.fixed(1.0), slo=1.0)
    result = run_jobs(
        [(same, GRPOJob(SMALL, 3)), (mate, GRPOJob(SMALL, 3)), (loner, GRPOJob(SMALL, 3))],
        config,
    )
    assert set(result.histories) == {"a", "b"}
    assert "no free rollout node" in result.errors["c"]
    used = {r.nodes for r in result.records}
    assert len(used) == 2  # one rollout node, one training node, shared by a and b
