"""One vLLM engine in a process of its own: what a vLLM rollout role drives from its worker.

The engine runs in a Ray actor of its own, beside the worker that hosts its role, never in
the worker's process: vLLM's CPU worker takes over ``torch.set_num_threads`` for the whole
process, and on a GPU its sleep-mode allocator is one per process, so two jobs' engines
in one worker would sleep each other's memory. Inside its actor the engine is vLLM's
in-process one (``VLLM_ENABLE_V1_MULTIPROCESSING=0``): no further process to start, and
its model is reachable from here.

Weights. The engine starts on random ("dummy") weights and takes every real version
through :meth:`Engine.load`, which streams the named tensors into vLLM's own in-place
reload (``reload_weights`` with checkpoint-format names). vLLM's CPU build repacks every
linear layer's weight into a oneDNN kernel and drops the tensor, so the model's
``load_weights`` alone cannot reach them (it fails for want of a ``weight_loader``); the
reload rebuilds each layer and repacks it. After every load the prefix cache is reset:
vLLM keeps it across a reload, and a prompt it saw before would otherwise be continued
from KV computed with the old weights (measured: up to 1.7 nats off on the second
version). A load names every tensor of the model or is refused, so a partial load cannot
pass silently.

Sleep. On a GPU vLLM's sleep level 2 drops weights and cache and ``wake_up(tags)`` maps
them back. vLLM has no sleep mode on CPU; there RollMux's own does the same: the KV
cache's storages are resized to nothing and back (every view of them follows, the
contents are gone, so the prefix cache is reset), the model's parameter storages
likewise, and every repacked linear kernel is dropped (its layer then refuses to run
until the next load rebuilds it). Either way the engine wakes without weights: its role
keeps the host copy and loads it (see :mod:`rollmux.jobs.vllm_rollout`).
"""

from __future__ import annotations

import ctypes
import os
import tempfile
import time
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from rollmux.core.errors import StaleWeights, WeightsDiscarded
from rollmux.sdk.weights import PackedWeights
from rollmux.wire.failpoints import failpoint

ENGINE_ENV = {
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",  # the node's cores are shared with other roles' processes
    "TOKENIZERS_PARALLELISM": "false",
}
"""The environment of an engine's process (its Ray actor's ``runtime_env``)."""

TAGS = frozenset({"weights", "kv_cache"})


@dataclass(frozen=True)
class EngineSpec:
    """What an engine is built from: plain data, so it travels with its role to any node."""

    files: dict[str, bytes]
    """The model folder without weights (config, tokenizer), written out where it starts."""
    weight_names: tuple[str, ...]
    """Every tensor a load must name, in checkpoint format (the trainer's ``state_dict``)."""
    dtype: str = "float32"
    kv_cache_bytes: int = 32 << 20
    """The KV cache it reserves on CPU (on a GPU, ``gpu_memory_utilization`` decides)."""
    max_model_len: int = 64
    threads: int = 1
    gpu_memory_utilization: float = 0.3


@dataclass(frozen=True)
class Sampling:
    """One rollout's sampling options, shared by its requests (each has its own seed)."""

    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    ignore_eos: bool = False
    """Sample past the end-of-sequence token, so a request runs to its ``max_tokens``: how a
    rollout emulates given response lengths (see :mod:`rollmux.jobs.long_tail`)."""


@dataclass(frozen=True)
class Completion:
    """A request's sampled tokens, exactly as sampled (ids, never text): the request goes on
    from where it stopped when its prompt plus ``token_ids`` is sent again."""

    token_ids: list[int]
    logprobs: list[float]
    """The sampled tokens' log-probabilities under the engine's weights (raw logits)."""
    finish_reason: str | None = None
    """vLLM's: ``"length"`` when it stopped at its ``max_tokens`` (there is more to sample),
    ``"stop"`` when the model ended it (an end-of-sequence or stop token)."""


def _discarded(*_: Any) -> torch.Tensor:
    raise WeightsDiscarded("the engine's weights were dropped at sleep and not loaded since")


def _model(worker: Any) -> torch.nn.Module:
    return worker.model_runner.get_model()


