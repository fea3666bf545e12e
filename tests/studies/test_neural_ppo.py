"""Neural PPO: the torch loss is the tabular recipe's; train_toy --policy mlp|transformer runs."""

from __future__ import annotations

import numpy as np
import pytest

import toyenvs
from studies.tabular_ppo import PPOSettings, TabularPPO

torch = pytest.importorskip("torch")
from studies.neural_ppo import NeuralPPO, ppo_loss  # noqa: E402


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_torch_loss_and_gradient_equal_the_tabular_ones(temperature: float) -> None:
    # On a table, autograd of ppo_loss w.r.t. the logits must give TabularPPO's loss and its
    # analytic gradient: every branch (clip, dual clip, k3 KL, entropy) is hit by the draws.
    env = toyenvs.make("tmaze", length=2, horizon=6)
    pol = toyenvs.TabularPolicy(env, K=1, temperature=temperature)
    toyenvs.exact_ground_truth(env, pol)
    s = PPOSettings(clip=0.2, dual_clip=3.0, kl_coef=0.05, entropy_coef=0.01)
    ppo = TabularPPO(pol, s)
    rng = np.random.default_rng(0)
    pol.logits[:] = rng.normal(size=pol.logits.shape)
    n = 300
    rows = rng.integers(0, pol.n_contexts, n)
    act = rng.integers(0, env.n_actions, n)
    adv = 3 * rng.normal(size=n)
    old_lp = pol.log_probs(rows)[np.arange(n), act] + rng.normal(scale=0.5, size=n)
    loss, grad, figs = ppo.loss_and_grad(rows, act, adv, old_lp)
    logits = torch.tensor(pol.logits, requires_grad=True)
    ref = torch.from_numpy(ppo._ref(rows))
    t_loss, t_figs = ppo_loss(
        logits[torch.from_numpy(rows)] / temperature, ref / temperature,
        torch.from_numpy(act), torch.from_numpy(adv), torch.from_numpy(old_lp), s,
    )  # fmt: skip
    t_loss.backward()
    assert 0 < figs["clip_frac"] < 1
    assert t_loss.item() == pytest.approx(loss, rel=1e-12)
    np.testing.assert_allclose(logits.grad.numpy(), grad, rtol=1e-9, atol=1e-12)
    for k in figs:
        assert t_figs[k] == pytest.approx(figs[k], rel=1e-12)


def test_update_moves_probability_toward_positive_advantage() -> None:
    env = toyenvs.make("tmaze", length=2, horizon=6)
    pol = toyenvs.NeuralPolicy(env, K=1, width=16, seed=0)
    ppo = NeuralPPO(pol, PPOSettings(lr=0.01, minibatches=1))
    row = np.zeros(64, dtype=np.int64)
    act = np.zeros(64, dtype=np.int64)
    before = pol.probs(row[:1])[0, 0]
    old = ppo.old_log_probs(row, act)
    st = ppo.update(row, act, np.ones(64), old, np.random.default_rng(0))
    assert pol.probs(row[:1])[0, 0] > before
    assert np.isfinite(st.grad_norm) and st.kl == pytest.approx(0.0, abs=1e-12)
