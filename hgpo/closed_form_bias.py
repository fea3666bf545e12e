"""Closed forms of the bias of two group-relative advantage estimators (pure numpy).

1. GRPO's group baseline with binary rewards, conditioned on a non-degenerate group
   ("Your Group-Relative Advantage Is Biased", Yang et al., arXiv 2601.08521, 2026, Sec. 2).
   Setup of the paper: a prompt's rewards r_1..r_G are i.i.d. Bernoulli(p), the expected
   advantage of response i is A_i = r_i - p, the group baseline p_hat = (1/G) sum_j r_j, the
   group-relative advantage A_hat_i = r_i - p_hat, and the analysis conditions on the
   non-degenerate groups S = {1 <= sum_j r_j <= G - 1} (the only ones that give a gradient).
   With R = sum_j r_j ~ Binomial(G, p), P(S) = 1 - p^G - (1 - p)^G and E[R 1_S] = G(p - p^G):

       E[p_hat | S] = (p - p^G) / (1 - p^G - (1 - p)^G)                       (baseline_mean)
       E[A_hat_i - A_i | S] = p - E[p_hat | S]                                 (advantage_bias)

   which is < 0 for p < 1/2 (hard prompts: the advantage is underestimated), > 0 for p > 1/2
   (easy prompts: overestimated) and 0 only at p = 1/2, the paper's discovery (at G = 2,
   E[p_hat | S] = 1/2 whatever p). Per response, holding its own reward (r_i's own draw moves p_hat too), the same
   conditioning gives (our derivation; the degenerate groups have A_hat = 0, and
   E[A_hat_i | r_i] = (G - 1)/G (r_i - p) unconditionally):

       E[A_hat_i | S, r_i = 1] = (G - 1)(1 - p) / (G (1 - p^(G-1)))      (truth 1 - p)
       E[A_hat_i | S, r_i = 0] = -(G - 1) p / (G (1 - (1 - p)^(G-1)))      (truth -p)

   The stored copy of the paper we could read shows its setup (the definitions above and the
   conditioning on non-degenerate groups) but not the statement of its theorem, so these are
   derived from that setup rather than copied; docs/closed_forms.md says so.

2. The per-turn-index normalisation of MT-GRPO aggregated over a trajectory's own turns
   (``mtgrpo``, verl RFC #7244, https://github.com/verl-project/verl/issues/7244): the
   baseline subtracted at turn t is sum_{k=t}^{T_i-1} m_k, m_k the group mean of the turn-k
   rewards, so its number of terms is the trajectory's own stopping turn. The RFC's closed
   form: the bias is that accumulated group mean, a hidden reward -E[r_k] for every turn
   taken (-E[R_intermediate] per "take another turn" decision). At a finite group size G the
   exact form (our derivation, for rollouts i.i.d. within the group, undiscounted): with
   S_k = P(a rollout is still running at turn k) and mu_k = E[r_k | running at k],

       E[A_t^i | z_t, a_t] = sum_{k>=t} c_k E[(r_k - mu_k) 1(i running at k) | z_t, a_t]

   where c_k = E[(n_k - 1) / n_k] (mean over the group, trajectory i included) or
   c_k = P(n_k >= 2) (``leave_one_out``), n_k - 1 ~ Binomial(G - 1, S_k) the other rollouts
   still running at k (a one-member turn group gives 0). So the estimator's expected advantage
   is the exact advantage of the reward c_k r_k plus the hidden per-turn reward -c_k mu_k;
   as G grows c_k -> 1 and the bias is the RFC's -mu_k per turn. With ``all_turns`` (the fix)
   the baseline is a per-turn-index constant: the expected advantage is the exact one times
   (G - 1)/G (mean with trajectory i) or exactly (``leave_one_out``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from hgpo.options import bad, check_int

__all__ = [
    "advantage_bias",
    "baseline_mean",
    "conditional_advantage",
    "fix_scale",
    "mtgrpo_turn_weights",
    "nondegenerate_probability",
]


def _p(p: Any, where: str = "p") -> np.ndarray:
    arr = np.asarray(p, dtype=np.float64)
    if not np.all(np.isfinite(arr)) or np.any((arr < 0.0) | (arr > 1.0)):
        raise bad(where, "probabilities in [0, 1]", p)
    return arr


def _G(G: Any, lo: int = 2) -> int:
    return check_int("G", G, lo=lo, hi=1_000_000)


def nondegenerate_probability(p: Any, G: int) -> np.ndarray:
    """P(1 <= R <= G - 1) = 1 - p^G - (1 - p)^G, R ~ Binomial(G, p)."""
    p, G = _p(p), _G(G)
    return 1.0 - p**G - (1.0 - p) ** G


def baseline_mean(p: Any, G: int) -> np.ndarray:
    """E[p_hat | 1 <= R <= G - 1] = (p - p^G) / (1 - p^G - (1 - p)^G) (module docstring, 1);
    p in (0, 1) (at 0 or 1 no group is non-degenerate: NaN there)."""
    p, G = _p(p), _G(G)
    den = 1.0 - p**G - (1.0 - p) ** G
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0.0, (p - p**G) / np.where(den > 0, den, 1.0), np.nan)


def advantage_bias(p: Any, G: int) -> np.ndarray:
    """E[A_hat_i - A_i | non-degenerate] = p - E[p_hat | non-degenerate]: < 0 for p < 1/2,
    > 0 for p > 1/2, 0 at p = 1/2 (Yang et al., arXiv 2601.08521, Sec. 2)."""
    return _p(p) - baseline_mean(p, G)


def conditional_advantage(p: Any, G: int, r: int) -> np.ndarray:
    """E[A_hat_i | non-degenerate, r_i = r] for r in {0, 1} (module docstring, 1); the truth
    is r - p. NaN where the conditioning event is empty (p = 1 with r = 1, p = 0 with r = 0)."""
    p, G = _p(p), _G(G)
    if r not in (0, 1):
        raise bad("r", "0 or 1", r)
    q = p if r == 1 else 1.0 - p  # probability of the other members matching r_i
    den = G * (1.0 - q ** (G - 1))
    num = (G - 1) * (1.0 - p) if r == 1 else -(G - 1) * p
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0.0, num / np.where(den > 0, den, 1.0), np.nan)


def mtgrpo_turn_weights(alive: Any, G: int, leave_one_out: bool = False) -> np.ndarray:
    """c_k of the exact finite-G form (module docstring, 2) from S_k = ``alive`` (float64[H],
    the probability that a rollout is still running at turn k): E[(n_k - 1)/n_k] with
    n_k - 1 ~ Binomial(G - 1, S_k), = 1 - (1 - (1 - S_k)^G) / (G S_k) (1 - 1/1 = 0 at S_k = 0),
    or P(n_k >= 2) = 1 - (1 - S_k)^(G-1) with ``leave_one_out``."""
    S, G = _p(alive, "alive"), _G(G)
    if leave_one_out:
        return 1.0 - (1.0 - S) ** (G - 1)
    with np.errstate(invalid="ignore", divide="ignore"):
        e_inv = np.where(S > 0.0, (1.0 - (1.0 - S) ** G) / (G * np.where(S > 0, S, 1.0)), 1.0)
    return 1.0 - e_inv


def fix_scale(G: int, leave_one_out: bool = False) -> float:
    """The fix's expected advantage over the exact one (module docstring, 2): (G - 1)/G with
    the mean over the whole group, 1 with ``leave_one_out``."""
    G = _G(G)
    return 1.0 if leave_one_out else (G - 1) / G
