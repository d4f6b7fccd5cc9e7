"""Sleep/wake state of one job role: tensors that live in host memory between phases.

A role's tensors (weights, optimizer state) are on the device only while the role's
phase runs. ``sleep`` copies them into host buffers (pinned when CUDA is present) and
frees the device copies; ``wake`` copies them back. On a CPU-only machine the "device"
copy is a separate buffer, so a switch is a real copy whose cost is measured. ``save``
and ``restore`` are the cold path: a checkpoint on disk.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn


@dataclass
class _Slot:
    """One tracked tensor: where to read it, where to put it, and its host buffer."""

    get: Callable[[], torch.Tensor]
    put: Callable[[torch.Tensor], None]
    host: torch.Tensor | None = None


def default_device() -> torch.device:
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


class RoleState:
    """The tensors of one job role, moved between device and host memory as a unit."""

    def __init__(self, module: nn.Module, optimizer: torch.optim.Optimizer | None = None, device=None):
        self.module = module
        self.optimizer = optimizer
        self.device = torch.device(device) if device is not None else default_device()
        self.awake = True
        self.module.to(self.device)

    def _slots(self) -> list[_Slot]:
        slots = []
        for tensor_owner in (*self.module.parameters(), *self.module.buffers()):
            slots.append(_Slot(get=lambda o=tensor_owner: o.data, put=lambda t, o=tensor_owner: setattr(o, "data", t)))
        if self.optimizer is not None:
            for per_param in self.optimizer.state.values():
                for key, value in per_param.items():
                    if torch.is_tensor(value) and value.dim() > 0:
                        slots.append(
                            _Slot(
                                get=lambda d=per_param, k=key: d[k],
                                put=lambda t, d=per_param, k=key: d.__setitem__(k, t),
                            )
                        )
        return slots

    def sleep(self) -> float:
        """Offload every tensor to host memory; returns the seconds it took."""
        start = time.perf_counter()
        if self.awake:
            for slot in self._slots():
                device_tensor = slot.get()
                host = torch.empty(
                    device_tensor.shape, dtype=device_tensor.dtype, pin_memory=self.device.type == "cuda"
                )
                host.copy_(device_tensor)
                slot.put(host)
            self.awake = False
        return time.perf_counter() - start

    def wake(self) -> float:
        """Load every tensor into a fresh device buffer; returns the seconds it took."""
        start = time.perf_counter()
        if not self.awake:
            for slot in self._slots():
                host = slot.get()
                device_tensor = torch.empty(host.shape, dtype=host.dtype, device=self.device)
                device_tensor.copy_(host, non_blocking=self.device.type == "cuda")
                slot.put(device_tensor)
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            self.awake = True
        return time.perf_counter() - start

    def host_bytes(self) -> int:
        """Bytes this role keeps resident in host memory while asleep."""
        return sum(slot.get().numel() * slot.get().element_size() for slot in self._slots())

    def save(self, path: Path, extra: dict | None = None) -> None:
        """Checkpoint to disk (the cold path) with ``extra`` plain data beside the tensors.

        Written to a temporary file, synced and renamed: a crash at any moment leaves the
        previous checkpoint or the new one, never half of one.
        """
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        payload = {"module": self.module.state_dict(), "extra": extra or {}}
        if self.optimizer is not None:
            payload["optimizer"] = self.optimizer.state_dict()
        temporary = path.with_name(path.name + ".tmp")
        with temporary.open("wb") as handle:
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


def read_checkpoint(path: Path, device: torch.device | str = "cpu") -> dict:
    """A checkpoint written by :meth:`RoleState.save` (tensors and plain data only)."""
    return torch.load(Path(path), map_location=device, weights_only=True)
