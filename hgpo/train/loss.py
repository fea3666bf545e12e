"""The PPO loss: pure functions of per-token tensors, shared by the trainer, the GPU check
(``benchmarks/gpu_check_train.py``) and the tests. Nothing here knows about models or ranks.

Shapes: B step samples (rows), R response tokens (columns, right-padded; ``mask`` is 1 on real
tokens). Each step's advantage is broadcast to every token of its response.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

__all__ = ["LossSettings", "LossStats", "kl_k3", "policy_loss", "ppo_loss", "value_loss"]


class LossSettings(Protocol):
    """The coefficients :func:`ppo_loss` reads (``TrainConfig`` has them)."""

    clip_ratio: float
    dual_clip: float
    kl_coef: float
    entropy_coef: float


@dataclass(frozen=True)
class LossStats:
    """Token sums of one :func:`ppo_loss` call's terms (divide by ``tokens`` for means)."""

    pg: float
    """sum of m * l_clip."""
    kl: float
    """sum of m * k3 (0 without a reference)."""
    entropy: float
    """sum of m * H (0 without entropies)."""
    clipped: float
    """Tokens where the clipped term was taken."""
    tokens: float
    """sum of m."""
    finite: bool
    """Whether the loss is finite (a NaN or infinite loss stops the run)."""


def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Low-variance KL(pi || pi_ref) estimate per token: exp(d) - d - 1 with d = ref - lp
    (Schulman's k3), d clamped to [-20, 20] and the result to [-10, 10] as verl does."""
    d = (ref_logp - logp).clamp(-20.0, 20.0)
    return (torch.exp(d) - d - 1.0).clamp(-10.0, 10.0)


def policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    adv: torch.Tensor,
    clip: float,
    dual_clip: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's clipped surrogate per token, with dual clip (Ye et al. 2020).

    logp, old_logp: float[B, R]; adv: float[B, R] (the step advantage on every token).
    loss = max(-A r, -A clip(r, 1-eps, 1+eps)); for A < 0 it is further capped at -c A.
    Returns (loss [B, R], clipped [B, R] as 0/1 floats).
    """
    ratio = torch.exp((logp - old_logp).clamp(-20.0, 20.0))
    l1 = -adv * ratio
    l2 = -adv * ratio.clamp(1.0 - clip, 1.0 + clip)
    loss = torch.maximum(l1, l2)
    clipped = (l2 > l1).float()
    if dual_clip > 0:
        capped = torch.minimum(loss, -adv * dual_clip)
        loss = torch.where(adv < 0, capped, loss)
    return loss, clipped


def value_loss(
    v: torch.Tensor, v_old: torch.Tensor, ret: torch.Tensor, clip: float
) -> torch.Tensor:
    """PPO's clipped value loss 0.5 max((v - R)^2, (v_old + clip(v - v_old) - R)^2), per sample."""
    vc = v_old + (v - v_old).clamp(-clip, clip)
    return 0.5 * torch.maximum((v - ret) ** 2, (vc - ret) ** 2)


def ppo_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    ref_logp: torch.Tensor | None,
    adv: torch.Tensor,
    mask: torch.Tensor,
    cfg: LossSettings,
    *,
    entropy: torch.Tensor | None = None,
    denom: float | None = None,
) -> tuple[torch.Tensor, LossStats]:
    """The actor's loss of one (micro-)batch, a token mean:

        L = (1 / N) sum_{b,t} m_bt [ l_clip_bt + beta k3_bt - c_H H_bt ]

    with l_clip the dual-clipped surrogate of :func:`policy_loss` (ratio r = exp(logp - old_logp),
    epsilon = ``cfg.clip_ratio``, c = ``cfg.dual_clip``), k3 = :func:`kl_k3` (logp, ref_logp),
    beta = ``cfg.kl_coef``, H the token entropy, c_H = ``cfg.entropy_coef``.

    logp: float[B, R] under the current weights (with grad); old_logp: float[B, R] under the
    rollout's weights; ref_logp: float[B, R] under the reference, or None (no KL term);
    adv: float[B, R]; mask: float[B, R]; entropy: float[B, R] or None (no entropy term).
    N = ``denom``, by default sum(m); the trainer passes the token count of the whole
    mini-batch, so that the micro-batches' losses add up to the mini-batch's token mean.
    Returns (L, the terms' token sums as :class:`LossStats`).
    """
    pg, clipped = policy_loss(logp, old_logp, adv, cfg.clip_ratio, cfg.dual_clip)
    pg_sum = (pg * mask).sum()
    loss = pg_sum
    kl_sum = torch.zeros((), device=logp.device)
    if ref_logp is not None:
        kl_sum = (kl_k3(logp, ref_logp) * mask).sum()
        loss = loss + cfg.kl_coef * kl_sum
    ent_sum = torch.zeros((), device=logp.device)
    if entropy is not None:
        ent_sum = (entropy * mask).sum()
        loss = loss - cfg.entropy_coef * ent_sum
    loss = loss / (mask.sum() if denom is None else denom)
    stats = LossStats(
        pg=float(pg_sum.detach()),
        kl=float(kl_sum.detach()),
        entropy=float(ent_sum.detach()),
        clipped=float((clipped * mask).sum()),
        tokens=float(mask.sum()),
        finite=bool(torch.isfinite(loss.detach())),
    )
    return loss, stats
