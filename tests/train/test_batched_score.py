"""The batched scorer of the truth pass gives HFEngine.score's figures (issue 30)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hgpo.train.batched_score import (
    batched_score,
    batched_token_logprobs,
    distinct_pairs,
    length_batches,
    prompt_runs,
)
from hgpo.train.model import pack, response_logprobs
from tests.train.tiny_engine import tiny_engine

CORPUS = ["the key lies at row 3, column 0; the door at row 2", "<action>up</action> left right"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return tiny_engine(tmp_path_factory.mktemp("m"), CORPUS, 300, seed=2)


def _pairs(rng: np.random.Generator, vocab: int) -> tuple[list[list[int]], list[list[int]]]:
    """Prompts of a shared stem (some of one length, some longer or shorter, one of a single
    token), each with 1 to 4 candidates of different lengths that share a prefix (one of one
    token), and one prompt repeated apart (two runs)."""
    stem = rng.integers(3, vocab, 40).tolist()
    prompts = [stem + rng.integers(3, vocab, 12).tolist() for _ in range(6)]
    prompts += [stem[: int(n)] + rng.integers(3, vocab, 5).tolist() for n in (3, 17, 30)]
    prompts += [[int(rng.integers(3, vocab))], prompts[0]]
    head = rng.integers(3, vocab, 6).tolist()
    flat_p, flat_r = [], []
    for p in prompts:
        for _ in range(int(rng.integers(1, 5))):
            flat_p.append(p)
            flat_r.append(head[: int(rng.integers(0, 7))] + rng.integers(3, vocab, 3).tolist())
        flat_p.append(p)
        flat_r.append([int(rng.integers(3, vocab))])
    return flat_p, flat_r


@pytest.mark.parametrize("pad_prompts", [False, True])
@pytest.mark.parametrize("max_tokens", [60, 8192])
def test_batched_score_equals_the_engine_score(tiny, pad_prompts, max_tokens):
    """Same summed log-probs to 1e-4 (float32 rounding of sums of ~10 tokens, about 1e-6
    relative) as HFEngine.score, one prompt at a time: batches of equal and of different
    (left-padded) prompt lengths, right-padded candidates of different lengths, shared
    prefixes, tiny batches (60 tokens: one prompt each) and large ones."""
    tok, engine = tiny
    rng = np.random.default_rng(0)
    prompts, responses = _pairs(rng, len(tok))
    want = np.array(engine.score(prompts, responses))
    seen = []
    got = batched_score(engine.model, prompts, responses, tok.pad_token_id, torch.device("cpu"),
                        max_tokens, pad_prompts, on_prompts=seen.append)  # fmt: skip
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-4)
    assert np.abs(want).max() > 1.0  # the figures are not trivially zero
    assert sum(seen) == len(prompt_runs(prompts))
    assert engine.score_batched(prompts, responses) == pytest.approx(list(want), abs=1e-4)


@pytest.mark.parametrize("max_tokens", [60, 8192])
def test_token_logprobs_equal_the_packed_forward(tiny, max_tokens):
    """batched_token_logprobs (the rollout's score mode) gives each response's token
    log-probs of the trainer's packed forward (response_logprobs, left-padded prompts) to
    float32 rounding, one figure per response token; HFEngine.score_tokens is it."""
    tok, engine = tiny
    prompts, responses = _pairs(np.random.default_rng(1), len(tok))
    got = batched_token_logprobs(engine.model, prompts, responses, tok.pad_token_id,
                                 torch.device("cpu"), max_tokens)  # fmt: skip
    assert [len(g) for g in got] == [len(r) for r in responses]
    with torch.no_grad():
        want, _ = response_logprobs(engine.model, pack(prompts, responses, tok.pad_token_id, "cpu"))
    for i, r in enumerate(responses):
        np.testing.assert_allclose(got[i], want[i, : len(r)].numpy(), atol=2e-5, err_msg=str(i))
    via_engine = engine.score_tokens(prompts, responses)
    assert [len(g) for g in via_engine] == [len(r) for r in responses]
    np.testing.assert_allclose(np.concatenate(via_engine), np.concatenate(got), atol=2e-5)
    sums = batched_score(engine.model, prompts, responses, tok.pad_token_id, torch.device("cpu"))
    np.testing.assert_allclose([sum(g) for g in got], sums, atol=1e-4)


def test_runs_and_batches():
    assert prompt_runs([[1], [1], [2], [1]]) == [(0, 2), (2, 3), (3, 4)]
    # equal lengths only, then by the token budget: (longest prompt x rows) and candidates
    assert length_batches([0, 1, 2, 3], [3, 3, 5, 3], [4, 4, 6, 4], 100, True) == [[0, 1], [2], [3]]
    assert length_batches([0, 1, 2], [3, 3, 5], [4, 4, 6], 100, False) == [[0, 1, 2]]
    assert length_batches([0, 1, 2], [3, 3, 5], [4, 4, 6], 9, False) == [[0, 1], [2]]


def test_distinct_pairs():
    first, where = distinct_pairs([[1], [1], [2], [1], [1]], [[5], [6], [5], [5], [7]])
    assert first == [0, 1, 2, 4]
    assert where == [0, 1, 2, 0, 3]


@pytest.mark.parametrize("per_token", [False, True])
def test_repeated_pairs_are_scored_once(tiny, per_token):
    """Episodes at the same state (a group's start, a shared history) score the same
    candidates: each distinct (prompt, response) pair goes through the model once and its
    figures are copied to every copy; the figures are those of the pairs scored apart, and the
    progress still counts every prompt run of the caller's list."""
    tok, engine = tiny
    prompts, responses = _pairs(np.random.default_rng(3), len(tok))
    k = len(prompts)
    rep_p, rep_r = prompts * 3 + prompts[:2], responses * 3 + responses[:2]
    tokens = []
    hook = engine.model.get_decoder().register_forward_hook(
        lambda _m, args, kw, _o: tokens.append(kw["input_ids"].numel()), with_kwargs=True
    )
    try:
        fn = batched_token_logprobs if per_token else batched_score
        once = fn(engine.model, prompts, responses, tok.pad_token_id, torch.device("cpu"))
        n_once, tokens[:] = sum(tokens), []
        seen: list[int] = []
        extra = {} if per_token else {"on_prompts": seen.append}
        got = fn(engine.model, rep_p, rep_r, tok.pad_token_id, torch.device("cpu"), **extra)
        n_rep = sum(tokens)
    finally:
        hook.remove()
    assert n_once > 0 and n_rep == n_once  # the copies cost no forward
    assert len(got) == len(rep_p)
    for i in range(len(rep_p)):
        assert got[i] == once[i % k]
    if per_token:
        assert got[0] is not got[k]  # each copy its own list
    else:
        assert sum(seen) == len(prompt_runs(rep_p))


def test_batched_score_refuses_bad_input(tiny):
    _, engine = tiny
    with pytest.raises(ValueError, match="2 prompts but 1 responses"):
        engine.score_batched([[1], [1]], [[2]])
    with pytest.raises(ValueError, match="an empty prompt"):
        engine.score_batched([[]], [[2]])
