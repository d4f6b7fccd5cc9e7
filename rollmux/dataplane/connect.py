"""Joining the Ray cluster the data plane runs on, or starting a local one.

Every process that drives the data plane joins first: the control plane, a run that looks
for the cluster's control plane, a replay that kills workers.
"""

from __future__ import annotations

import os

import ray

from rollmux.dataplane.nodes import NAMESPACE, pool_resources
from rollmux.dataplane.rayauth import settle_token_auth


def start_ray(address: str | None = None, rollout_nodes: int = 1, train_nodes: int = 1) -> None:
    """Join the Ray cluster at ``address`` (with its token where it uses token
    authentication), or start a local instance offering this many logical nodes of each
    pool. Does nothing if Ray is already up in this process."""
    if ray.is_initialized():
        return
    if address:
        settle_token_auth(address)
        ray.init(address=address, namespace=NAMESPACE, log_to_driver=False)
        return
    ray.init(
        address="local",  # a new instance, even where another one's address file is left behind
        num_cpus=max(4, os.cpu_count() or 1),
        resources=pool_resources(rollout_nodes, train_nodes),
        include_dashboard=False,
        namespace=NAMESPACE,
        log_to_driver=False,
    )
