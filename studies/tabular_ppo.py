"""PPO on the tabular softmax policy of ``toyenvs``: the paper's training recipe in tabular form.

One :meth:`TabularPPO.update` is one PPO iteration over a batch of rollouts, given each step's
advantage from any estimator of ``hgpo``:

* per-step ratio r = pi(a | c) / pi_old(a | c) against the policy that collected the batch;
* PPO clip (epsilon) with dual clip (c = 3, for negative advantages), the step's advantage
  on its single "token", mean over the steps of a mini-batch (token-mean);
* KL to the reference (the starting policy) as a loss term with the low-variance "k3"
  estimator exp(ref - lp) - (ref - lp) - 1 at the taken action, coefficient ``kl_coef``;
* an entropy bonus ``entropy_coef`` (exact entropy of pi(. | c));
* gradient-norm clip over the whole table, Adam on the logits;
* ``epochs`` passes over ``minibatches`` shuffled mini-batches.

The gradients are analytic (a softmax table needs no autograd): with z = logits / T,
d log pi(a | c) / dz = onehot(a) - pi(. | c), and dH / dz_j = -pi_j (log pi_j + H).

``ValueTable`` is the critic of the PPO-with-critic baseline (``gae``): one value per context
row of the policy (the critic sees what the agent sees), trained by Adam on the squared error
to the lambda-returns.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

import toyenvs

__all__ = ["Adam", "PPOSettings", "TabularPPO", "UpdateStats", "ValueTable"]


@dataclass(frozen=True)
class PPOSettings:
    """Hyperparameters of one tabular PPO update (see the module docstring)."""

    lr: float = 0.05
    """Adam learning rate on the logits."""
    epochs: int = 1
    """PPO epochs per iteration (the paper: 1)."""
    minibatches: int = 4
    """Mini-batches per epoch."""
    clip: float = 0.2
    """PPO clip epsilon."""
    dual_clip: float = 3.0
    """Dual-clip constant c for negative advantages (verl's clip_ratio_c); 0 turns it off."""
    kl_coef: float = 0.01
    """Coefficient of the k3 KL to the reference policy."""
    entropy_coef: float = 0.001
    """Entropy bonus coefficient."""
    grad_clip: float = 1.0
    """Gradient-norm clip over the table (0 turns it off)."""
    critic_lr: float = 0.1
    """Adam learning rate of the value table (gae only)."""


class Adam:
    """Adam (Kingma & Ba 2015) over a table whose row count may grow between steps."""

    def __init__(self, lr: float, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8):
        self.lr, self.b1, self.b2, self.eps = lr, betas[0], betas[1], eps
        self.m = np.zeros((0,))
        self.v = np.zeros((0,))
        self.t = 0

    def _fit(self, shape: tuple[int, ...]) -> None:
        if self.m.shape != shape:
            m, v = np.zeros(shape), np.zeros(shape)
            n = min(self.m.shape[0], shape[0]) if self.m.ndim else 0
            if n:
                m[:n], v[:n] = self.m[:n], self.v[:n]
            self.m, self.v = m, v

    def step(self, param: np.ndarray, grad: np.ndarray) -> None:
        """param -= lr * m_hat / (sqrt(v_hat) + eps), in place."""
        self._fit(param.shape)
        self.t += 1
        self.m *= self.b1
        self.m += (1 - self.b1) * grad
        self.v *= self.b2
        self.v += (1 - self.b2) * grad * grad
        mh = self.m / (1 - self.b1**self.t)
        vh = self.v / (1 - self.b2**self.t)
        param -= self.lr * mh / (np.sqrt(vh) + self.eps)

    def state(self) -> dict[str, np.ndarray]:
        return {"m": self.m, "v": self.v, "t": np.array(self.t)}

    def load(self, state: dict[str, np.ndarray]) -> None:
        self.m, self.v, self.t = state["m"].copy(), state["v"].copy(), int(state["t"])


@dataclass(frozen=True)
class UpdateStats:
    """Figures of one PPO iteration (means over the steps of the last epoch's mini-batches)."""

    pg_loss: float
    kl: float
    clip_frac: float
    entropy: float
    grad_norm: float


def _log_softmax(z: np.ndarray) -> np.ndarray:
    z = z - z.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


class TabularPPO:
    """PPO state for one policy: the reference logits and Adam's moments.

    Args:
        pol: the policy to train (its table is updated in place); init must be "uniform", so
            that rows created later start, like the reference, at zero logits.
        settings: :class:`PPOSettings`.
    """

    def __init__(self, pol: toyenvs.TabularPolicy, settings: PPOSettings) -> None:
        if pol.init != "uniform":
            raise ValueError(f"pol.init must be 'uniform' for tabular PPO, got {pol.init!r}")
        self.pol, self.s = pol, settings
        self.ref_logits = pol.logits.copy()  # rows added later start at 0, as the reference
        self.adam = Adam(settings.lr)

    def _ref(self, rows: np.ndarray) -> np.ndarray:
        out = np.zeros((rows.size, self.pol.n_actions))
        known = rows < self.ref_logits.shape[0]
        out[known] = self.ref_logits[rows[known]]
        return out

    def old_log_probs(self, context: np.ndarray, action: np.ndarray) -> np.ndarray:
        """float64[n] log pi(a_t | c_t) under the current table (call before updating)."""
        lp = self.pol.log_probs(context)
        return lp[np.arange(context.size), action]

    def loss_and_grad(
        self, rows: np.ndarray, act: np.ndarray, adv: np.ndarray, old_lp: np.ndarray
    ) -> tuple[float, np.ndarray, dict[str, float]]:
        """The mini-batch loss, its gradient float64[n_contexts, A] on the logits, and figures.

        loss = mean_i [pg_i + kl_coef * k3_i] - entropy_coef * mean_i H_i, with
        pg_i = max(-A r, -A clip(r)) (and at most -A * dual_clip when A < 0).
        """
        s, pol = self.s, self.pol
        B, T = rows.size, pol.temperature
        idx = np.arange(B)
        logp = _log_softmax(pol.logits_of(rows) / T)  # (B, A)
        p = np.exp(logp)
        lp = logp[idx, act]
        ratio = np.exp(lp - old_lp)
        pg1 = -adv * ratio
        pg2 = -adv * np.clip(ratio, 1 - s.clip, 1 + s.clip)
        pg = np.maximum(pg1, pg2)
        active = pg1 >= pg2  # the unclipped branch is the one in force
        if s.dual_clip > 0:
            dual = (adv < 0) & (pg > -adv * s.dual_clip)
            pg = np.where(dual, -adv * s.dual_clip, pg)
            active &= ~dual
        d = _log_softmax(self._ref(rows) / T)[idx, act] - lp
        kl = np.exp(d) - d - 1.0
        H = -(p * logp).sum(axis=1)
        loss = float(pg.mean() + s.kl_coef * kl.mean() - s.entropy_coef * H.mean())
        # dloss/dlp of each step, then through the softmax: dlp/dz = onehot - p, z = logits / T
        c = (np.where(active, -adv * ratio, 0.0) + s.kl_coef * (1.0 - np.exp(d))) / B
        dz = -c[:, None] * p + (s.entropy_coef / B) * p * (logp + H[:, None])
        dz[idx, act] += c
        grad = np.zeros_like(pol.logits)
        np.add.at(grad, rows, dz / T)
        # clip fraction: the share of steps whose gradient a clip cut (either clip)
        figs = {"pg_loss": float(pg.mean()), "kl": float(kl.mean()),
                "clip_frac": float((~active).mean()), "entropy": float(H.mean())}  # fmt: skip
        return loss, grad, figs

    def update(
        self,
        context: np.ndarray,
        action: np.ndarray,
        advantages: np.ndarray,
        old_lp: np.ndarray,
        rng: np.random.Generator,
    ) -> UpdateStats:
        """One PPO iteration over the steps (context rows, actions, advantages, old log-probs)."""
        s = self.s
        n = context.size
        stats = []
        for _ in range(s.epochs):
            for mb in np.array_split(rng.permutation(n), max(1, min(s.minibatches, n))):
                loss, grad, f = self.loss_and_grad(
                    context[mb], action[mb], advantages[mb], old_lp[mb]
                )
                gn = float(np.sqrt((grad * grad).sum()))
                check_finite_update(loss, gn)
                if s.grad_clip > 0 and gn > s.grad_clip:
                    grad *= s.grad_clip / gn
                self.adam.step(self.pol.logits, grad)
                stats.append((mb.size, f["pg_loss"], f["kl"], f["clip_frac"], f["entropy"], gn))
        w = np.array([x[0] for x in stats], dtype=np.float64)
        cols = np.array([x[1:] for x in stats])
        m = (w[:, None] * cols).sum(axis=0) / w.sum()
        return UpdateStats(*(float(v) for v in m))


def check_finite_update(loss: float, grad_norm: float) -> None:
    """FloatingPointError when a mini-batch's PPO loss or gradient norm is NaN or infinite:
    the run stops before that update (the policy is left as it was), and a study saves
    nothing of it."""
    if not (np.isfinite(loss) and np.isfinite(grad_norm)):
        raise FloatingPointError(
            f"the PPO loss ({loss}) or its gradient norm ({grad_norm}) is not finite: the run "
            "stops before the update (lower --lr)"
        )


class ValueTable:
    """V(c) per context row of ``pol`` (zeros for new rows), trained by Adam on squared error."""

    def __init__(self, pol: toyenvs.TabularPolicy, lr: float) -> None:
        self.pol = pol
        self.V = np.zeros(0)
        self.adam = Adam(lr)

    def _fit(self) -> None:
        n = self.pol.n_contexts
        if self.V.size < n:
            self.V = np.concatenate([self.V, np.zeros(n - self.V.size)])

    def values(self, context: np.ndarray) -> np.ndarray:
        """float64[n] V of context rows."""
        self._fit()
        return self.V[context]

    def update(
        self, context: np.ndarray, targets: np.ndarray, minibatches: int, epochs: int,
        rng: np.random.Generator,
    ) -> float:  # fmt: skip
        """Adam steps on mean (V(c) - target)^2; returns the last epoch's mean squared error."""
        self._fit()
        losses = []
        for _ in range(epochs):
            for mb in np.array_split(rng.permutation(context.size), max(1, minibatches)):
                err = self.V[context[mb]] - targets[mb]
                grad = np.zeros_like(self.V)
                np.add.at(grad, context[mb], 2.0 * err / mb.size)
                losses.append(float((err * err).mean()))
                if not np.isfinite(losses[-1]):
                    raise FloatingPointError(
                        f"the critic's loss is not finite ({losses[-1]}): the run stops before "
                        "the update (lower --critic-lr)"
                    )
                self.adam.step(self.V, grad)
        return float(np.mean(losses[-max(1, minibatches) :]))
