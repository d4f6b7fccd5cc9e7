"""A rollout's requests in chunks, and its unfinished ones moved onto fewer engines: the
job-side bookkeeping of long-tail rollout migration (DESIGN.md 5b, issue 29).

Why. Response lengths are long-tailed: most of a rollout's requests are done early, and
its last few hold every rollout node until the longest ends. RollMux moves them instead:
once about 80 % of the requests are done, the unfinished ones move onto a few of the
rollout's nodes and its other nodes are free for the next job's rollout
(:class:`rollmux.core.spec.RolloutTail` is the core's model of it). This module is what
makes the move real on vLLM engines; the driver that decides when and where calls it.

How. A rollout runs data-parallel, one engine per rollout node (:func:`split`), and in
*chunks* of at most ``chunk`` tokens per request (:func:`generate_chunk` on each node's
role), so between chunks the driver knows how many requests are done (:func:`progress`)
and every request is a plain record: its prompt and the tokens sampled so far. Moving one
is sending that record elsewhere (:func:`consolidate`); the next chunk resumes it there from
``prompt + tokens``. Each chunk's seed is a function of the request's seed and its tokens so
far, never of the node, so on the same weights a request comes out the same wherever its
chunks ran.

Lengths. How long a response is depends on the model; a rollout that must have long tails
(a tiny test model, an emulated job) draws each request's length (:func:`draw_lengths`,
lognormal) and samples with the end-of-sequence token ignored until that length.

Everything here is pure but :func:`generate_chunk`, which runs on a rollout role's worker,
and :func:`run_chunks`, the driver's loop over the nodes its grant holds.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, NamedTuple

import numpy as np
import ray

from rollmux.core.roundrobin import ROLLOUT

if TYPE_CHECKING:
    from rollmux.jobs.vllm_engine import Completion, Sampling
    from rollmux.jobs.vllm_rollout import VLLMRollout
    from rollmux.sdk.session import Session


@dataclass(frozen=True)
class Request:
    """One request of a rollout and what it generated so far, chunk by chunk. Frozen: every
    step returns new records, so a record that travelled to a role and back is never
    confused with the one the driver still holds."""

    index: int
    """Its place in the rollout: results are put back in this order."""
    prompt: list[int]
    seed: int
    length: int
    """The completion length drawn for it: it is done at this many tokens."""
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    """Each token's log-probability under the weights that sampled it."""
    versions: list[int] = field(default_factory=list)
    """The weights version of each chunk, to check that a moved request stayed on-policy."""
    nodes: list[int] = field(default_factory=list)
    """The node that generated each chunk."""

    @property
    def done(self) -> bool:
        return len(self.tokens) >= self.length

    @property
    def remaining(self) -> int:
        return max(0, self.length - len(self.tokens))


class Chunk(NamedTuple):
    """The engine's arguments for one chunk of a node's unfinished requests, in their order."""

    prompts: list[list[int]]
    seeds: list[int]
    max_tokens: list[int]


def draw_lengths(
    seed: int, iteration: int, count: int, median: float, sigma: float, max_len: int, min_len: int = 1
) -> list[int]:
    """``count`` completion lengths, lognormal around ``median`` with shape ``sigma`` (the
    long tail: the larger ``sigma``, the further the longest from the median), rounded and
    clipped to [``min_len``, ``max_len``]; a pure function of (seed, iteration)."""
    if median <= 0 or sigma < 0 or not 1 <= min_len <= max_len:
        raise ValueError(
            f"lengths need median > 0, sigma >= 0 and 1 <= min_len <= max_len; got median {median}, "
            f"sigma {sigma}, min_len {min_len}, max_len {max_len}"
        )
    rng = np.random.default_rng([seed, iteration])
    drawn = np.rint(rng.lognormal(mean=math.log(median), sigma=sigma, size=count))
    return [int(length) for length in np.clip(drawn, min_len, max_len)]


def chunk_seed(seed: int, generated: int) -> int:
    """The sampling seed of a request's chunk that starts after ``generated`` tokens: the
    same on every engine, so where a request resumes does not change what it samples."""
    state = np.random.SeedSequence([seed, generated]).generate_state(1, dtype=np.uint32)
    return int(state[0]) >> 1  # vLLM takes seeds below 2**31


def chunk_prompts(requests: Sequence[Request], chunk: int) -> Chunk:
    """The next chunk of the unfinished ``requests``: each goes on from its prompt and its
    tokens so far, for at most ``chunk`` tokens and never past its length."""
    if chunk < 1:
        raise ValueError(f"a chunk is at least one token, got {chunk}")
    unfinished = [r for r in requests if not r.done]
    return Chunk(
        prompts=[[*r.prompt, *r.tokens] for r in unfinished],
        seeds=[chunk_seed(r.seed, len(r.tokens)) for r in unfinished],
        max_tokens=[min(chunk, r.remaining) for r in unfinished],
    )


def advance(requests: Sequence[Request], completions: Sequence[Completion], version: int, node: int) -> list[Request]:
    """``requests`` with one chunk more: ``completions`` answer the unfinished ones, in the
    order of :func:`chunk_prompts`; finished ones come back as they were. Each chunk is
    recorded with the weights ``version`` and the ``node`` that sampled it.

    A completion the model stopped (end of sequence) is refused: the request would go on
    after its end in the next chunk. Chunks are sampled with ``ignore_eos``."""
    unfinished = [r for r in requests if not r.done]
    if len(completions) != len(unfinished):
        raise ValueError(f"{len(completions)} completions for {len(unfinished)} unfinished requests")
    answers = dict(zip((r.index for r in unfinished), completions, strict=True))
    return [r if r.done else _extend(r, answers[r.index], version, node) for r in requests]


