"""Weight sync without pickling: a trainer's weights packed into one flat host buffer that
Ray ships out of band, and unpacked into the rollout's own, preallocated tensors.

A torch tensor handed to Ray is pickled (its bytes copied into a pickle stream, then into
the object store, then out again): 10–15 s per GiB on one host. A numpy array is not: Ray
writes its buffer into the shared-memory object store once, and a reader on the same host
maps it without a copy. So the trainer copies its tensors into one buffer it allocated
once (one copy), Ray stores it (one copy) and the rollout copies it into the tensors it
already has (one copy); across hosts Ray moves the buffer as raw bytes. Each buffer carries
its version, and a rollout refuses weights older than those it holds.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from rollmux.core.errors import StaleWeights

ALIGN = 64
"""Every tensor starts on a 64-byte boundary of the buffer, so any dtype can be viewed in place."""


@dataclass(frozen=True)
class Entry:
    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    offset: int
    nbytes: int


@dataclass(frozen=True)
class Layout:
    """Where each named tensor sits in the flat buffer."""

    entries: tuple[Entry, ...]
    nbytes: int

    @classmethod
    def of(cls, tensors: dict[str, torch.Tensor]) -> Layout:
        entries, offset = [], 0
        for name, tensor in tensors.items():
            nbytes = tensor.numel() * tensor.element_size()
            entries.append(Entry(name, tensor.dtype, tuple(tensor.shape), offset, nbytes))
            offset += -(-nbytes // ALIGN) * ALIGN
        return cls(tuple(entries), offset)


@dataclass(frozen=True)
class PackedWeights:
    """One version of a model's weights in one buffer; what crosses from trainer to rollout."""

    version: int
    layout: Layout
    buffer: np.ndarray

    @property
    def nbytes(self) -> int:
        return self.layout.nbytes

    def views(self) -> dict[str, torch.Tensor]:
        """Each tensor as a view of the buffer (read-only when mapped from Ray's store: the
        views are only copied from)."""
        flat = _as_tensor(self.buffer)
        return {e.name: flat[e.offset : e.offset + e.nbytes].view(e.dtype).view(e.shape) for e in self.layout.entries}


class Publisher:
    """The trainer's side: one buffer for the model's weights, allocated once and refilled
    at every publication."""

    def __init__(self, module: nn.Module):
        self.module = module
        self.layout = Layout.of(module.state_dict())
        self.buffer = np.empty(self.layout.nbytes, dtype=np.uint8)

    @torch.no_grad()
    def publish(self, version: int) -> PackedWeights:
        state = self.module.state_dict()
        if Layout.of(state) != self.layout:
            raise ValueError("the model's tensors changed names, shapes or dtypes since the publisher was made")
        packed = PackedWeights(version, self.layout, self.buffer)
        for name, view in packed.views().items():
            view.copy_(state[name])
        return packed


@torch.no_grad()
def load_packed(module: nn.Module, packed: PackedWeights, holds: int) -> int:
    """Copy ``packed`` into ``module``'s own tensors; refuses a version older than ``holds``
    (the version the module has now) and any tensor that does not match. Returns the version."""
    if packed.version < holds:
        raise StaleWeights(f"weights version {packed.version} offered to a role holding version {holds}")
    state = module.state_dict()
    views = packed.views()
    if views.keys() != state.keys():
        missing = sorted(state.keys() - views.keys()) or sorted(views.keys() - state.keys())
        raise ValueError(f"weights version {packed.version} do not fit this model: {missing[0]} differs")
    for name, tensor in state.items():
        tensor.copy_(views[name])
    return packed.version


def _as_tensor(buffer: np.ndarray) -> torch.Tensor:
    with warnings.catch_warnings():  # a buffer mapped from Ray's store is read-only; it is only read
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(buffer)
