"""Figures that compare estimated advantages, and the policy gradients they give, with the true
ones: sign agreement, the batch policy-gradient estimate of a tabular softmax policy, and its
cosine and relative error against the exact gradient. Pure numpy.

Their inputs are arrays (estimates, true advantages, the policy's table pi(. | c), an exact
gradient), wherever the truth comes from: ``toyenvs.exact_ground_truth`` for the toy POMDPs, the
LLM policy's exact chain in ``hgpo.train.truth_monitor``. They need nothing but numpy, so they sit in the
lowest layer, where the trainer and the studies (``studies.metrics`` re-exports them) both
reach them without loading an environment.

A *sample* is one step of one batch; ``context`` is the row of the policy's logits table of
each step (``c`` below), ``action`` its action, ``advantage`` its estimated advantage.
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "cosine_relerr",
    "gradient_compare",
    "gradient_estimate",
    "sign_agreement",
    "visited_gradient_estimate",
]


def sign_agreement(estimate: np.ndarray, truth: np.ndarray, tol: float = 1e-9) -> float:
    """Share of samples with |A*| > tol whose estimate has the same sign (0 counts as wrong)."""
    sel = np.abs(truth) > tol
    if not sel.any():
        return float("nan")
    return float((np.sign(estimate[sel]) == np.sign(truth[sel])).mean())


def gradient_estimate(
    context: np.ndarray, action: np.ndarray, advantage: np.ndarray, probs: np.ndarray, n_traj: int
) -> np.ndarray:
    """The batch policy-gradient estimate of a tabular softmax policy.

    g[c, :] = (1 / n_traj) sum over steps in context c of A_t (e_{a_t} - pi(. | c)),
    the score function of logits theta[c, a] times the estimated advantage.

    Args:
        context: int64[m] row of the logits table of each step; action: int64[m];
        advantage: float64[m]; probs: float64[n_contexts, n_actions] pi(. | c); n_traj: the
        number of trajectories (the estimate is per trajectory, like the exact gradient).
    """
    rows, g_rows = visited_gradient_estimate(context, action, advantage, probs, n_traj)
    g = np.zeros_like(probs)
    g[rows] = g_rows
    return g


def visited_gradient_estimate(
    context: np.ndarray, action: np.ndarray, advantage: np.ndarray, probs: np.ndarray, n_traj: int
) -> tuple[np.ndarray, np.ndarray]:
    """(rows, g[rows]): :func:`gradient_estimate` on the visited rows (sorted), 0 elsewhere, at
    a cost that does not grow with the table."""
    rows, local = np.unique(context, return_inverse=True)
    g = np.zeros((rows.size, probs.shape[1]))
    np.add.at(g, (local, action), advantage)
    g -= np.bincount(local, weights=advantage, minlength=rows.size)[:, None] * probs[rows]
    g /= n_traj
    return rows, g


def cosine_relerr(g: np.ndarray, t: np.ndarray) -> tuple[float, float]:
    """(cosine, ||g - t|| / ||t||) of two flat vectors; NaN, NaN when either is zero."""
    ng2, nt2 = float(g @ g), float(t @ t)
    if ng2 == 0 or nt2 == 0:
        return float("nan"), float("nan")
    return float(g @ t / np.sqrt(ng2 * nt2)), float(np.linalg.norm(g - t) / np.sqrt(nt2))


def gradient_compare(
    context: np.ndarray,
    action: np.ndarray,
    advantage: np.ndarray,
    probs: np.ndarray,
    n_traj: int,
    g_true: np.ndarray,
) -> tuple[float, float]:
    """(cosine, relative error) of the batch gradient estimate against ``g_true``.

    Same estimate as :func:`gradient_estimate`, computed on the visited rows only (the
    estimate is 0 elsewhere), so a large table costs nothing per call:
    ||g_hat - g||^2 = ||g_hat||^2 - 2 g_hat . g + ||g||^2.
    """
    rows, g = visited_gradient_estimate(context, action, advantage, probs, n_traj)
    inside = rows < g_true.shape[0]
    t = g_true[rows[inside]]
    dot = float((g[inside] * t).sum())
    nh2 = float((g * g).sum())
    nt2 = float((g_true * g_true).sum())
    cos = dot / np.sqrt(nh2 * nt2) if nh2 > 0 and nt2 > 0 else float("nan")
    rel = np.sqrt(max(nh2 - 2 * dot + nt2, 0.0) / nt2) if nt2 > 0 else float("nan")
    return float(cos), float(rel)
