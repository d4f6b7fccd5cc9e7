"""What the production trace does not say about its job types: widths and host memory.

Widths come from the trace's README (32B jobs need two nodes per phase, the rest one).
Host-memory growth per role is the published measurement (DESIGN.md §2: 3B ≈ 113–156 GB,
7B ≈ 240–276 GB, 14B ≈ 445–456 GB, 32B ≈ 490–520 GB); rollout takes the low end and
training the high end. 4B and 8B were not published and are interpolated linearly.
"""

from __future__ import annotations

MEMORY_GB_BY_MODEL_B: dict[float, tuple[float, float]] = {
    3: (113.0, 156.0),
    7: (240.0, 276.0),
    14: (445.0, 456.0),
    32: (490.0, 520.0),
}


def model_billions(job_type: str) -> float:
    """'14B_8k' -> 14.0. Raises ValueError for a type not shaped <size>B_<len>."""
    size = job_type.split("_", 1)[0]
    if not size.upper().endswith("B"):
        raise ValueError(f"job type {job_type!r} is not shaped <model size>B_<max length>")
    return float(size[:-1])


def host_memory_gb(job_type: str) -> tuple[float, float]:
    """(rollout, training) resident host memory per node, interpolated between measured sizes."""
    size = model_billions(job_type)
    known = sorted(MEMORY_GB_BY_MODEL_B)
    if size <= known[0]:
        return MEMORY_GB_BY_MODEL_B[known[0]]
    if size >= known[-1]:
        return MEMORY_GB_BY_MODEL_B[known[-1]]
    hi = next(k for k in known if k >= size)
    lo = known[known.index(hi) - 1]
    w = (size - lo) / (hi - lo)
    (r0, t0), (r1, t1) = MEMORY_GB_BY_MODEL_B[lo], MEMORY_GB_BY_MODEL_B[hi]
    return (r0 + w * (r1 - r0), t0 + w * (t1 - t0))


def node_width(job_type: str) -> int:
    """Nodes per phase: 32B jobs need two, every smaller model one."""
    return 2 if model_billions(job_type) >= 32 else 1
