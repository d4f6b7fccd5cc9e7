"""A rollout role on vLLM's sleep mode: the adapter for jobs whose generation runs in vLLM.

vLLM allocates its weights and KV cache from a tagged memory pool when built with
``enable_sleep_mode=True``, and frees them on ``sleep``: level 1 copies the weights to
(pinned) host memory and drops the cache, level 2 drops both. ``wake_up(tags)`` brings
back ``weights`` and ``kv_cache`` separately, so new weights can be loaded before the
cache takes the rest of the device. The adapter maps RollMux's switch onto that:
``offload`` is level 1, ``discard`` level 2 (the trainer re-sends the weights after every
update, so a discarding rollout keeps no host copy), and a wake with both tags is a
complete wake. Weights arrive packed (:mod:`rollmux.runtime.weights`) and are loaded into
the engine's model by a vLLM worker extension, under their version.

Needs the ``vllm`` extra and a GPU. Written against vLLM's documented sleep-mode and
``collective_rpc`` interfaces; it has not been run in this project yet (no GPU, no vLLM):
``tests/test_vllm.py`` (marked ``gpu``) runs it where both exist.
"""

from __future__ import annotations

import time
from collections.abc import Collection
from typing import Any

import torch

from rollmux.core.errors import StaleWeights, WeightsDiscarded
from rollmux.runtime.adapter import WAKE_ALL, Footprint, SleepModeName, WakeTag
from rollmux.runtime.weights import PackedWeights

SLEEP_LEVEL = {"offload": 1, "discard": 2}
EXTENSION = "rollmux.jobs.vllm_rollout.WeightLoader"


class WeightLoader:
    """A vLLM worker extension: loads named tensors into the engine's model in place."""

    def rollmux_load(self, named: list[tuple[str, torch.Tensor]]) -> None:
        self.model_runner.model.load_weights(weights=named)  # type: ignore[attr-defined]


class _NoTensors:
    """vLLM keeps its tensors itself: the worker's RoleState-based paths see none."""

    awake = True
    needs_weights = False

    def host_bytes(self) -> int:
        return 0

    def weights_loaded(self) -> None:
        """The engine tracks its own weights (see :meth:`VLLMRollout.load_weights`)."""


class VLLMRollout:
    """Rollout role whose engine is a ``vllm.LLM`` with sleep mode; implements the adapter."""

    park_mode: SleepModeName = "offload"

    def __init__(self, model_path: str, weights_bytes: int, **engine_options: Any):
        from vllm import LLM  # the optional extra, imported only where a rollout runs on vLLM

        self.engine = LLM(model=model_path, enable_sleep_mode=True, worker_extension_cls=EXTENSION, **engine_options)
        self.weights_bytes = weights_bytes
        """The model's weights in bytes, what level-1 sleep keeps in host memory."""
        self.version = 0
        self.level = 0
        """0 awake, else the level it sleeps at."""
        self.state = _NoTensors()
        self._needs_weights = False

    def sleep(self, mode: SleepModeName = "offload") -> float:
        if mode not in SLEEP_LEVEL:
            raise ValueError(f"unknown sleep mode {mode!r}; modes are 'offload' and 'discard'")
        if self.level:
            return 0.0
        start = time.perf_counter()
        self.engine.sleep(level=SLEEP_LEVEL[mode])
        self.level = SLEEP_LEVEL[mode]
        self._needs_weights = self._needs_weights or mode == "discard"
        self.state.awake = False
        return time.perf_counter() - start

    def wake(self, tags: Collection[WakeTag] = WAKE_ALL) -> float:
        unknown = set(tags) - WAKE_ALL
        if unknown:
            raise ValueError(f"unknown wake tags {sorted(unknown)}; tags are {sorted(WAKE_ALL)}")
        start = time.perf_counter()
        self.engine.wake_up(tags=sorted(tags))
        if set(tags) == WAKE_ALL:
            self.level = 0
            self.state.awake = True
        return time.perf_counter() - start

    def footprint(self) -> Footprint:
        host = self.weights_bytes if self.level == 1 else 0
        return Footprint(host_bytes=host, device_bytes=self.weights_bytes)

    def load_weights(self, version: int, weights: PackedWeights) -> None:
        """Load synced weights into the engine (its weights must be awake)."""
        if weights.version < self.version:
            raise StaleWeights(f"weights version {weights.version} offered to a role holding version {self.version}")
        self.engine.collective_rpc("rollmux_load", args=(list(weights.views().items()),))
        self.version = weights.version
        self._needs_weights = False

    def generate(self, prompts: list[str], sampling: dict[str, Any], iteration: int) -> list[list[str]]:
        """Completions per prompt with the weights of ``iteration`` or newer."""
        from vllm import SamplingParams

        if self.version < iteration:
            raise StaleWeights(
                f"rollout of iteration {iteration} needs weights version {iteration}, holds {self.version}"
            )
        if self._needs_weights:
            raise WeightsDiscarded("the engine's weights were discarded at sleep and not re-sent since")
        outputs = self.engine.generate(prompts, SamplingParams(**sampling), use_tqdm=False)
        return [[completion.text for completion in output.outputs] for output in outputs]
