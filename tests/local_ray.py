"""A fresh local Ray instance for one test module (modules declare their node counts)."""

from __future__ import annotations

from collections.abc import Iterator

import ray

from rollmux.dataplane.connect import start_ray


def fresh_local_ray(rollout_nodes: int, train_nodes: int) -> Iterator[None]:
    """Body of a module-scoped fixture: whatever Ray an earlier module left is shut down
    first, and this one when the module is done."""
    if ray.is_initialized():
        ray.shutdown()
    start_ray(rollout_nodes=rollout_nodes, train_nodes=train_nodes)
    yield
    ray.shutdown()
