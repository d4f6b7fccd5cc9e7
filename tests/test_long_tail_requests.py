"""Long-tail migration of a rollout's requests (issue 29): drawn lengths are seeded and
long-tailed; requests advance chunk by chunk to exactly their length; the migration moves
every unfinished request, and only those, onto the kept nodes, balanced by tokens left;
a chunk's seed does not depend on the node. On real vLLM engines, a request resumed on
another engine with the same weights is token for token the request never moved."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rollmux.jobs.long_tail import (
    Request,
    advance,
    chunk_prompts,
    consolidate,
    draw_lengths,
    generate_chunk,
    progress,
    split,
)
from rollmux.jobs.trl_grpo import TRLVLLMRollout
from rollmux.jobs.vllm_engine import Completion, Sampling
from tests.local_ray import fresh_local_ray
from tests.test_vllm import TASK


def completion(count: int, start: int = 0) -> Completion:
    return Completion(list(range(start, start + count)), [-1.0] * count, "length")


def partly_done(index: int, length: int, generated: int) -> Request:
    return Request(index, [1, 2], seed=index, length=length, tokens=[7] * generated, logprobs=[-1.0] * generated)


def test_lengths_are_seeded_bounded_and_long_tailed():
    lengths = draw_lengths(seed=3, iteration=1, count=10_000, median=100, sigma=1.0, max_len=4096)
    assert lengths == draw_lengths(seed=3, iteration=1, count=10_000, median=100, sigma=1.0, max_len=4096)
    assert lengths != draw_lengths(seed=3, iteration=2, count=10_000, median=100, sigma=1.0, max_len=4096)
    assert 1 <= min(lengths) and max(lengths) <= 4096
    median, p99 = np.percentile(lengths, [50, 99])
    assert 90 <= median <= 110
    assert p99 / median > 8  # exp(2.33 sigma) for a lognormal: the tail is ten times the median
    clipped = draw_lengths(seed=3, iteration=1, count=1000, median=100, sigma=1.0, max_len=150, min_len=50)
    assert min(clipped) == 50 and max(clipped) == 150
    with pytest.raises(ValueError, match="min_len <= max_len"):
        draw_lengths(seed=3, iteration=1, count=1, median=100, sigma=1.0, max_len=10, min_len=20)


def test_requests_advance_chunk_by_chunk_to_exactly_their_length():
    requests = [Request(0, [5], seed=1, length=5), Request(1, [6], seed=2, length=2)]
    prompts, seeds, max_tokens = chunk_prompts(requests, chunk=3)
    assert prompts == [[5], [6]] and max_tokens == [3, 2]
    requests = advance(requests, [completion(3), completion(2)], version=4, node=0)
    assert progress(requests) == 0.5
    prompts, next_seeds, max_tokens = chunk_prompts(requests, chunk=3)
    assert prompts == [[5, 0, 1, 2]] and max_tokens == [2]  # only the unfinished one goes on
    assert next_seeds[0] != seeds[0]  # a new chunk samples afresh
    requests = advance(requests, [completion(3, start=3)], version=4, node=1)  # one token too many
    assert [r.tokens for r in requests] == [[0, 1, 2, 3, 4], [0, 1]]
    assert [len(r.logprobs) for r in requests] == [5, 2]
    assert requests[0].versions == [4, 4] and requests[0].nodes == [0, 1]
    assert progress(requests) == 1.0 and chunk_prompts(requests, chunk=3).prompts == []


def test_advance_refuses_completions_that_do_not_fit():
    requests = [partly_done(0, length=4, generated=1), partly_done(1, length=4, generated=4)]
    with pytest.raises(ValueError, match="2 completions for 1 unfinished"):
        advance(requests, [completion(1), completion(1)], version=0, node=0)
    stopped = Completion([9], [-1.0], "stop")
    with pytest.raises(ValueError, match="request 0 stopped after 2 of its 4 tokens"):
        advance(requests, [stopped], version=0, node=0)


def test_a_chunks_prompt_and_seed_do_not_depend_on_the_node():
    requests = [Request(i, [i], seed=10 + i, length=9) for i in range(6)]
    here = advance(requests, [completion(4)] * 6, version=0, node=0)
    there = advance(requests, [completion(4)] * 6, version=0, node=5)
    assert chunk_prompts(here, chunk=4) == chunk_prompts(there, chunk=4)
    moved = consolidate(split(here, [0, 1, 2]), keep=[2])
    assert chunk_prompts(moved[2], chunk=4) == chunk_prompts(here, chunk=4)


def test_split_is_round_robin_by_index():
    requests = [Request(i, [i], seed=i, length=3) for i in reversed(range(7))]
    shares = split(requests, [4, 2])
    assert [r.index for r in shares[4]] == [0, 2, 4, 6] and [r.index for r in shares[2]] == [1, 3, 5]
    with pytest.raises(ValueError, match="each once"):
        split(requests, [1, 1])


@st.composite
def rollouts(draw: st.DrawFn) -> tuple[dict[int, list[Request]], list[int]]:
    """A rollout part way: its requests over 1 to 6 nodes, some done, and nodes to keep."""
    nodes = draw(st.lists(st.integers(0, 20), min_size=1, max_size=6, unique=True))
    lengths = draw(st.lists(st.integers(1, 60), min_size=0, max_size=40))
    requests = [partly_done(i, n, draw(st.integers(0, n))) for i, n in enumerate(lengths)]
    keep = draw(st.lists(st.sampled_from(nodes), min_size=1, max_size=len(nodes), unique=True))
    return split(requests, nodes), keep


@given(rollouts())
def test_consolidation_moves_only_the_unfinished_onto_the_kept_nodes_balanced(rollout):
    shares, keep = rollout
    moved = consolidate(shares, keep)
    indices = sorted(r.index for share in moved.values() for r in share)
    assert indices == sorted(r.index for share in shares.values() for r in share)  # every request once
    assert set(moved) == set(shares)
    for node, share in shares.items():
        assert [r for r in share if r.done] == [r for r in moved[node] if r.done]  # finished ones stay
        if node not in keep:
            assert all(r.done for r in moved[node])  # a freed node
    unfinished = [sum(not r.done for r in moved[node]) for node in keep]
    assert max(unfinished) - min(unfinished) <= 1
    assert consolidate(dict(reversed(shares.items())), keep) == moved  # deterministic


def test_widening_deals_the_unfinished_onto_a_node_without_a_share():
    requests = [Request(i, [1], seed=i, length=3) for i in range(4)]
    spread = consolidate(split(requests, [0]), keep=[0, 5])
    assert [r.index for r in spread[0]] == [0, 2] and [r.index for r in spread[5]] == [1, 3]


CHUNK = 6
SAMPLING = Sampling(max_tokens=CHUNK)
"""Temperature 1, seeded: what a request samples depends on its prompt, seed and weights."""


@pytest.fixture(scope="module")
def local_ray():
    yield from fresh_local_ray(rollout_nodes=2, train_nodes=1)


def rollout_requests() -> list[Request]:
    """The task's first prompts with long-tailed lengths that fit the model (192 positions)."""
    tokenizer = TASK.tokenizer()
    prompts = [tokenizer(row["prompt"]).input_ids for row in TASK.prompts(0)]
    lengths = draw_lengths(TASK.seed, 0, len(prompts), median=8, sigma=1.0, max_len=48)
    return [Request(i, p, seed=100 + i, length=n) for i, (p, n) in enumerate(zip(prompts, lengths, strict=True))]


