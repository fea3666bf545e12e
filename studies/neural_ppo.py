"""PPO on a :class:`toyenvs.NeuralPolicy`: the recipe of ``studies/tabular_ppo.py`` in torch.

The same loss on each mini-batch of steps (see tabular_ppo's module docstring), with
z = net(c) / T the network's scaled logits:

    loss = mean_i [max(-A_i r_i, -A_i clip(r_i, 1 - eps, 1 + eps))  (at most -A_i c if A_i < 0)
                   + kl_coef * (exp(ref_i - lp_i) - (ref_i - lp_i) - 1)]
           - entropy_coef * mean_i H(pi(. | c_i)),

r_i = exp(lp_i - old_lp_i), ref_i = log pi_ref(a_i | c_i) under the starting network (a frozen
copy: the k3 KL to the initial policy), the gradient by autograd, its norm clipped over all the
parameters, and Adam (torch.optim.Adam, the tabular Adam's betas and eps) on the parameters.
:func:`ppo_loss` is checked against the tabular loss and its analytic gradient in
tests/studies/test_neural_ppo.py, so the two recipes cannot drift apart.
"""

from __future__ import annotations

import numpy as np
import torch

import toyenvs
from studies.tabular_ppo import PPOSettings, UpdateStats, check_finite_update

__all__ = ["NeuralPPO", "ppo_loss"]


def ppo_loss(
    z: torch.Tensor, ref_z: torch.Tensor, act: torch.Tensor, adv: torch.Tensor,
    old_lp: torch.Tensor, s: PPOSettings,
) -> tuple[torch.Tensor, dict[str, float]]:  # fmt: skip
    """The mini-batch PPO loss (module docstring) from scaled logits z, ref_z: float64[B, A]."""
    logp = torch.log_softmax(z, dim=1)
    idx = torch.arange(z.shape[0])
    lp = logp[idx, act]
    ratio = torch.exp(lp - old_lp)
    pg1 = -adv * ratio
    pg2 = -adv * torch.clamp(ratio, 1 - s.clip, 1 + s.clip)
    pg = torch.maximum(pg1, pg2)
    active = pg1 >= pg2
    if s.dual_clip > 0:
        dual = (adv < 0) & (pg > -adv * s.dual_clip)
        pg = torch.where(dual, -adv * s.dual_clip, pg)
        active &= ~dual
    d = torch.log_softmax(ref_z, dim=1)[idx, act] - lp
    kl = torch.exp(d) - d - 1.0
    H = -(logp.exp() * logp).sum(dim=1)
    loss = pg.mean() + s.kl_coef * kl.mean() - s.entropy_coef * H.mean()
    figs = {"pg_loss": float(pg.detach().mean()), "kl": float(kl.detach().mean()),
            "clip_frac": float((~active).double().mean()),
            "entropy": float(H.detach().mean())}  # fmt: skip
    return loss, figs


class NeuralPPO:
    """PPO state for one neural policy: the frozen reference network and torch's Adam."""

    def __init__(self, pol: toyenvs.NeuralPolicy, settings: PPOSettings) -> None:
        self.pol, self.s = pol, settings
        self.ref = pol.copy()
        self.opt = torch.optim.Adam(pol.parameters(), lr=settings.lr, betas=(0.9, 0.999), eps=1e-8)

    def old_log_probs(self, context: np.ndarray, action: np.ndarray) -> np.ndarray:
        """float64[n] log pi(a_t | c_t) under the current parameters (call before updating)."""
        return self.pol.log_probs(context)[np.arange(context.size), action]

    def _ref_logits(self, rows: np.ndarray) -> torch.Tensor:
        with torch.no_grad():
            return self.pol.forward_rows(rows, net=self.ref.net)

    def update(
        self,
        context: np.ndarray,
        action: np.ndarray,
        advantages: np.ndarray,
        old_lp: np.ndarray,
        rng: np.random.Generator,
    ) -> UpdateStats:
        """One PPO iteration over the steps (context rows, actions, advantages, old log-probs)."""
        s, pol = self.s, self.pol
        T = pol.temperature
        params = pol.parameters()
        n = context.size
        stats = []
        for _ in range(s.epochs):
            for mb in np.array_split(rng.permutation(n), max(1, min(s.minibatches, n))):
                # one forward per distinct context of the mini-batch, gathered per step
                rows, inv = np.unique(context[mb], return_inverse=True)
                inv = torch.from_numpy(inv.reshape(-1))
                loss, f = ppo_loss(
                    pol.forward_rows(rows)[inv] / T, self._ref_logits(rows)[inv] / T,
                    torch.from_numpy(action[mb]), torch.from_numpy(advantages[mb]),
                    torch.from_numpy(old_lp[mb]), s,
                )  # fmt: skip
                self.opt.zero_grad(set_to_none=True)
                loss.backward()
                clip = s.grad_clip if s.grad_clip > 0 else float("inf")
                gn = float(torch.nn.utils.clip_grad_norm_(params, clip))
                check_finite_update(loss.item(), gn)
                self.opt.step()
                stats.append((mb.size, f["pg_loss"], f["kl"], f["clip_frac"], f["entropy"], gn))
        w = np.array([x[0] for x in stats], dtype=np.float64)
        cols = np.array([x[1:] for x in stats])
        m = (w[:, None] * cols).sum(axis=0) / w.sum()
        return UpdateStats(*(float(v) for v in m))
