"""Start the service: token, store, control plane, optional Ray, HTTP server."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import uvicorn

from rollmux.core.spec import Pool
from rollmux.service.api import create_app
from rollmux.service.auth import ensure_token
from rollmux.service.control import Capacity, DurableControl
from rollmux.service.store import Store, default_url

DEFAULT_STATE_DIR = Path.home() / ".rollmux"
DEFAULT_PORT = 8765


@dataclass(frozen=True)
class ServeOptions:
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    state_dir: Path = DEFAULT_STATE_DIR
    db_url: str | None = None
    policy: str = "rollmux"
    use_ray: bool = True
    ray_address: str | None = None
    rollout_nodes: int = 64
    train_nodes: int = 64


def ray_capacity(options: ServeOptions) -> Capacity:
    """Start or join Ray and read how many nodes of each pool it offers."""
    import ray

    from rollmux.runtime.launch import start_ray
    from rollmux.runtime.nodes import POOL_RESOURCE

    start_ray(options.ray_address, options.rollout_nodes, options.train_nodes)
    offered = ray.cluster_resources()
    return Capacity(
        rollout=int(offered.get(POOL_RESOURCE[Pool.ROLLOUT], 0)),
        train=int(offered.get(POOL_RESOURCE[Pool.TRAIN], 0)),
    )


def build(options: ServeOptions) -> tuple[DurableControl, str]:
    token = ensure_token(options.state_dir)
    store = Store(options.db_url or default_url(options.state_dir))
    capacity = ray_capacity(options) if options.use_ray else Capacity()
    return DurableControl(store, policy=options.policy, capacity=capacity), token


def serve(options: ServeOptions) -> None:
    control, token = build(options)
    app = create_app(control, token)
    uvicorn.run(app, host=options.host, port=options.port, log_level="warning")
