"""The update's shared-prefix forward (issue 37 item 3) gives the packed forward's log-probs,
entropies and LoRA gradients to float32 rounding; reordering a mini-batch by prompt keeps its
loss; an iteration with it gives the gradient norm of one without it."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from hgpo.train.lora import add_adapters
from hgpo.train.loss import ppo_loss
from hgpo.train.model import pack, response_logprobs
from hgpo.train.prefix_forward import (
    MIN_SAVED_TOKENS,
    has_cache_api,
    prefix_pays,
    prompt_pass,
    response_pass,
    saved_tokens,
    shared_prefix_length,
    shared_prefix_logprobs,
    unique_prompts,
)
from hgpo.train.update import plan_epoch

LORA = SimpleNamespace(
    lora_rank=4, lora_alpha=8.0, lora_dropout=0.0, lora_targets="all-linear", lora_top_layers=0
)
LOSS = SimpleNamespace(clip_ratio=0.2, dual_clip=3.0, kl_coef=0.05, entropy_coef=0.01)
VOCAB = 97


@pytest.fixture(scope="module")
def model():
    """A tiny random Llama (SmolLM2's architecture: grouped-query attention, untied head) with
    LoRA on every linear layer, its adapters' B made non-zero so they act."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=256, tie_word_embeddings=False)  # fmt: skip
    m = add_adapters(LlamaForCausalLM(cfg).float(), LORA)
    with torch.no_grad():
        for n, p in m.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.3)
    m.train()  # the update's mode (LoRA dropout 0: the same function as eval)
    return m


def _stem_pairs(
    seed: int, rows: int, stem: int, repeat: int = 1
) -> tuple[list[list[int]], list[list[int]]]:
    """Prompts of a ``stem``-token common start and different own tails (one row's prompt is
    the stem + 1 token), each prompt ``repeat`` times in a row; responses of 1 to 6 tokens."""
    rng = np.random.default_rng(seed)
    head = rng.integers(1, VOCAB, stem).tolist()
    prompts = [head + rng.integers(1, VOCAB, int(rng.integers(1, 9))).tolist() for _ in range(rows)]
    prompts[-1] = [*head, int(rng.integers(1, VOCAB))]
    prompts = [p for p in prompts for _ in range(repeat)]
    responses = [rng.integers(1, VOCAB, int(rng.integers(1, 7))).tolist() for _ in prompts]
    return prompts, responses


def _loss_and_grads(model, lp, mask, seed: int, ent=None) -> dict[str, torch.Tensor]:
    """The LoRA gradients of a PPO loss (KL and entropy terms on) of log-probs ``lp``."""
    g = torch.Generator().manual_seed(seed)
    old = lp.detach() + 0.1 * torch.randn(lp.shape, generator=g)
    ref = lp.detach() + 0.1 * torch.randn(lp.shape, generator=g)
    adv = torch.randn(lp.shape[0], 1, generator=g).expand_as(lp)
    model.zero_grad(set_to_none=True)
    loss, _ = ppo_loss(lp, old, ref, adv, mask, LOSS, entropy=ent, denom=float(mask.sum()))
    loss.backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}


