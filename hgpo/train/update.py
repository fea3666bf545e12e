"""What the PPO update reads and returns: the scored samples, their targets, the mini-batch
plan (with the padding that keeps ranks in step) and the update's statistics."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from hgpo.train.loss import LossStats


@dataclass
class Scored:
    """Each step sample scored under the rollout's weights, before the update.

    old: the actor's per-token log-probs (float[R_i] per sample); ref: the reference's (None
    without a KL term); values: the critic's V(s) (float[] per sample; None without a critic);
    entropy: the mean token entropy of each sample's response (None unless the estimator
    reads ``entropy`` in action_mode "generate"; :func:`mean_token_entropy`).
    """

    old: list[torch.Tensor]
    ref: list[torch.Tensor] | None = None
    values: list[torch.Tensor] | None = None
    entropy: list[float] | None = None

    def value_array(self) -> np.ndarray | None:
        """float64[n] state values for the estimator, or None without a critic."""
        if self.values is None:
            return None
        return np.array([float(v) for v in self.values], dtype=np.float64)


def mean_token_entropy(entropy: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """float64[B]: each row's token entropies [B, R] averaged over its response tokens,

        H_i = (1 / |y_i|) sum_{j < |y_i|} H(p_theta(. | x_i, y_i,<j)),

    the ``entropy`` of a step for an estimator. A row without a response token has no mean: a
    RuntimeError naming it (a sampled response has at least one token)."""
    n = response_mask.sum(-1)
    if (n == 0).any():
        i = int(torch.nonzero(n == 0)[0, 0])
        raise RuntimeError(f"mean token entropy: sample {i} has no response token")
    return (entropy.double() * response_mask.double()).sum(-1) / n.double()


@dataclass(frozen=True)
class Targets:
    """What the update fits: each step's advantage, and its return for the critic (gae)."""

    advantages: np.ndarray
    """float64[n]."""
    returns: np.ndarray | None = None
    """float64[n], or None without a critic."""


@dataclass(frozen=True)
class MicroBatch:
    """The step samples of one forward/backward and how its loss is scaled."""

    rows: np.ndarray
    """int64 indices into the rollout's step samples."""
    tokens: int
    """Response tokens of the whole mini-batch: the token mean's denominator."""
    weight: float = 1.0
    """0 for a padding micro-batch, run only to keep the ranks' collectives in step."""


def count_minibatches(n_samples: int, per_minibatch: int) -> int:
    """Mini-batches this rank needs for ``n_samples`` (the trainer takes the max over ranks)."""
    return math.ceil(n_samples / per_minibatch) if n_samples else 0


def plan_epoch(
    lengths: Sequence[int],
    n_minibatches: int,
    micro_batch_size: int,
    grad_accum: int,
    rng: np.random.Generator,
    prompts: Sequence[Sequence[int]] | None = None,
) -> list[list[MicroBatch]]:
    """One PPO epoch: the samples shuffled, cut into ``n_minibatches`` mini-batches of
    ``grad_accum`` micro-batches each. A rank with fewer samples than the busiest one gets
    padding micro-batches (sample 0, weight 0): every rank runs the same number of backward
    passes and optimizer steps, as the all-reduces require.

    lengths: the response length of each step sample (the mini-batch's token count).
    prompts: each sample's prompt tokens; given, each mini-batch's samples are ordered by them
    before the cut into micro-batches, so that a micro-batch's prompts share long prefixes (the
    shared-prefix update). The mini-batch keeps its samples and its token count, so its loss
    (the micro-batches' token sums over that count, summed) is unchanged; the rng draws too.
    """
    n = len(lengths)
    if n_minibatches == 0:
        return []
    if n == 0:
        raise RuntimeError("a rank without any step sample cannot take part in the update")
    per = micro_batch_size * grad_accum
    perm = rng.permutation(n)
    plan = []
    for m in range(n_minibatches):
        idx = perm[m * per : (m + 1) * per]
        if prompts is not None:
            idx = np.array(sorted(idx, key=lambda i: (list(prompts[i]), int(i))), dtype=np.int64)
        tokens = max(1, sum(lengths[i] for i in idx))
        micro = []
        for a in range(grad_accum):
            rows = idx[a * micro_batch_size : (a + 1) * micro_batch_size]
            if len(rows):
                micro.append(MicroBatch(rows, tokens))
            else:
                micro.append(MicroBatch(np.zeros(1, dtype=np.int64), tokens, weight=0.0))
        plan.append(micro)
    return plan


def pad_rows(
    rows: Sequence[torch.Tensor], idx: np.ndarray, width: int, device: torch.device
) -> torch.Tensor:
    """float32[len(idx), width]: ``rows[i]`` for i in idx, cut or zero-padded to ``width``."""
    out = torch.zeros((len(idx), width), dtype=torch.float32)
    for j, i in enumerate(idx):
        out[j, : rows[i].shape[0]] = rows[i][:width]
    return out.to(device)


@dataclass
class UpdateStats:
    """The PPO update's figures, summed over its micro-batches (padding counts 0)."""

    pg: float = 0.0
    kl: float = 0.0
    entropy: float = 0.0
    clipped: float = 0.0
    tokens: float = 0.0
    finite: bool = True
    """False once a loss or a gradient norm was NaN or infinite."""
    grad_norms: list[float] = field(default_factory=list)
    """The actor's gradient norm before clipping, per optimizer step."""
    vf_losses: list[float] = field(default_factory=list)
    """The critic's loss per micro-batch (gae)."""
    optimizer_steps: int = 0
    lr: float = 0.0

    def add(self, s: LossStats, weight: float) -> None:
        """Count one micro-batch's loss terms (``weight`` 0: a padding micro-batch)."""
        self.pg += s.pg * weight
        self.kl += s.kl * weight
        self.entropy += s.entropy * weight
        self.clipped += s.clipped * weight
        self.tokens += s.tokens * weight
        self.finite = self.finite and s.finite

    def add_grad_norm(self, norm: float) -> None:
        """Record one optimizer step's gradient norm."""
        self.grad_norms.append(norm)
        self.finite = self.finite and math.isfinite(norm)

    def metrics(self) -> dict[str, float]:
        """Token means of the loss terms, mean gradient norm, steps, lr (and vf_loss)."""
        t = max(1.0, self.tokens)
        out = {
            "pg_loss": self.pg / t,
            "kl": self.kl / t,
            "entropy": self.entropy / t,
            "clip_frac": self.clipped / t,
            "grad_norm": float(np.mean(self.grad_norms)) if self.grad_norms else 0.0,
            "optimizer_steps": self.optimizer_steps,
            "lr": self.lr,
        }
        if self.vf_losses:
            out["vf_loss"] = sum(self.vf_losses) / len(self.vf_losses)
        return out
