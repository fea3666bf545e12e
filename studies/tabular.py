"""Policies at chosen stages of learning, for the bias/variance study.

The untrained (uniform) policy almost never reaches the goal on these POMDPs, so an
outcome-trained policy gets no signal; ``expert_stages`` instead imitates a hidden-state expert
and sets the policy's softness by bisection to hit each success target.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

import toyenvs

__all__ = ["Stage", "evaluate_success", "expert_q", "expert_stages", "neural_expert_stages"]


@dataclass(frozen=True)
class Stage:
    """A policy snapshot and its measured success rate."""

    target: float
    success: float
    iterations: int
    policy: Any
    """A toyenvs.TabularPolicy (expert_stages) or NeuralPolicy (neural_expert_stages)."""


def evaluate_success(
    env: toyenvs.POMDP, pol: Any, n_rollouts: int = 64, seed: int = 10**6
) -> float:
    """Share of successful episodes over every task x ``n_rollouts`` (a fixed seed)."""
    return float(toyenvs.rollout(env, pol, env.tasks, n_rollouts, seed).success.mean())


def expert_q(env: toyenvs.POMDP, gamma: float = 0.95) -> np.ndarray:
    """float64[T, S, A] optimal Q of the fully observed MDP (the hidden state visible)."""
    V = toyenvs.mdp_optimal_values(env, gamma)
    r = env.reward_enter[env.next_state] - toyenvs.INVALID_PENALTY * env.invalid[:, :, None]
    live = ~env.terminal[env.next_state]
    return np.stack(
        [
            (env.next_prob * (r + gamma * live * V[env.next_state, t + 1])).sum(axis=2)
            for t in range(env.horizon)
        ]
    )


def expert_stages(
    env: toyenvs.POMDP,
    K: int,
    targets: tuple[float, ...] = (0.3, 0.7),
    rounds: int = 6,
    n_rollouts: int = 32,
    seed: int = 0,
    gamma: float = 0.95,
) -> list[Stage]:
    """Policies at chosen success rates by imitation of a hidden-state expert (DAgger-style).

    The procedure, used when the untrained policy almost never succeeds (so an outcome-based
    trainer gets no signal):
    1. the expert acts optimally seeing the hidden state (``expert_q``);
    2. for ``rounds`` rounds, roll out the current policy (every task x ``n_rollouts``) and
       count, per context c, how often the expert would take each action: F[c, a];
    3. the policy is softmax(beta * F[c] / sum_a F[c, a]) (uniform on unlabelled contexts);
       beta grows over the rounds (0, 2, 4, ...), then is set by bisection so that the success
       rate (every task x 64 rollouts, fixed seed) meets each target.
    Aliased contexts mix the expert's actions of the hidden states behind them, so the best
    reachable success rate can lie below 1; a target above it gets the best policy found and
    its ``success`` says so.
    """
    Qs = expert_q(env, gamma)
    pol = toyenvs.TabularPolicy(env, K=K)
    counts = np.zeros((0, env.n_actions))

    def set_beta(beta: float) -> None:
        n = pol.n_contexts
        F = np.zeros((n, env.n_actions))
        F[: counts.shape[0]] = counts[:n]
        tot = F.sum(axis=1, keepdims=True)
        pol.logits[:n] = beta * np.divide(F, tot, out=np.zeros_like(F), where=tot > 0)

    rng = np.random.default_rng(seed)
    for r in range(rounds):
        set_beta(2.0 * r)
        rb = toyenvs.rollout(env, pol, env.tasks, n_rollouts, int(rng.integers(2**31)))
        best = Qs[rb.batch.step, rb.hidden].argmax(axis=1)
        if counts.shape[0] < pol.n_contexts:
            counts = np.vstack(
                [counts, np.zeros((pol.n_contexts - counts.shape[0], env.n_actions))]
            )
        np.add.at(counts, (rb.context, best), 1.0)

    return _stages_by_beta(env, pol, set_beta, targets, rounds)


def _stages_by_beta(
    env: toyenvs.POMDP,
    pol: Any,
    set_beta: Callable[[float], None],
    targets: tuple[float, ...],
    rounds: int,
    also_try: tuple[float, ...] = (),
) -> list[Stage]:
    """For each success target, the policy at the beta (bisection on [0, 64], 14 halvings) whose
    success rate first meets it; a target above the success at beta = 64 gets that policy.

    ``also_try``: betas tried too when a target lies above the success at beta = 64; the one
    that succeeds most often (the first of equals) takes 64's place, as the bisection's upper
    end or as the policy of a target still out of reach."""

    def success_at(beta: float) -> float:
        set_beta(beta)
        return evaluate_success(env, pol)

    stages = []
    top_beta, top_succ = 64.0, success_at(64.0)
    best_beta, best_succ = top_beta, top_succ
    if top_succ < max(targets):
        for beta in also_try:
            succ = success_at(beta)
            if succ > best_succ:
                best_beta, best_succ = beta, succ
    for target in sorted(targets):
        hi_beta = top_beta if top_succ >= target else best_beta
        if best_succ < target:
            set_beta(best_beta)
            stages.append(Stage(target, best_succ, rounds, pol.copy()))
            continue
        lo, hi = 0.0, hi_beta
        for _ in range(14):
            mid = 0.5 * (lo + hi)
            if success_at(mid) >= target:
                hi = mid
            else:
                lo = mid
        stages.append(Stage(target, success_at(hi), rounds, pol.copy()))
    return stages


_ALSO_TRY = (1.0, 2.0, 4.0, 8.0, 16.0, 32.0)


def _fit_frequencies(pol: Any, counts: np.ndarray, steps: int, lr: float) -> None:
    """Fit the network's logits to the expert-action frequencies F[c] / sum_a F[c, a].

    Weighted least squares on the row-centred frequencies (the softmax ignores a per-row
    shift), each context weighted by its visits: logits ~= the tabular policy's logits at
    beta = 1, on the labelled contexts; the network fills the unlabelled ones as it generalises.
    """
    import torch

    tot = counts.sum(axis=1)
    rows = np.flatnonzero(tot > 0)
    y = counts[rows] / tot[rows, None]
    y = torch.from_numpy(y - y.mean(axis=1, keepdims=True))
    w = torch.from_numpy(tot[rows] / tot[rows].sum())
    opt = torch.optim.Adam(pol.parameters(), lr=lr)
    for _ in range(steps):
        z = pol.forward_rows(rows)
        loss = (w[:, None] * (z - z.mean(dim=1, keepdim=True) - y) ** 2).sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()


def neural_expert_stages(
    env: toyenvs.POMDP,
    make_policy: Callable[[], Any],
    targets: tuple[float, ...] = (0.3, 0.7),
    rounds: int = 6,
    n_rollouts: int = 32,
    seed: int = 0,
    gamma: float = 0.95,
    fit_steps: int = 150,
    fit_lr: float = 0.02,
) -> list[Stage]:
    """:func:`expert_stages` with a ``toyenvs.NeuralPolicy`` in place of the table.

    The same procedure: the rounds roll out the current policy and count the hidden-state
    expert's actions F[c, a] per context; where the table sets logits = beta * F[c] / sum F[c],
    the network is fitted to F[c] / sum F[c] (:func:`_fit_frequencies`) and beta scales its
    output layer (beta * logits exactly); beta grows over the rounds (0, 2, 4, ...), then
    bisection on beta meets each success target. The policy is a fresh ``make_policy()``.
    Unlike a table's, a network's success need not grow with beta, so a target above the
    success at beta = 64 also tries beta = 1, 2, ..., 32 and takes the best.

    The rounds and the bisection only roll out, so the network is evaluated on the contexts the
    rollouts visit (``evaluate = "visited"``: the same probabilities; at K = 4 the reachable
    contexts can outnumber the visited ones a hundredfold); the stages keep the mode of
    ``make_policy()``.
    """
    import torch

    Qs = expert_q(env, gamma)
    pol = make_policy()
    mode, pol.evaluate = pol.evaluate, "visited"
    pol.cover(env, env.tasks)
    counts = np.zeros((pol.n_contexts, env.n_actions))
    head = pol.net.head
    fitted = (head.weight.detach().clone(), head.bias.detach().clone())

    def set_beta(beta: float) -> None:
        with torch.no_grad():
            head.weight.copy_(beta * fitted[0])
            head.bias.copy_(beta * fitted[1])

    rng = np.random.default_rng(seed)
    for r in range(rounds + 1):
        if r > 0:
            set_beta(1.0)
            _fit_frequencies(pol, counts, fit_steps, fit_lr)
            fitted = (head.weight.detach().clone(), head.bias.detach().clone())
        if r == rounds:
            break
        set_beta(2.0 * r)
        rb = toyenvs.rollout(env, pol, env.tasks, n_rollouts, int(rng.integers(2**31)))
        best = Qs[rb.batch.step, rb.hidden].argmax(axis=1)
        np.add.at(counts, (rb.context, best), 1.0)

    # A table's success grows with beta (its logits sharpen towards the expert's counts); a
    # network's need not (sharper logits also sharpen its guesses on unlabelled contexts), so
    # a target above the success at beta = 64 gets the best of a few smaller betas too.
    stages = _stages_by_beta(env, pol, set_beta, targets, rounds, also_try=_ALSO_TRY)
    for st in stages:
        st.policy.evaluate = mode
    return stages