def run_chunks(
    roles: dict[int, TRLVLLMRollout], shares: dict[int, list[Request]], until: float
) -> dict[int, list[Request]]:
    """What the driver does: a chunk on every node at a time until ``until`` of the
    requests are done (a node with nothing left is not asked)."""
    while progress([r for share in shares.values() for r in share]) < until:
        shares = {node: generate_chunk(roles[node], share, CHUNK, SAMPLING, node) for node, share in shares.items()}
    return shares


def test_a_request_resumed_on_another_engine_is_the_request_never_moved(local_ray):
    first, second = TRLVLLMRollout(TASK), TRLVLLMRollout(TASK)  # two engines, the same weights
    requests = rollout_requests()
    (alone,) = run_chunks({0: first}, {0: requests}, until=1.0).values()
    head = run_chunks({0: first, 1: second}, split(requests, [0, 1]), until=0.5)
    tail = run_chunks({0: first, 1: second}, consolidate(head, keep=[1]), until=1.0)
    moved = sorted((r for share in tail.values() for r in share), key=lambda r: r.index)
    assert any(0 in r.nodes and r.nodes[-1] == 1 for r in moved)  # begun on the first, ended on the second
    for got, expected in zip(moved, alone, strict=True):
        assert len(got.tokens) == got.length == expected.length
        assert got.versions == [first.version] * len(got.nodes)
        assert got.tokens == expected.tokens
        assert np.allclose(got.logprobs, expected.logprobs, rtol=0, atol=1e-5)  # measured: bit for bit
