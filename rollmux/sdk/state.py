"""Sleep/wake state of one job role: tensors that live in host memory between phases.

A role's tensors (weights, buffers, gradients, every optimizer tensor) are on the device
only while the role's phase runs. ``sleep`` copies them into host buffers and frees the
device memory (returned to the device with ``empty_cache``); ``wake`` copies them back.
The host buffers — pinned when CUDA is present — are allocated once and reused at every
switch, as a GPU runtime must (pinning a fresh buffer per switch costs more than the
copy). Tensors are re-pointed in place (``Tensor.set_``), never replaced, so the
optimizer's references, tied weights and views stay what they were. On a CPU-only machine
the "device" copy is a separate buffer, so a switch is a real copy whose cost is measured.
``save`` and ``restore`` are the cold path: a checkpoint on disk.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from enum import Enum
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn


class SleepMode(str, Enum):
    OFFLOAD = "offload"
    """Keep a host copy: the role wakes with the very tensors it slept with."""
    DISCARD = "discard"
    """Keep nothing (a rollout role whose weights the trainer re-sends before it runs)."""


@dataclass(frozen=True)
class _Placement:
    """Where one tensor sits inside its storage, so it can be re-pointed at a copy."""

    tensor: torch.Tensor
    offset: int
    size: torch.Size
    stride: tuple[int, ...]

    def point_at(self, storage: torch.UntypedStorage) -> None:
        self.tensor.set_(storage, self.offset, self.size, self.stride)

    def release(self) -> None:
        """Hold no memory (the geometry is kept here for the wake)."""
        self.tensor.set_(torch.empty(0, dtype=self.tensor.dtype, device=self.tensor.device))


@dataclass(frozen=True)
class _Asleep:
    """One storage of a sleeping role: its size, its tensors and its host copy (None: discarded)."""

    nbytes: int
    placed: list[_Placement]
    host: torch.UntypedStorage | None


def default_device() -> torch.device:
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


def pinned_bytes(nbytes: int) -> int:
    """Host memory a pinned buffer of ``nbytes`` really takes: CUDA's host allocator rounds a
    request up to a power of two."""
    return 1 << max(0, nbytes - 1).bit_length()


class RoleState:
    """The tensors of one job role, moved between device and host memory as a unit."""

    def __init__(self, module: nn.Module, optimizer: torch.optim.Optimizer | None = None, device=None):
        self.module = module
        self.optimizer = optimizer
        self.device = torch.device(device) if device is not None else default_device()
        self.awake = True
        self.needs_weights = False
        """Slept with ``discard``: its weights must be loaded again before it runs."""
        self._asleep: list[_Asleep] = []
        self._spare: dict[int, list[torch.UntypedStorage]] = {}
        """Host buffers by size, back from the last wake and reused by the next sleep."""
        self._held: list[Any] = []
        self.module.to(self.device)

    def __getstate__(self) -> dict[str, Any]:
        """A sleeping role is pickled when it moves to another worker. Its tensors point at
        its host buffers and carry their bytes; the buffers themselves are not sent twice,
        and the spare ones not at all."""
        state = self.__dict__.copy()
        state["_asleep"] = [replace(a, host=None) if a.host is not None else a for a in self._asleep]
        state["_kept"] = [a.host is not None for a in self._asleep]
        state["_spare"] = {}
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        """The unpickled tensors hold the bytes: each storage's first tensor's is its host copy."""
        kept = state.pop("_kept")
        self.__dict__.update(state)
        self._asleep = [
            replace(a, host=a.placed[0].tensor.untyped_storage()) if keep else a
            for a, keep in zip(self._asleep, kept, strict=True)
        ]

    @torch.no_grad()
    def lend_buffers(self) -> list[np.ndarray | None]:
        """For a transfer of the sleeping role (see
        :class:`rollmux.dataplane.portable.PortableRole`): its host buffers as numpy views
        (None for discarded ones), its tensors pointed at nothing meanwhile so that
        pickling them carries no bytes. :meth:`take_back` undoes it."""
        if self.awake:
            raise RuntimeError("only a sleeping role travels")
        lent = []
        for asleep in self._asleep:
            lent.append(None if asleep.host is None else _bytes_view(asleep.host).numpy())
            for placed in asleep.placed:
                placed.release()
        return lent

    @torch.no_grad()
    def take_back(self) -> None:
        """Point the tensors at their host buffers again after :meth:`lend_buffers`."""
        for asleep in self._asleep:
            for placed in asleep.placed:
                if asleep.host is not None:
                    placed.point_at(asleep.host)

    @torch.no_grad()
    def refill(self, lent: list[np.ndarray | None]) -> None:
        """On arrival: copy each lent buffer into a host buffer of this process and point the
        tensors at it (the lent ones are the transfer's, read-only and short-lived)."""
        for index, (asleep, source) in enumerate(zip(self._asleep, lent, strict=True)):
            if source is None:
                continue
            host = self._host_buffer(asleep.nbytes)
            _bytes_view(host).copy_(torch.from_numpy(source))
            for placed in asleep.placed:
                placed.point_at(host)
            self._asleep[index] = replace(asleep, host=host)

    def also_holds(self, buffer: Any) -> None:
        """Count ``buffer`` (anything with ``nbytes``: a weight publisher's numpy buffer) in
        the role's host memory: it stays in host memory awake or asleep."""
        self._held.append(buffer)

    @property
    def pinned(self) -> bool:
        return self.device.type == "cuda"

    def _tensors(self) -> Iterator[torch.Tensor]:
        """Every tensor of the role: parameters, their gradients, buffers, optimizer state."""
        for parameter in self.module.parameters():
            yield parameter
            if parameter.grad is not None:
                yield parameter.grad
        yield from self.module.buffers()
        if self.optimizer is not None:
            for per_parameter in self.optimizer.state.values():
                yield from (value for value in per_parameter.values() if torch.is_tensor(value))

    def _on_device(self) -> list[tuple[torch.UntypedStorage, list[_Placement]]]:
        """The role's device storages, each once (tied weights and views share one), with
        the tensors placed in them. Storages already in host memory (an optimizer's step
        counters next to a GPU model) stay where they are."""
        groups: dict[int, tuple[torch.UntypedStorage, list[_Placement]]] = {}
        seen: set[int] = set()
        for tensor in self._tensors():
            if id(tensor) in seen or tensor.device.type != self.device.type:
                continue
            seen.add(id(tensor))
            storage = tensor.untyped_storage()
            placed = _Placement(tensor, tensor.storage_offset(), tensor.size(), tensor.stride())
            groups.setdefault(storage._cdata, (storage, []))[1].append(placed)
        return list(groups.values())

    def _host_buffer(self, nbytes: int) -> torch.UntypedStorage:
        spare = self._spare.get(nbytes)
        if spare:
            return spare.pop()
        buffer = torch.UntypedStorage(nbytes)
        return buffer.pin_memory() if self.pinned else buffer

    @torch.no_grad()
    def sleep(self, mode: SleepMode | str = SleepMode.OFFLOAD) -> float:
        """Move every tensor off the device (``offload``: into host buffers; ``discard``:
        nowhere) and free the device memory; returns the seconds it took."""
        mode = SleepMode(mode)
        start = time.perf_counter()
        if not self.awake:
            return 0.0
        if mode == SleepMode.DISCARD and self.optimizer is not None:
            raise ValueError("a role with optimizer state cannot discard it: sleep it with offload")
        self._asleep = []
        for storage, placed in self._on_device():
            host = None
            if mode == SleepMode.OFFLOAD:
                host = self._host_buffer(storage.nbytes())
                host.copy_(storage)
            for p in placed:
                p.point_at(host) if host is not None else p.release()
            self._asleep.append(_Asleep(storage.nbytes(), placed, host))
        self._spare.clear()  # buffers of sizes the role no longer has
        if self.pinned:
            torch.cuda.empty_cache()
        self.awake = False
        self.needs_weights = mode == SleepMode.DISCARD
        return time.perf_counter() - start

    @torch.no_grad()
    def wake(self) -> float:
        """Put every tensor back into fresh device memory; returns the seconds it took.
        A discarded role wakes with uninitialised weights, to be loaded before it runs."""
        start = time.perf_counter()
        if self.awake:
            return 0.0
        for asleep in self._asleep:
            device_storage = torch.UntypedStorage(asleep.nbytes, device=self.device)
            if asleep.host is not None:
                device_storage.copy_(asleep.host, non_blocking=self.pinned)
                self._spare.setdefault(asleep.nbytes, []).append(asleep.host)
            for p in asleep.placed:
                p.point_at(device_storage)
        if self.pinned:
            torch.cuda.synchronize(self.device)
        self._asleep = []
        self.awake = True
        return time.perf_counter() - start

    @torch.no_grad()
    def discard(self) -> None:
        """Give up the host copies of a sleeping role, as a ``discard`` sleep would have: a
        co-located rollout whose trainer, on the same node, holds the weights it needs."""
        if self.awake:
            raise RuntimeError("only a sleeping role discards its host copies; an awake one sleeps with discard")
        if self.optimizer is not None:
            raise ValueError("a role with optimizer state cannot discard it")
        for asleep in self._asleep:
            for placed in asleep.placed:
                placed.release()
        self._asleep = [replace(asleep, host=None) for asleep in self._asleep]
        self._spare.clear()
        self.needs_weights = True

    def weights_loaded(self) -> None:
        """The role's weights were written again after a ``discard`` sleep."""
        self.needs_weights = False

    def host_bytes(self) -> int:
        """Host memory the role holds or needs to sleep: every device storage's host copy
        (pinned ones rounded as the allocator rounds them) and its tensors kept in host
        memory. The same awake or asleep, so a node's residency check holds at every phase."""
        held = sum(int(buffer.nbytes) for buffer in self._held)
        rounded = pinned_bytes if self.pinned else int
        if self.awake:
            copies = sum(rounded(storage.nbytes()) for storage, _ in self._on_device())
            copies = max(copies, sum(rounded(n) * len(buffers) for n, buffers in self._spare.items()))
        else:
            copies = sum(rounded(a.nbytes) for a in self._asleep if a.host is not None)
        if not self.pinned:
            return copies + held
        kept = {t.untyped_storage()._cdata: t.untyped_storage().nbytes() for t in self._tensors() if not t.is_cuda}
        return copies + held + sum(kept.values())

    def save(self, path: Path, extra: dict | None = None) -> None:
        """Checkpoint to disk (the cold path) with ``extra`` plain data beside the tensors.

        Written to a temporary file, synced and renamed: a crash at any moment leaves the
        previous checkpoint or the new one, never half of one.
        """
        path = Path(path)
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        payload = {"module": self.module.state_dict(), "extra": extra or {}}
        if self.optimizer is not None:
            payload["optimizer"] = self.optimizer.state_dict()
        temporary = path.with_name(path.name + ".tmp")
        # Owner-only, whatever the worker's umask (or a temporary file a crash left): a
        # checkpoint lives in the control plane's private state folder.
        descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.fchmod(descriptor, 0o600)
        with os.fdopen(descriptor, "wb") as handle:
            torch.save(payload, handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)

    def restore(self, path: Path) -> dict:
        """Rebuild the tensors from a checkpoint on disk (the role is awake afterwards) and
        return the plain data saved with them."""
        self.wake()
        payload = read_checkpoint(path, self.device)
        self.module.load_state_dict(payload["module"])
        if self.optimizer is not None and "optimizer" in payload:
            self.optimizer.load_state_dict(payload["optimizer"])
        return payload.get("extra", {})


def _bytes_view(storage: torch.UntypedStorage) -> torch.Tensor:
    """The storage's bytes as a uint8 tensor sharing its memory."""
    return torch.empty(0, dtype=torch.uint8).set_(storage, 0, (storage.nbytes(),), (1,))


def read_checkpoint(path: Path, device: torch.device | str = "cpu") -> dict:
    """A checkpoint written by :meth:`RoleState.save` (tensors and plain data only)."""
    return torch.load(Path(path), map_location=device, weights_only=True)
