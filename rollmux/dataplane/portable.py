"""Sleeping roles travelling between workers, at memory speed.

A role's state lends and takes back its host buffers (``lend_buffers``, ``take_back``,
``refill`` of :class:`rollmux.sdk.state.RoleState`); this module only calls them, so a
worker that ships roles imports no torch of its own.
"""

from __future__ import annotations

import pickle
from typing import Any

import numpy as np
from ray import cloudpickle


class PortableRole:
    """A sleeping role as it travels between workers (a move, a copy to the buddy).

    Pickled as is, every tensor would go through pickle's bytes (about 0.2 GB/s). Wrapped,
    the role's objects are pickled with their tensors pointed at nothing, and each host
    buffer goes as a numpy array that Ray ships out of band (as it ships packed weights):
    one copy into the object store and one out, at memory speed. Numpy arrays the role
    holds (a weight publisher's buffer) go out of band too. The role's worker keeps its
    own copy untouched: its tensors are pointed back before the wrapper's pickling ends.
    """

    def __init__(self, role: Any):
        self.role = role

    def __reduce__(self) -> tuple:
        state = self.role.state
        lent = state.lend_buffers()
        held: list[pickle.PickleBuffer] = []
        try:
            skeleton = cloudpickle.dumps(self.role, protocol=5, buffer_callback=held.append)
        finally:
            state.take_back()
        return _arrive, (skeleton, lent, [np.frombuffer(b.raw(), dtype=np.uint8) for b in held])


def _arrive(skeleton: bytes, lent: list[np.ndarray | None], held: list[np.ndarray]) -> Any:
    role = cloudpickle.loads(skeleton, buffers=[bytearray(b) for b in held])  # writable, and its own
    role.state.refill(lent)
    return role
