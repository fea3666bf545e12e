"""Loss pieces with hand-derived values, packing, log-probs, the tiny model and tokenizer."""

from __future__ import annotations

import math

import pytest
import torch

from hgpo.train.hf_engine import HFEngine
from hgpo.train.loss import kl_k3, policy_loss, value_loss
from hgpo.train.model import Critic, encode_prompt, pack, response_logprobs
from hgpo.train.tiny import build_tiny


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from transformers import AutoModelForCausalLM

    from hgpo.train.model import load_tokenizer

    path = build_tiny(tmp_path_factory.mktemp("tiny") / "m", ["go to fridge 1, open it"], 400)
    return (
        load_tokenizer(str(path)),
        AutoModelForCausalLM.from_pretrained(str(path)).eval(),
        str(path),
    )


def test_policy_loss_clip_and_dual_clip_by_hand():
    lp = torch.log(torch.tensor([[1.5, 0.5, 5.0, 1.1]]))
    old = torch.zeros(1, 4)
    adv = torch.tensor([[1.0, 1.0, -1.0, -2.0]])
    loss, clipped = policy_loss(lp, old, adv, clip=0.2, dual_clip=3.0)
    # r = 1.5, A = 1: max(-1.5, -1.2) = -1.2 (clipped); r = 0.5, A = 1: max(-0.5, -0.8) = -0.5
    # r = 5, A = -1: max(5, 1.2) = 5, dual clip caps at 3 x 1 = 3
    # r = 1.1, A = -2: max(2.2, 2.2) = 2.2 (inside the clip range), below the cap 6
    assert torch.allclose(loss, torch.tensor([[-1.2, -0.5, 3.0, 2.2]]), atol=1e-6)
    assert clipped.tolist() == [[1.0, 0.0, 0.0, 0.0]]
    no_dual, _ = policy_loss(lp, old, adv, clip=0.2, dual_clip=0.0)
    assert no_dual[0, 2].item() == pytest.approx(5.0)


def test_kl_k3_by_hand():
    lp, ref = torch.tensor([0.0, math.log(0.5)]), torch.tensor([0.0, 0.0])
    # d = ref - lp = 0 -> 0; d = log 2 -> 2 - log 2 - 1
    assert torch.allclose(kl_k3(lp, ref), torch.tensor([0.0, 1.0 - math.log(2.0)]))
    assert (kl_k3(torch.randn(100), torch.randn(100)) >= 0).all()


def test_value_loss_clips_around_old_value():
    v, v_old, ret = torch.tensor([1.0]), torch.tensor([0.0]), torch.tensor([1.0])
    # unclipped error 0; clipped value 0.2 -> 0.5 x 0.8^2 = 0.32 (the max is taken)
    assert value_loss(v, v_old, ret, 0.2).item() == pytest.approx(0.32)


def test_pack_aligns_responses():
    b = pack([[5, 6, 7], [8]], [[1, 2], [3]], pad_id=0, device="cpu")
    assert b.P == 3
    assert b.input_ids.tolist() == [[5, 6, 7, 1, 2], [0, 0, 8, 3, 0]]
    assert b.attention_mask.tolist() == [[1, 1, 1, 1, 1], [0, 0, 1, 1, 0]]
    assert b.position_ids[1, 2:4].tolist() == [0, 1]
    assert b.response_mask.tolist() == [[1, 1], [1, 0]]


def test_tokenizer_round_trip_and_chatml(tiny):
    tok, _, _ = tiny
    text = "<think>hm</think><action>go to fridge 1</action> naïve ü"
    assert tok.decode(tok(text)["input_ids"]) == text
    ids = encode_prompt(tok, "hello", 10_000)
    assert tok.decode(ids) == "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n"
    assert len(encode_prompt(tok, "hello " * 200, 32)) == 32  # cut from the left


def test_response_logprobs_equal_a_plain_forward(tiny):
    tok, model, _ = tiny
    prompts = [tok("go to fridge")["input_ids"], tok("open")["input_ids"]]
    responses = [tok(" it 1")["input_ids"], tok(" fridge 1 now")["input_ids"]]
    b = pack(prompts, responses, tok.pad_token_id, "cpu")
    lp, ent = response_logprobs(model, b, with_entropy=True)
    for i, (p, r) in enumerate(zip(prompts, responses, strict=True)):
        ids = torch.tensor([p + r])
        logits = model(input_ids=ids).logits[0].float()
        want = torch.log_softmax(logits[len(p) - 1 : -1], -1).gather(-1, torch.tensor(r)[:, None])[
            :, 0
        ]
        assert torch.allclose(lp[i, : len(r)], want, atol=1e-5)
    assert (ent[b.response_mask.bool()] > 0).all()


def test_hf_engine_stops_at_eos_and_respects_length(tiny):
    tok, model, _ = tiny
    eng = HFEngine(model, tok, batch_size=3, device=torch.device("cpu"))
    torch.manual_seed(0)
    prompts = [encode_prompt(tok, f"task {i}", 64) for i in range(5)]
    out = eng.generate(prompts, temperature=1.0, top_p=1.0, max_new=12)
    assert len(out) == 5
    for r in out:
        assert 1 <= len(r) <= 12
        assert all(t not in eng.stop for t in r[:-1])  # a stop token only at the end


def test_critic_starts_at_zero(tiny):
    tok, _, path = tiny
    critic = Critic(path, torch.float32)
    b = pack([tok("a b c")["input_ids"]], [[1]], tok.pad_token_id, "cpu")
    assert critic(b).tolist() == [0.0]
