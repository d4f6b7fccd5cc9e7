"""Where a Ray cluster's control plane is: a small detached actor naming its URL and token.

A Ray cluster has one RollMux control plane. ``rollmux serve`` and an embedded
``rollmux run`` register themselves here; a second control plane on the same cluster is
refused while the first answers, and ``rollmux run`` on a cluster that has one submits to
it instead of starting its own. Anyone who can reach the Ray cluster can run code on it,
so the token kept here protects nothing that Ray does not already expose.
"""

from __future__ import annotations

import time
from typing import Any

import httpx
import ray

from rollmux.dataplane.nodes import NAMESPACE

REGISTRY_NAME = "rollmux-control-plane"


class ControlPlaneRecord:
    def __init__(self, info: dict[str, Any]):
        self.info = info

    def get(self) -> dict[str, Any]:
        return self.info


def lookup() -> dict[str, Any] | None:
    """The registered control plane of this Ray cluster, if one is registered and answers."""
    try:
        record = ray.get_actor(REGISTRY_NAME, namespace=NAMESPACE)
        info = ray.get(record.get.remote(), timeout=10)
    except (ValueError, ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
        return None
    try:
        httpx.get(info["url"] + "/readyz", timeout=3).raise_for_status()
    except httpx.HTTPError:
        return None
    return info


def register(info: dict[str, Any]) -> None:
    """Register this control plane (replacing a record whose control plane is gone)."""
    unregister()
    deadline = time.monotonic() + 30
    while True:
        try:
            ray.remote(ControlPlaneRecord).options(
                name=REGISTRY_NAME, namespace=NAMESPACE, lifetime="detached", num_cpus=0
            ).remote(info)
            return
        except ValueError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)  # the killed record's name is released asynchronously


def unregister(url: str | None = None) -> None:
    """Remove the record (only if it names ``url``, when given). Nothing to do without Ray."""
    if not ray.is_initialized():
        return
    try:
        record = ray.get_actor(REGISTRY_NAME, namespace=NAMESPACE)
        if url is not None and ray.get(record.get.remote(), timeout=10).get("url") != url:
            return
        ray.kill(record)
    except (ValueError, ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
        return
