"""A rollout role whose generation runs in a vLLM engine: the role adapter for such jobs.

The role lives on a rollout worker like any other; its engine (:mod:`rollmux.jobs.vllm_engine`)
runs in a Ray actor of its own on the same node, one per (job, rollout node), started
once when the role is built (the cold start, at set-up) and parked between phases.
A job's own rollout role subclasses :class:`VLLMRollout` and implements ``generate``
with :meth:`VLLMRollout.complete` (see ``TRLVLLMRollout`` in :mod:`rollmux.jobs.trl_grpo`).

RollMux's switch on the engine, the same on CPU and GPU:

- **sleep**, either mode: the engine drops its weights and its KV cache (vLLM's sleep
  level 2 on a GPU, RollMux's own release on CPU, where vLLM has no sleep mode).
  ``offload`` keeps the weights in host memory: the role holds the trainer's last
  publication, which is the host copy; ``discard`` drops that too, and the next wake
  waits for weights from the trainer (:class:`WeightsDiscarded` until they arrive).
- **wake** by tags: ``weights`` gives the engine its weight memory back, ``kv_cache`` its
  cache; each tag is tracked on its own, so a wake of ``weights`` then of ``kv_cache``
  leaves the role fully awake. The host copy goes into the engine before its first
  generation (or newer weights, when the trainer's arrive first): one load per phase.
- **footprint**: host bytes are the host copy; device bytes are the weights and the KV
  cache the engine reserves, both counted where they live when awake.
- **weight sync**: ``load_weights`` keeps the new version as the host copy and, when the
  engine's weights are awake, loads it at once; older versions are refused.
- **moves**: the role travels without its engine (never pickled) but with its host copy;
  on the new node it starts a new engine at its first wake and loads that copy.
- **restarts**: a killed engine process fails the phase with Ray's ``RayActorError``, a
  platform failure, so the control plane restarts the job, whose factory builds the role
  and a new engine from the checkpoint.
"""

from __future__ import annotations

import time
import uuid
import weakref
from collections.abc import Collection
from dataclasses import replace
from typing import Any

import numpy as np
import ray
import torch
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from rollmux.core.errors import StaleWeights, WeightsDiscarded
from rollmux.jobs.vllm_engine import ENGINE_ENV, Completion, Engine, EngineSpec, Sampling
from rollmux.sdk.adapter import WAKE_ALL, Footprint, SleepModeName, WakeTag
from rollmux.sdk.weights import PackedWeights

ENGINE_PREFIX = "rollmux-vllm-engine-"
"""Engines are named actors (namespace ``rollmux``), so an operator can find one."""
REMOTE_ENGINE = ray.remote(Engine)


def launch_engine(spec: EngineSpec) -> Any:
    """An engine actor on this process's node, in its own process with vLLM's environment."""
    return REMOTE_ENGINE.options(
        name=f"{ENGINE_PREFIX}{uuid.uuid4().hex[:12]}",
        namespace="rollmux",
        num_cpus=0,
        max_concurrency=1,
        runtime_env={"env_vars": {**ENGINE_ENV, "OMP_NUM_THREADS": str(spec.threads)}},
        scheduling_strategy=NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False),
    ).remote(spec)


def _stop(engine: Any) -> None:
    """End an engine whose role is gone (dropped, replaced by a newer epoch's, or moved).
    Without Ray (shut down first) the engine went with it; ``ray.kill`` would start a new one."""
    if not ray.is_initialized():
        return
    try:
        ray.kill(engine)
    except ValueError:
        pass  # the actor is gone already


class EngineResidence:
    """The vLLM rollout's ``state``, what the worker reads and moves: which tags sleep and
    the host copy of the weights. It has no optimizer, so a co-located rollout may be
    parked by dropping its host copy (the trainer beside it holds the weights)."""

    optimizer = None

    def __init__(self, host: PackedWeights | None):
        self.host = host
        self.asleep: set[str] = set()
        self._lent: PackedWeights | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_lent": None}

    @property
    def awake(self) -> bool:
        return not self.asleep

    @property
    def needs_weights(self) -> bool:
        return self.host is None

    def weights_loaded(self) -> None:
        """Nothing to do: :meth:`VLLMRollout.load_weights` keeps the new host copy."""

    def host_bytes(self) -> int:
        return 0 if self.host is None else self.host.nbytes

    def discard(self) -> None:
        """Drop the host copy of a sleeping role, as a ``discard`` sleep would have."""
        if self.awake:
            raise RuntimeError("only a sleeping role discards its host copies; an awake one sleeps with discard")
        self.host = None

    def lend_buffers(self) -> list[np.ndarray | None]:
        """For a move (:class:`~rollmux.dataplane.portable.PortableRole`): the host copy's buffer,
        sent out of band; the role is pickled with an empty one meanwhile."""
        if self.awake:
            raise RuntimeError("only a sleeping role travels")
        self._lent = self.host
        if self.host is None:
            return [None]
        self.host = replace(self.host, buffer=np.empty(0, dtype=np.uint8))
        return [self._lent.buffer]

    def take_back(self) -> None:
        self.host, self._lent = self._lent, None

    def refill(self, lent: list[np.ndarray | None]) -> None:
        """On arrival: a buffer of this process's own for the host copy."""
        if self.host is not None and lent[0] is not None:
            self.host = replace(self.host, buffer=np.array(lent[0], copy=True))