def _extend(request: Request, completion: Completion, version: int, node: int) -> Request:
    if completion.finish_reason == "stop" or not completion.token_ids:
        raise ValueError(
            f"request {request.index} stopped after {len(request.tokens) + len(completion.token_ids)} of its "
            f"{request.length} tokens: sample its chunks with ignore_eos"
        )
    take = request.remaining
    return replace(
        request,
        tokens=[*request.tokens, *completion.token_ids[:take]],
        logprobs=[*request.logprobs, *completion.logprobs[:take]],
        versions=[*request.versions, version],
        nodes=[*request.nodes, node],
    )


def progress(requests: Sequence[Request]) -> float:
    """The share of ``requests`` done (1.0 for none: nothing to wait for)."""
    if not requests:
        return 1.0
    return sum(r.done for r in requests) / len(requests)


def split(requests: Sequence[Request], nodes: Sequence[int]) -> dict[int, list[Request]]:
    """The rollout's requests shared out over its ``nodes`` round-robin by index. Not by
    length: a real rollout cannot know its lengths beforehand, and the tail is what the
    migration balances (:func:`consolidate`)."""
    _check_nodes(nodes)
    ordered = sorted(requests, key=lambda r: r.index)
    return {node: ordered[place :: len(nodes)] for place, node in enumerate(nodes)}


def consolidate(shares: dict[int, list[Request]], keep: Sequence[int]) -> dict[int, list[Request]]:
    """Every unfinished request of ``shares`` (node -> its requests) dealt onto the ``keep``
    nodes: the migration of a tail onto a few nodes, and the spreading of a rollout onto
    nodes it was widened to (kept nodes need not hold a share yet). Finished requests stay
    where they are, so every node and every request appears once, by index: nodes not kept
    hold only finished requests and are free.

    Dealt round-robin by index, so the kept nodes' counts of unfinished requests differ by
    at most one. Not by tokens left: how long a response will be is what the driver cannot
    know (a drawn length is the test model's stand-in for the model's end-of-sequence)."""
    _check_nodes(keep)
    moved: dict[int, list[Request]] = {node: [r for r in share if r.done] for node, share in shares.items()}
    for node in keep:
        moved.setdefault(node, [])
    tail = sorted((r for share in shares.values() for r in share if not r.done), key=lambda r: r.index)
    for place, request in enumerate(tail):
        moved[keep[place % len(keep)]].append(request)
    return {node: sorted(share, key=lambda r: r.index) for node, share in moved.items()}


def _check_nodes(nodes: Sequence[int]) -> None:
    if not nodes or len(set(nodes)) != len(nodes):
        raise ValueError(f"nodes must be given, each once; got {list(nodes)}")


def generate_chunk(
    rollout: VLLMRollout, requests: Sequence[Request], chunk: int, sampling: Sampling, node: int
) -> list[Request]:
    """On a rollout role's worker: one chunk of ``requests`` on the role's engine, sampled
    with ``sampling`` but past the end-of-sequence token (each request ends at its drawn
    length), recorded with the role's weights version and ``node``."""
    prompts, seeds, max_tokens = chunk_prompts(requests, chunk)
    if not prompts:
        return list(requests)
    completions = rollout.complete(prompts, seeds, replace(sampling, ignore_eos=True), max_tokens)
    return advance(requests, completions, rollout.version, node)


def run_chunks(
    session: Session, iteration: int, shares: dict[int, list[Request]]
) -> tuple[dict[int, list[Request]], float | None]:
    """Chunks on every held node with unfinished requests until all are done: widened
    onto the nodes the control plane adds until the tail moves (``tail.threshold`` of the
    requests done), then on the tail's nodes only (the first ``tail.nodes`` it holds, or
    all it holds when that is fewer: it is widened no more either way). It asks the
    control plane for more nodes only while it holds fewer than its seat's, one round trip
    a chunk then. Returns the requests by node and the share done when the tail moved
    (None: the job has no tail)."""
    tail, moved_at = session.tail, None
    while not all(r.done for share in shares.values() for r in share):
        assert session.grant is not None
        if moved_at is None:
            if len(session.grant.nodes) < len(session.rollout_nodes) and session.widen():
                shares = consolidate(shares, session.grant.nodes)
            done = progress([r for share in shares.values() for r in share])
            if tail is not None and done >= tail.threshold:
                keep = session.grant.nodes[: tail.nodes]
                shares = consolidate(shares, keep)
                session.shed(keep)
                moved_at = done
        working = [n for n in session.grant.nodes if any(not r.done for r in shares.get(n, ()))]
        refs = [session.submit(ROLLOUT, n, "chunk", iteration, shares[n], n) for n in working]
        shares.update(zip(working, ray.get(refs), strict=True))
    return shares, moved_at


def rollout_metrics(requests: Sequence[Request], iteration: int, moved_at: float | None) -> dict[str, float]:
    """What the rollout did: when its tail moved, how many requests ran on more than one
    node, and how many chunks ran on weights other than the iteration's (0: on-policy)."""
    return {
        "tail_moved_at": moved_at if moved_at is not None else -1.0,
        "requests_moved": float(sum(len(set(r.nodes)) > 1 for r in requests)),
        "chunks_off_policy": float(sum(v != iteration for r in requests for v in r.versions)),
        "tokens": float(sum(len(r.tokens) for r in requests)),
    }
