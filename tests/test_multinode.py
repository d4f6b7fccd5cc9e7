"""A multi-node Ray cluster started in-process: workers land on nodes of their pool, a
group's jobs share exactly their group's nodes, and a job the cluster has no node for
waits in the queue and runs once the blocking jobs finish."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest
import ray
from ray.cluster_utils import Cluster

from rollmux.core.spec import Pool
from rollmux.dataplane.nodes import NAMESPACE, POOL_RESOURCE
from rollmux.inputs.runfile import RunFile
from rollmux.jobs.grpo import GRPOJob
from rollmux.live.launch import run_plan
from rollmux.sdk.jobcode import JOB_CODE
from rollmux.sdk.session import Session

SMALL = {"prompts_per_iteration": 64, "train_groups": 32}


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


def pool_of_ray_node() -> dict[str, str]:
    pools = {}
    for node in ray.nodes():
        for pool, resource in POOL_RESOURCE.items():
            if node["Resources"].get(resource):
                pools[node["NodeID"]] = pool.value
    return pools


@dataclass(frozen=True)
class SaysWhere(GRPOJob):
    """Writes where each of its workers runs next to its checkpoint, then trains."""

    def run(self, session: Session) -> list[dict[str, float]]:
        where = {str(node): ray.get(worker.where.remote()) for node, worker in session.workers.items()}
        Path(f"{self.checkpoint}.where.json").write_text(json.dumps(where))
        return super().run(session)


def job(name: str, **fields) -> dict:
    settings = {"args": SMALL} if "entrypoint" in fields else {"grpo": SMALL}
    return {"name": name, "iterations": 3, "slo": 2.0, **settings, **fields}


@pytest.mark.slow  # a long live scenario: bench/scenarios.py runs it
def test_workers_land_on_their_pool_and_a_queued_job_runs_when_nodes_free(cluster, tmp_path):
    entry = "tests.test_multinode:SaysWhere.from_context"
    # The loner needs its own group (an SLO of 1 forbids sharing) but the only rollout
    # node is the group's: it waits until both jobs of the group are done.
    loner = job("loner", entrypoint=entry, rollout_s=5.0, slo=1.0)
    fixed = {"regroup": False, "slo_guard": False}  # the group stays as placed until it is done
    plan = RunFile.model_validate(
        {"cluster": fixed, "jobs": [job("a", entrypoint=entry), job("b", entrypoint=entry), loner]}
    )
    result = run_plan(plan, tmp_path, tick_s=0.2)
    assert not result.errors and {v["state"] for v in result.views.values()} == {"done"}

    pools = pool_of_ray_node()
    seats = {}
    for name in ("a", "b", "loner"):
        where = json.loads((tmp_path / "state" / "checkpoints" / f"{name}.pt.where.json").read_text())
        for found in where.values():
            assert pools[found["ray_node_id"]] == found["pool"]
        seats[name] = {int(node): found["pool"] for node, found in where.items()}
    assert seats["a"] == seats["b"]  # one group: one rollout node, one training node, shared
    assert len({r.nodes for r in result.records if r.job in ("a", "b")}) == 2

    first_of_loner = min(r.granted for r in result.records if r.job == "loner")
    last_of_group = max(r.released for r in result.records if r.job in ("a", "b"))
    assert first_of_loner >= last_of_group
    assert result.views["loner"]["group_id"] != result.views["a"]["group_id"]


def test_a_run_on_a_cluster_that_has_a_control_plane_joins_it(cluster, tmp_path):
    from rollmux.service.server import ClusterTaken, ServeOptions, Service

    service = Service(ServeOptions(port=0, state_dir=tmp_path / "served", job_code=JOB_CODE)).start()
    try:
        with pytest.raises(ClusterTaken, match=f"already has a RollMux control plane at {service.url}"):
            Service(ServeOptions(port=0, state_dir=tmp_path / "another", job_code=JOB_CODE))
        plan = RunFile.model_validate({"jobs": [job("joined", iterations=2)]})
        result = run_plan(plan, tmp_path / "run", tick_s=0.2)
        assert result.url == service.url and result.views["joined"]["state"] == "done"
        assert not (tmp_path / "run" / "state").exists()  # nothing embedded: the cluster's plane ran it
    finally:
        service.stop()