class VLLMRollout:
    """Rollout role on a vLLM engine; implements the adapter (a job's subclass adds
    ``generate(iteration)``)."""

    park_mode: SleepModeName = "offload"

    def __init__(self, spec: EngineSpec, weights: PackedWeights):
        self.spec = spec
        self.version = weights.version
        self.state = EngineResidence(weights)
        itemsize = torch.empty(0, dtype=getattr(torch, spec.dtype)).element_size()
        self.weights_bytes = sum(int(np.prod(e.shape)) * itemsize for e in weights.layout.entries)
        """The model's weights at the engine's dtype."""
        self.kv_cache_bytes = spec.kv_cache_bytes
        self.start_s = 0.0
        """Seconds its last engine took to start (the cold start)."""
        self.load_s = 0.0
        """Seconds the engine's last weight load took inside it (Ray's transfer not counted)."""
        self._engine: Any = None
        self._loaded = -1
        """The version the engine holds (-1: none since it woke or started)."""
        self._start_engine()

    def __getstate__(self) -> dict[str, Any]:
        """A role travels without its engine (see the module's docstring)."""
        state = {**self.__dict__, "_engine": None, "_loaded": -1}
        state.pop("_finalizer", None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.state.asleep = set(WAKE_ALL)  # a new engine starts at the first wake

    def sleep(self, mode: SleepModeName = "offload") -> float:
        if mode not in ("offload", "discard"):
            raise ValueError(f"unknown sleep mode {mode!r}; modes are 'offload' and 'discard'")
        start = time.perf_counter()
        if self._engine is not None and self.state.asleep != WAKE_ALL:
            ray.get(self._engine.sleep.remote())
        self.state.asleep = set(WAKE_ALL)
        self._loaded = -1
        if mode == "discard":
            self.state.host = None
        return time.perf_counter() - start

    def wake(self, tags: Collection[WakeTag] = WAKE_ALL) -> float:
        unknown = set(tags) - WAKE_ALL
        if unknown:
            raise ValueError(f"unknown wake tags {sorted(unknown)}; tags are {sorted(WAKE_ALL)}")
        start = time.perf_counter()
        waking = set(tags) & self.state.asleep
        if self._engine is None:
            self._start_engine()  # a moved role: its engine starts on this node
            waking = set(tags)
        elif waking:
            ray.get(self._engine.wake.remote(sorted(waking)))
        self.state.asleep -= waking
        return time.perf_counter() - start

    def footprint(self) -> Footprint:
        return Footprint(host_bytes=self.state.host_bytes(), device_bytes=self.weights_bytes + self.kv_cache_bytes)

    def load_weights(self, version: int, weights: PackedWeights) -> None:
        """Weight sync's receiving end: keep ``weights`` as the host copy, and load them now
        if the engine's weights are awake. Older weights than the role's are refused."""
        if weights.version < self.version:
            raise StaleWeights(f"weights version {weights.version} offered to a role holding version {self.version}")
        names = sorted(entry.name for entry in weights.layout.entries)
        if names != sorted(self.spec.weight_names):
            differs = sorted(set(names) ^ set(self.spec.weight_names)) or ["a name given twice"]
            raise ValueError(f"weights version {weights.version} do not fit the engine's model: {differs[0]} differs")
        if self._engine is not None and "weights" not in self.state.asleep:
            self.load_s = ray.get(self._engine.load.remote(weights.version, weights))
            self._loaded = weights.version
        self.state.host, self.version = weights, weights.version

    def complete(
        self,
        prompts: list[list[int]],
        seeds: list[int],
        sampling: Sampling,
        max_tokens: list[int] | None = None,
    ) -> list[Completion]:
        """One completion per prompt from the engine, each with its own seed and, when
        ``max_tokens`` is given, its own limit (see :meth:`Engine.generate`)."""
        return ray.get(self._ready().generate.remote(prompts, seeds, sampling, max_tokens))

    def prompt_logprobs(self, sequences: list[list[int]]) -> list[list[float]]:
        """The engine's log-probability of each token of ``sequences`` after the first."""
        return ray.get(self._ready().prompt_logprobs.remote(sequences))

    def engine_held_bytes(self) -> int:
        """What the engine holds now (its KV cache and model tensors), awake or asleep."""
        if self._engine is None:
            raise RuntimeError("the role has no engine here yet: it starts at the role's first wake")
        return ray.get(self._engine.held_bytes.remote())

    def engine_pid(self) -> int:
        """The engine's process, awake or asleep (an operator's view of it)."""
        if self._engine is None:
            raise RuntimeError("the role has no engine here yet: it starts at the role's first wake")
        return ray.get(self._engine.pid.remote())

    def require_version(self, iteration: int) -> None:
        """On-policy: refuse to roll out iteration ``iteration`` on older weights."""
        if self.version < iteration:
            raise StaleWeights(
                f"rollout of iteration {iteration} needs weights version {iteration}, holds {self.version}"
            )

    def _ready(self) -> Any:
        """The engine, awake and holding the role's weights."""
        if self.state.asleep:
            raise RuntimeError(f"the role's {' and '.join(sorted(self.state.asleep))} sleep: wake it first")
        if self.state.needs_weights:
            raise WeightsDiscarded("the engine's weights were discarded at sleep and not re-sent since")
        if self._loaded != self.version:
            self._load()
        return self._engine

    def _load(self) -> None:
        assert self.state.host is not None
        self.load_s = ray.get(self._engine.load.remote(self.version, self.state.host))
        self._loaded = self.version

    def _start_engine(self) -> None:
        """Start an engine and wait until it serves (the cold start); it holds no weights
        until the first load."""
        start = time.perf_counter()
        engine = launch_engine(self.spec)
        self.kv_cache_bytes = ray.get(engine.kv_cache_bytes.remote())
        self.start_s = time.perf_counter() - start
        self._engine, self._loaded = engine, -1
        self._finalizer = weakref.finalize(self, _stop, engine)