def _kv_caches(worker: Any) -> list[torch.Tensor]:
    return list(worker.model_runner.kv_caches)


class _Storages:
    """Storages that sleep by being resized to nothing: every tensor and view on them
    follows, and a wake gives them fresh (uninitialised) memory of their old size."""

    def __init__(self, tensors: list[torch.Tensor]):
        unique = {t.untyped_storage()._cdata: t.untyped_storage() for t in tensors}
        self.storages = list(unique.values())
        self.sizes = [s.nbytes() for s in self.storages]

    @property
    def nbytes(self) -> int:
        return sum(self.sizes)

    def held(self) -> int:
        """Bytes the storages hold now (0 asleep)."""
        return sum(storage.nbytes() for storage in self.storages)

    def release(self) -> None:
        for storage in self.storages:
            storage.resize_(0)

    def restore(self) -> None:
        for storage, size in zip(self.storages, self.sizes, strict=True):
            storage.resize_(size)


class Engine:
    """A ``vllm.LLM`` with RollMux's weight loading and sleep, one per (job, rollout node)."""

    def __init__(self, spec: EngineSpec):
        from vllm import LLM  # the engine's process imports vLLM; a worker never does

        self.folder = Path(tempfile.mkdtemp(prefix="rollmux-vllm-"))
        for name, data in spec.files.items():
            (self.folder / name).write_bytes(data)
        self.spec = spec
        self.gpu = torch.cuda.is_available()
        memory = (
            {"enable_sleep_mode": True, "gpu_memory_utilization": spec.gpu_memory_utilization}
            if self.gpu
            else {"kv_cache_memory_bytes": spec.kv_cache_bytes}
        )
        start = time.perf_counter()
        self.llm = LLM(
            model=str(self.folder),
            load_format="dummy",
            dtype=spec.dtype,
            max_model_len=spec.max_model_len,
            enforce_eager=True,
            seed=0,
            **memory,
        )
        self.start_s = time.perf_counter() - start
        self.version = -1
        """The version of the weights it holds; -1: only the random ones it started with."""
        self.asleep: set[str] = set()
        if not self.gpu:
            self.kv = _Storages(self.llm.collective_rpc(_kv_caches)[0])
            self.model = self.llm.collective_rpc(_model)[0]
            self.params = _Storages(list(self.model.parameters()))

    def pid(self) -> int:
        return os.getpid()

    def kv_cache_bytes(self) -> int:
        """The KV cache it holds awake: what it reserved, counted on its storages."""
        if self.gpu:
            return int(self.llm.llm_engine.vllm_config.cache_config.kv_cache_memory_bytes or 0)
        return self.kv.nbytes

    def held_bytes(self) -> int:
        """Bytes its KV cache and model tensors hold now: what a sleep gives back."""
        if self.gpu:
            return torch.cuda.memory_allocated()
        return self.kv.held() + self.params.held()

    def load(self, version: int, weights: PackedWeights) -> float:
        """Load weights of ``version`` in place; returns the seconds it took. Refuses older
        weights than it holds and a set of tensors other than the model's."""
        if "weights" in self.asleep:
            raise RuntimeError("the engine's weights sleep: wake them before loading")
        if version < self.version:
            raise StaleWeights(f"weights version {version} offered to an engine holding version {self.version}")
        names = [entry.name for entry in weights.layout.entries]
        if sorted(names) != sorted(self.spec.weight_names):
            differs = sorted(set(names) ^ set(self.spec.weight_names)) or ["a name given twice"]
            raise ValueError(f"weights version {version} do not fit the engine's model: {differs[0]} differs")
        start = time.perf_counter()
        named = list(weights.views().items())
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": named, "is_checkpoint_format": True})
        self.llm.reset_prefix_cache()
        self.version = version
        return time.perf_counter() - start

    def generate(
        self,
        prompts: list[list[int]],
        seeds: list[int],
        sampling: Sampling,
        max_tokens: list[int] | None = None,
    ) -> list[Completion]:
        """One completion per prompt, each sampled with its own seed: a request's result
        depends on its prompt, its seed and the weights only. ``max_tokens``, one per
        prompt, overrides ``sampling.max_tokens`` request by request: a rollout generated
        in chunks asks each request for what it has left."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        self._check_ready()
        failpoint("engine:generate")
        if len(prompts) != len(seeds):
            raise ValueError(f"{len(prompts)} prompts but {len(seeds)} seeds: one seed per request")
        limits = [sampling.max_tokens] * len(prompts) if max_tokens is None else max_tokens
        if len(limits) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(limits)} max_tokens: one limit per request")
        params = [
            SamplingParams(
                n=1,
                seed=seed,
                logprobs=0,
                max_tokens=limit,
                temperature=sampling.temperature,
                top_p=sampling.top_p,
                top_k=sampling.top_k,
                min_p=sampling.min_p,
                repetition_penalty=sampling.repetition_penalty,
                ignore_eos=sampling.ignore_eos,
            )
            for seed, limit in zip(seeds, limits, strict=True)
        ]
        requests = [TokensPrompt(prompt_token_ids=list(p)) for p in prompts]
        outputs = self.llm.generate(requests, params, use_tqdm=False)
        return [_completion(output.outputs[0]) for output in outputs]

    def prompt_logprobs(self, sequences: list[list[int]]) -> list[list[float]]:
        """Log-probability of each token after the first of each sequence, given the ones
        before it: what a trainer computes from its logits, to compare weights by."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        self._check_ready()
        outputs = self.llm.generate(
            [TokensPrompt(prompt_token_ids=list(s)) for s in sequences],
            SamplingParams(max_tokens=1, prompt_logprobs=0),
            use_tqdm=False,
        )
        return [
            [position[token].logprob for position, token in zip(out.prompt_logprobs[1:], seq[1:], strict=True)]
            for out, seq in zip(outputs, sequences, strict=True)
        ]

    def sleep(self) -> float:
        """Drop the weights and the KV cache (see the module's docstring); returns seconds."""
        start = time.perf_counter()
        if self.gpu:
            self.llm.sleep(level=2)
        else:
            self._sleep_on_cpu()
        self.asleep = set(TAGS)
        self.version = -1
        return time.perf_counter() - start

    def wake(self, tags: Collection[str]) -> float:
        """Give back the memory of what ``tags`` name: weights come back empty (the next
        :meth:`load` fills them), the KV cache empty with the prefix cache reset."""
        unknown = set(tags) - TAGS
        if unknown:
            raise ValueError(f"unknown wake tags {sorted(unknown)}; tags are {sorted(TAGS)}")
        start = time.perf_counter()
        waking = sorted(set(tags) & self.asleep)
        if self.gpu and waking:
            self.llm.wake_up(tags=waking)
        elif "weights" in waking:
            self.params.restore()
        if "kv_cache" in waking:
            if not self.gpu:
                self.kv.restore()
            self.llm.reset_prefix_cache()
        self.asleep -= set(waking)
        return time.perf_counter() - start

    def _sleep_on_cpu(self) -> None:
        if "weights" not in self.asleep:
            self.params.release()
            for module in self.model.modules():
                if hasattr(module, "cpu_linear"):
                    module.cpu_linear = _discarded  # drops the repacked kernel, which holds the weight
        if "kv_cache" not in self.asleep:
            self.kv.release()
        _return_freed_memory()

    def _check_ready(self) -> None:
        if self.asleep:
            raise RuntimeError(f"the engine's {' and '.join(sorted(self.asleep))} sleep: wake it before generating")
        if self.version < 0:
            raise WeightsDiscarded("the engine holds no weights: load them before generating")


def _completion(output: Any) -> Completion:
    tokens = list(output.token_ids)
    logprobs = [float(step[token].logprob) for step, token in zip(output.logprobs, tokens, strict=True)]
    return Completion(tokens, logprobs, output.finish_reason)


def _return_freed_memory() -> None:
    """glibc keeps freed blocks in its arenas; a sleeping engine gives them back to the
    system, so the node's memory shows what it frees."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:
        pass  # not glibc: its allocator returns memory its own way
