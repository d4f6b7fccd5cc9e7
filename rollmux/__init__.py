"""RollMux: many RL post-training jobs sharing one disaggregated GPU cluster.

``rollmux.phase`` is the phase API job code uses; it is imported on first use so that the
simulator and the CLI do not load Ray.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    if name == "phase":
        from rollmux.sdk.session import phase

        return phase
    raise AttributeError(f"module 'rollmux' has no attribute {name!r}")