CASES = {  # rows, stem, repeat
    "long stem": (8, 40, 1),
    "no common prefix": (5, 0, 1),
    "single row": (1, 30, 1),
    "two rows, one token stem": (2, 1, 1),
    "repeated prompts": (3, 20, 3),
    "one prompt, four rows": (1, 25, 4),
    "repeated, no common prefix": (3, 0, 2),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_logprobs_entropies_and_lora_grads_equal_the_packed_forward(model, case):
    """Same log-probs and entropies to 1e-5, same LoRA gradients of a PPO loss (KL, entropy)
    to 1e-5 relative, as the packed forward: left-padded prompts of different lengths,
    right-padded responses of 1-6 tokens, a prompt of stem + 1 token, prompts repeated."""
    rows, stem, repeat = CASES[case]
    prompts, responses = _stem_pairs(len(case), rows, stem, repeat)
    if stem == 0:  # every distinct prompt starts with its own token
        prompts = [[1 + i // repeat, *p] for i, p in enumerate(prompts)]
    want_c = stem if rows > 1 else len(prompts[0]) - 1
    assert len(unique_prompts(prompts)[0]) == rows
    assert shared_prefix_length(prompts) == want_c
    b = pack(prompts, responses, 0, "cpu")
    lp0, ent0 = response_logprobs(model, b, with_entropy=True)
    g0 = _loss_and_grads(model, lp0, b.response_mask, 3, ent0)
    lp1, ent1, mask = shared_prefix_logprobs(model, prompts, responses, 0, "cpu", with_entropy=True)
    assert torch.equal(mask, b.response_mask)
    m = mask.bool()
    torch.testing.assert_close(lp1[m], lp0[m], rtol=0, atol=1e-5)
    torch.testing.assert_close(ent1[m], ent0[m], rtol=0, atol=1e-5)
    g1 = _loss_and_grads(model, lp1, mask, 3, ent1)
    assert g0.keys() == g1.keys() and len(g0) > 10
    for n, want in g0.items():
        scale = float(want.abs().max())
        assert scale > 0, n
        assert float((g1[n] - want).abs().max()) <= 1e-5 * scale + 1e-9, n


def test_temperature_and_no_entropy(model):
    prompts, responses = _stem_pairs(4, 4, 20)
    with torch.no_grad():
        want, _ = response_logprobs(model, pack(prompts, responses, 0, "cpu"), temperature=0.7)
        lp, ent, mask = shared_prefix_logprobs(model, prompts, responses, 0, "cpu", 0.7)
    assert ent is None
    torch.testing.assert_close(lp[mask.bool()], want[mask.bool()], rtol=0, atol=1e-5)


def test_pass_layouts():
    """The prompt pass: positions after the prefix, a mask over the prefix and real tokens,
    each prompt's last column; the response pass: positions after each row's own prompt, the
    prompt's pads masked out."""
    uniq, inverse = unique_prompts([[7, 8, 9, 4], [7, 8, 5], [7, 8, 9, 4]])
    assert uniq == [[7, 8, 9, 4], [7, 8, 5]] and inverse == [0, 1, 0]
    pp = prompt_pass(uniq, 2, 0)
    assert pp.ids.tolist() == [[9, 4], [5, 0]]
    assert pp.position.tolist() == [[2, 3], [2, 3]]
    assert pp.attention.tolist() == [[1, 1, 1, 1], [1, 1, 1, 0]]
    assert pp.last.tolist() == [1, 0]
    rp = response_pass([uniq[i] for i in inverse], [[1, 2], [3], [6]], pp.attention[inverse], 0)
    assert rp.ids.tolist() == [[1, 2], [3, 0], [6, 0]]
    assert rp.position.tolist() == [[4, 5], [3, 4], [4, 5]]
    assert rp.attention.tolist() == [[1, 1, 1, 1, 1, 1], [1, 1, 1, 0, 1, 0], [1, 1, 1, 1, 1, 0]]
    assert rp.mask.tolist() == [[1, 1], [1, 0], [1, 0]]
    with pytest.raises(ValueError, match="c=3 leaves a prompt"):
        prompt_pass([[7, 8, 9, 4], [7, 8, 5]], 3, 0)
    with pytest.raises(ValueError, match="2 prompts but 1 responses"):
        response_pass([[7, 8, 9], [7, 8, 5]], [[1]], pp.attention, 0)


def test_when_the_shared_passes_pay(model):
    stem = list(range(1, MIN_SAVED_TOKENS + 1))
    assert saved_tokens([[*stem, 50], [*stem, 51, 52]]) == MIN_SAVED_TOKENS
    assert prefix_pays([[*stem, 50], [*stem, 51, 52]])
    assert not prefix_pays([[*stem[:-1], 50], [*stem[:-1], 51]])  # one token short
    assert not prefix_pays([[*stem, 50]])  # a single row shares nothing
    assert saved_tokens([[60, *stem], [61, *stem], [60, *stem]]) == len(stem) + 1  # a repeat
    assert has_cache_api(model)
    assert not has_cache_api(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="empty prompt"):
        shared_prefix_length([[1], []])


def test_ordering_by_prompt_keeps_each_minibatch_and_its_token_count():
    """plan_epoch with prompts: the same rng draws, the same samples and token count in each
    mini-batch (so the same token-mean loss), each mini-batch's samples sorted by prompt."""
    rng = np.random.default_rng(0)
    prompts = [rng.integers(1, 5, int(rng.integers(1, 6))).tolist() for _ in range(21)]
    lengths = rng.integers(1, 9, 21).tolist()
    plain = plan_epoch(lengths, 3, 2, 4, np.random.default_rng(5))
    ordered = plan_epoch(lengths, 3, 2, 4, np.random.default_rng(5), prompts=prompts)
    for a, b in zip(plain, ordered, strict=True):
        assert [m.tokens for m in a] == [m.tokens for m in b]
        assert [m.weight for m in a] == [m.weight for m in b]
        assert [len(m.rows) for m in a] == [len(m.rows) for m in b]
        rows_a = sorted(int(i) for m in a if m.weight for i in m.rows)
        rows_b = [int(i) for m in b if m.weight for i in m.rows]
        assert sorted(rows_b) == rows_a
        keys = [(prompts[i], i) for i in rows_b]
        assert keys == sorted(keys)


def test_dropout_turns_it_off(model):
    from hgpo.train.prefix_forward import has_dropout

    assert not has_dropout(model)
    assert has_dropout(torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Dropout(0.1)))


def _iteration(out, monkeypatch, on: bool) -> tuple[dict, int]:
    """One tiny score-mode iteration (LoRA, KL) with the shared-prefix update on or off, and
    how many micro-batches took the shared-prefix forward."""
    from hgpo.train import trainer as trainer_mod
    from hgpo.train.train_config import resolve

    calls, padding = [], []
    real = trainer_mod.shared_prefix_logprobs
    real_step = trainer_mod.Trainer._micro_step

    def spy(*a, **k):
        calls.append(1)
        return real(*a, **k)

    def step_spy(self, roll, scored, targets, micro, stats):
        padding.append(micro.weight == 0)
        return real_step(self, roll, scored, targets, micro, stats)

    over = {"action_mode": "score", "lora_rank": 4, "kl_coef": 0.05, "iterations": 1,
            "val_every": 0, "save_every": 0, "max_steps": 3, "out_dir": str(out),
            "shared_prefix_update": on}  # fmt: skip
    with monkeypatch.context() as m:
        m.setattr(trainer_mod, "shared_prefix_logprobs", spy)
        m.setattr(trainer_mod.Trainer, "_micro_step", step_spy)
        t = trainer_mod.Trainer(resolve("toy:tmaze:length=1", "tiny", over))
        try:
            assert t.prefix_update is on
            got = t.iteration(1)
        finally:
            t.close()
    assert any(padding)  # a padding micro-batch (cut to one token each way) is in the plan
    return got, len(calls)


def test_an_iteration_equals_the_plain_update(tmp_path, monkeypatch):
    """Same seed, one tiny iteration (12 samples, mini-batches of 8, micro-batches of 4: one
    padding micro-batch): the shared-prefix update (and its order by prompt) gives the plain
    update's PPO loss, KL, entropy and gradient norm to float32 rounding."""
    on, n_on = _iteration(tmp_path / "on", monkeypatch, True)
    off, n_off = _iteration(tmp_path / "off", monkeypatch, False)
    assert n_on > 0 and n_off == 0
    assert on["n_steps"] == off["n_steps"] and on["grad_norm"] > 0
    for key in ("pg_loss", "kl", "grad_norm", "clip_frac", "entropy"):
        assert on[key] == pytest.approx(off[key], rel=1e-5, abs=1e-7), key
