"""ppo_loss: the terms by hand, and the identity the trainer's micro-batching relies on."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from hgpo.train.loss import ppo_loss

CFG = SimpleNamespace(clip_ratio=0.2, dual_clip=3.0, kl_coef=0.5, entropy_coef=0.1)


def test_ppo_loss_by_hand():
    lp = torch.log(torch.tensor([[1.5, 0.5, 1.0]]))  # ratios 1.5, 0.5, 1 (old = 0)
    old = torch.zeros(1, 3)
    ref = torch.tensor([[math.log(1.5), 0.0, 0.0]])
    adv = torch.ones(1, 3)
    mask = torch.tensor([[1.0, 1.0, 0.0]])  # the third token is padding
    ent = torch.tensor([[2.0, 1.0, 7.0]])
    loss, st = ppo_loss(lp, old, ref, adv, mask, CFG, entropy=ent)
    # surrogate: max(-1.5, -1.2) = -1.2 (clipped), max(-0.5, -0.8) = -0.5 -> sum -1.7
    # k3: d = ref - lp = 0 on token 1 -> 0; d = -log 0.5 = log 2 -> 2 - log 2 - 1
    kl = 1.0 - math.log(2.0)
    # entropy: 2 + 1 = 3 (the padded 7 is masked out); N = 2 tokens
    assert (st.pg, st.entropy, st.clipped, st.tokens) == pytest.approx((-1.7, 3.0, 1.0, 2.0))
    assert st.kl == pytest.approx(kl) and st.finite
    assert loss.item() == pytest.approx((-1.7 + 0.5 * kl - 0.1 * 3.0) / 2)


def test_micro_batches_with_the_minibatch_denominator_add_up_to_its_token_mean():
    g = torch.Generator().manual_seed(0)
    lp, old, ref = (torch.randn(6, 5, generator=g) * 0.3 - 2 for _ in range(3))
    adv = torch.randn(6, 1, generator=g).expand(-1, 5)
    mask = (torch.rand(6, 5, generator=g) > 0.3).float()
    whole, _ = ppo_loss(lp, old, ref, adv, mask, CFG)
    tokens = float(mask.sum())
    parts = [
        ppo_loss(lp[s], old[s], ref[s], adv[s], mask[s], CFG, denom=tokens)[0]
        for s in (slice(0, 2), slice(2, 6))
    ]
    assert float(sum(parts)) == pytest.approx(float(whole), rel=1e-6)


def test_no_reference_and_no_entropy_drop_their_terms():
    lp, old, adv, mask = torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1, 2), torch.ones(1, 2)
    loss, st = ppo_loss(lp, old, None, adv, mask, CFG)
    assert (loss.item(), st.kl, st.entropy) == (-1.0, 0.0, 0.0)


def test_a_nan_advantage_is_reported_not_finite():
    lp, old, mask = torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1, 2)
    _, st = ppo_loss(lp, old, None, torch.full((1, 2), float("nan")), mask, CFG)
    assert not st.finite
