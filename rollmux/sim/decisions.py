"""The control plane's decisions as a sequence both hosts can be held to: where each job was
placed, re-seated before it started, or moved, read from the job events the one state
machine writes (:class:`~rollmux.core.control.ControlState`), live or under the virtual
clock. ``rollmux replay`` compares the two sequences and says where they first part."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

DECISION_KINDS = ("placed", "reseated", "moving")
"""Job events that record a decision of placement or regrouping (see ``ControlState``)."""
GROUP = re.compile(r"\bgroup (\d+)")


@dataclass(frozen=True)
class Decision:
    """One decision: the job, what was decided and the group it was seated in, when."""

    at: float
    job: str
    kind: str
    group: int

    @property
    def what(self) -> tuple[str, str, int]:
        """The decision without its time, which differs between two clocks."""
        return (self.job, self.kind, self.group)


def decisions(events: Iterable[Mapping[str, Any]], order: Mapping[str, int]) -> list[Decision]:
    """The decisions among job events (each with ``job``, ``at``, ``kind``, ``detail``), in
    time order; events of one instant in the jobs' submission ``order`` (a regrouping
    writes its jobs' events at one instant, a burst of arrivals may come at one too)."""
    found = []
    for event in events:
        if event["kind"] not in DECISION_KINDS:
            continue
        match = GROUP.search(event["detail"])
        if match is None:
            raise ValueError(f"a {event['kind']} event of job {event['job']} names no group: {event['detail']!r}")
        found.append(Decision(event["at"], event["job"], event["kind"], int(match.group(1))))
    return sorted(found, key=lambda d: (d.at, order.get(d.job, len(order)), DECISION_KINDS.index(d.kind)))


def divergence(live: list[Decision], control: list[Decision]) -> dict[str, Any]:
    """How two hosts' decisions compare: their counts (the live ones by kind), whether they
    are the same sequence, and the first place they part (index, and each side's decision
    there, with its time)."""
    same = [a.what for a in live] == [b.what for b in control]
    first = None
    if not same:
        index = next(
            (i for i, (a, b) in enumerate(zip(live, control, strict=False)) if a.what != b.what),
            min(len(live), len(control)),
        )
        first = {
            "index": index,
            "live": _shown(live, index),
            "control": _shown(control, index),
        }
    kinds = {kind: sum(1 for d in live if d.kind == kind) for kind in DECISION_KINDS}
    return {"live": len(live), "control": len(control), "same": same, "live_by_kind": kinds, "first_divergence": first}


def _shown(found: list[Decision], index: int) -> dict[str, Any] | None:
    if index >= len(found):
        return None
    decision = found[index]
    return {"at": decision.at, "job": decision.job, "kind": decision.kind, "group": decision.group}
