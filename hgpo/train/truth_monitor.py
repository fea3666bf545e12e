"""The exact advantage of every step for the LLM policy itself, on a toy POMDP in score mode.

In ``action_mode="score"`` the policy is a softmax over the listed actions,

    pi(a | x) = softmax_a( log p_theta(response(a) | x) / T ),    l(x, a) = log p_theta(...) / T,

and on a toy environment (:mod:`agentenvs.toytext`) the prompt x is a function of (t, c): the
step count and the K-step context c = (o_{t-K}, a_{t-K}, ..., o_t) of observation and action ids
(the observation text, the task description and the memory all follow from them). So under the
LLM policy z_t = (t, hidden state s_t, c_t) is a finite Markov chain, the same chain
:func:`toyenvs.truth.enumerate_chain` enumerates for a tabular policy. :class:`TruthMonitor`

1. enumerates the chain once per run (it does not depend on the policy), guarded by
   ``truth_max_nodes``;
2. every ``truth_every`` iterations renders the prompt of every distinct (t, c) row of the
   chain, scores every action's response with the current weights in batches (a
   :data:`Scorer`: our engine's ``score``, or verl's actor in
   :mod:`hgpo.integrations.verl_truth`) and takes the softmax at the rollout temperature:
   pi_theta(. | t, c) exactly;
3. solves the chain (:func:`toyenvs.truth.solve_chain`) for V, Q and the occupancy d with the
   true reward r_t - 0.1 * invalid_t and the run's gamma, A*(z, a) = Q(z, a) - V(z), and the exact
   policy gradient in logit space (per row (t, c) and action b; undiscounted: without gamma^t)

       dJ/dl[(t, c), b] = sum_{z at (t, c)} gamma^t d_t(z) pi(b | t, c) A*(z, b);

4. on the iteration's own rollout batch (a :class:`TruthSteps`, whoever played it) runs every
   estimator of ``hgpo.ESTIMATORS`` (the built-in ones, register_estimator's, the entry
   points'; norm "mean", so advantages are in reward units), each on the exact per-step
   inputs it reads (:meth:`TruthMonitor.exact_inputs`): ``values`` the exact V(z_t) (its
   critic; an estimator that reads values runs at gae_lambda = 1), ``entropy`` the exact
   entropy of pi_theta(. | t, c) over the listed actions at the step's row, ``observations``
   the observation text of each step, and logs against A*: bias^2, variance and MSE per (task, z, a) from pairs of independent
   rollout groups (:func:`cross_group_bias_variance`; keys weighted by their exact visit
   probability d(z) pi(a | z); ``coverage`` is the share of steps whose (task, z, a) two groups
   met: it needs at least two groups of a task per batch),
   the plain per-step MSE, sign agreement, and the cosine between the batch gradient
   (1 / n_traj) sum_t A_t (e_{a_t} - pi(. | x_t)) and the exact one, as
   ``truth/<estimator>/<metric>``.

An estimator that raises on a batch: a built-in one, or the one the run trains, stops the run
(its error is a bug or a bad batch, and a wrong figure is worse than none); another user's
estimator (registered or from an installed package) is left out of that batch's figures,
which then hold ``truth/<estimator>/failed = 1`` instead, and its error is logged once per
distinct message: it never vanishes silently, and a plugin the run does not train cannot stop
it.

Free-text mode has no exact truth: its action space is every string (the chain of contexts is
not finite) and pi(action | x) would be a sum over every think text that ends in that action.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
from tqdm import tqdm

from agentenvs.memory import EpisodeMemory
from agentenvs.parser import parse_action
from agentenvs.toytext import ToyText, parse_toy_spec, render, split_tasks, toy_prompt
from hgpo import ESTIMATORS, StepBatch, compute_advantages, estimator_reads
from hgpo.branched_batch import lookback_rows
from hgpo.compare import gradient_compare, sign_agreement
from hgpo.estimator_registry import get_spec
from hgpo.train.episodes import response_text
from hgpo.train.train_config import TrainConfig, TrainConfigError
from toyenvs.policy import decode_context, encode_context
from toyenvs.truth import (
    Chain,
    ChainTooLarge,
    build_node_index,
    enumerate_chain,
    lookup_nodes,
    solve_chain,
)

__all__ = [
    "BiasVariance",
    "LLMTruth",
    "Scorer",
    "StepNodes",
    "TruthMonitor",
    "TruthSteps",
    "check_truth_size",
    "cross_group_bias_variance",
    "truth_chain",
    "truth_prompts",
]

log = logging.getLogger(__name__)

PROMPTS_PER_CALL = 512
"""Prompts scored per scorer call (each with all its actions' responses); the scorer batches
them further (:func:`hgpo.train.batched_score.batched_score`, or verl's micro-batches)."""

Scorer = Callable[[Sequence[Sequence[int]], Sequence[Sequence[int]]], Sequence[float]]
"""(prompt token ids, response token ids) pairs -> each response's summed log-probability at
temperature 1 given its prompt: what the truth needs from a policy (our engines' ``score``;
:mod:`hgpo.integrations.verl_truth` builds one on verl's actor). Consecutive pairs share a
prompt (each prompt with every action's response)."""


class TruthChainSettings(Protocol):
    """The settings :func:`truth_chain` reads (``TrainConfig`` has them)."""

    env: str
    history_length: int
    max_steps: int
    train_tasks: int
    truth_max_nodes: int


def truth_chain(cfg: TruthChainSettings) -> Chain:
    """The reachable chain of ``cfg``'s toy env from its training tasks, with K = history_length.

    Raises:
        TrainConfigError when it exceeds ``truth_max_nodes`` or ``max_steps`` cuts episodes
        before the env's horizon (the chain runs to the horizon).
    """
    env = parse_toy_spec(cfg.env, where="TrainConfig.env").build()
    if cfg.max_steps < env.horizon:
        raise TrainConfigError(
            f"TrainConfig.max_steps={cfg.max_steps} is below the toy env's horizon "
            f"{env.horizon}: --truth-every needs whole episodes (raise --max-steps)"
        )
    tasks = split_tasks(env, "train")
    if cfg.train_tasks:
        tasks = tasks[: cfg.train_tasks]
    try:
        return enumerate_chain(env, cfg.history_length, tasks, cfg.truth_max_nodes)
    except ChainTooLarge as e:
        raise TrainConfigError(
            f"TrainConfig.truth_max_nodes={cfg.truth_max_nodes}: the reachable (t, hidden "
            f"state, context) chain of {cfg.env!r} with history_length={cfg.history_length} is "
            f"larger (already {e.nodes:,} nodes by step {e.t} of its horizon {e.horizon}); "
            "raise --truth-max-nodes, or shrink the env (size, horizon) or K"
        ) from None


def truth_prompts(chain: Chain) -> int:
    """Distinct (t, context) prompts of ``chain``: what one truth pass scores, each prompt
    with every action's response (the policy rows of :class:`TruthMonitor`)."""
    return int(sum(np.unique(c).size for c in chain.codes))


class TruthSizeSettings(TruthChainSettings, Protocol):
    """The settings :func:`check_truth_size` reads, with :func:`truth_chain`'s."""

    truth_every: int
    truth_max_prompts: int


def check_truth_size(cfg: TruthSizeSettings) -> Chain:
    """The chain of ``cfg`` (:func:`truth_chain`), refused when one truth pass would score more
    than ``truth_max_prompts`` prompts; checked before the first iteration.

    Raises:
        TrainConfigError naming the chain's size and the flags to change.
    """
    chain = truth_chain(cfg)
    prompts = truth_prompts(chain)
    if prompts > cfg.truth_max_prompts:
        raise TrainConfigError(
            f"TrainConfig.truth_max_prompts={cfg.truth_max_prompts}: a truth pass of "
            f"{cfg.env!r} with history_length={cfg.history_length} scores {prompts:,} prompts x "
            f"{chain.env.n_actions} actions (a chain of {chain.n_nodes:,} nodes), every "
            f"{cfg.truth_every} iterations; raise --truth-max-prompts, or shrink the env (size, "
            "horizon) or K"
        )
    return chain  # its size is logged once, by TruthMonitor (this check runs twice a run)


@dataclass(frozen=True)
class BiasVariance:
    """Visit-weighted squared bias, variance and MSE of one batch's estimates against A*.

    coverage: share of the batch's steps whose key was met in at least two rollout groups
    (the only keys that enter bias2 and variance; mse is over the same keys).
    """

    bias2: float
    variance: float
    mse: float
    coverage: float


def cross_group_bias_variance(
    key: np.ndarray, group: np.ndarray, err: np.ndarray, weight: np.ndarray | None = None
) -> BiasVariance:
    """Bias/variance decomposition of errors e = A_hat - A* within one batch, per key.

    Estimates of one key in one rollout group are not independent (a group's mean-centred
    advantages sum to zero), and how many of a group's rollouts meet a key changes their mean
    (a group where most rollouts pass a good state has a high baseline); rollout groups are
    independent and identically distributed. So the unit is the group: m_kg is the mean error
    of key k's samples in group g, and over the G_k groups that met key k

        bias2_k = ((sum_g m_kg)^2 - sum_g m_kg^2) / (G_k (G_k - 1)),

    the mean of m_kg m_kh over ordered pairs of different groups, is unbiased for the squared
    mean error of a group's estimate at key k (a single bias2_k can be negative).
    mse_k = mean of e^2 over key k's samples, variance_k = mse_k - bias2_k. The figures average
    keys met in at least two groups with weights ``weight`` (fixed in advance, e.g. the exact
    visit probability; default equal), never with the batch's own counts, which would
    correlate with the errors.

    Args:
        key: int64[n] dense id of each step's (task, z, a); group: int64[n] rollout group;
        err: float64[n] estimate minus A*; weight: float64[n_keys] or None.
    """
    kg = np.stack([key, group], axis=1)
    pairs, inv = np.unique(kg, axis=0, return_inverse=True)
    inv = inv.reshape(-1)
    m_kg = np.bincount(inv, weights=err) / np.bincount(inv)
    k_of = pairs[:, 0]
    m = int(key.max()) + 1 if key.size else 0
    G = np.bincount(k_of, minlength=m).astype(np.float64)
    s1 = np.bincount(k_of, weights=m_kg, minlength=m)
    s2 = np.bincount(k_of, weights=m_kg**2, minlength=m)
    n_k = np.bincount(key, minlength=m)
    mse_k = np.bincount(key, weights=err**2, minlength=m) / np.maximum(n_k, 1)
    ok = G >= 2
    if not ok.any():
        return BiasVariance(float("nan"), float("nan"), float("nan"), 0.0)
    b2_k = (s1[ok] ** 2 - s2[ok]) / (G[ok] * (G[ok] - 1))
    w = np.ones(m) if weight is None else np.asarray(weight, dtype=np.float64)
    w = w[ok] / w[ok].sum()
    bias2, mse = float(w @ b2_k), float(w @ mse_k[ok])
    return BiasVariance(bias2, mse - bias2, mse, float(n_k[ok].sum() / key.size))


@dataclass(frozen=True)
class LLMTruth:
    """Exact figures of one policy on the chain (nodes concatenated over layers).

    row: int64[n_nodes] the policy row (t, c) of each node; probs: float64[n_rows, A]
    pi(. | t, c); V: float64[n_nodes]; Q: float64[n_nodes, A]; d: float64[n_nodes] occupancy;
    J: the exact expected discounted return; grad / grad_undiscounted: float64[n_rows, A].
    """

    row: np.ndarray
    probs: np.ndarray
    V: np.ndarray
    Q: np.ndarray
    d: np.ndarray
    J: float
    grad: np.ndarray
    grad_undiscounted: np.ndarray
    score_seconds: float
    solve_seconds: float

    @property
    def A(self) -> np.ndarray:
        return self.Q - self.V[:, None]


@dataclass(frozen=True)
class StepNodes:
    """Where each step of a rollout batch lies in the chain: node, policy row, action id."""

    node: np.ndarray
    row: np.ndarray
    action: np.ndarray


@dataclass(frozen=True)
class TruthSteps:
    """A batch of score-mode toy steps as the truth reads it, whoever played them.

    batch: the estimators' input (its group, traj, step, reward, state, invalid, parent);
    hidden: int64[n] the toy env's hidden state s_t before each step; action: int64[n] the
    action id each response names (-1: none); observations: the observation text of each step
    (the ``observations`` input). Our trainer's rollout gives one
    (:meth:`TruthMonitor.rollout_steps`), so does a verl batch
    (:mod:`hgpo.integrations.verl_truth`); everything after scoring is shared.
    """

    batch: StepBatch
    hidden: np.ndarray
    action: np.ndarray
    observations: Sequence[str]


class TruthMonitor:
    """The exact truth of the run's LLM policy and every estimator's error against it."""

    def __init__(self, cfg: TrainConfig, tok: Any) -> None:
        t0 = time.perf_counter()
        self.cfg, self.tok = cfg, tok
        self.chain = truth_chain(cfg)
        self.env = self.chain.env
        self.text: ToyText = render(self.env)
        self.K = cfg.history_length
        # policy rows: the distinct (t, context code) pairs; prompts depend on nothing else
        rows = [np.unique(c, return_inverse=True) for c in self.chain.codes]
        offsets = np.cumsum([0] + [u.size for u, _ in rows])
        self.row_t = np.repeat(np.arange(len(rows)), [u.size for u, _ in rows])
        self.row_code = np.concatenate([u for u, _ in rows])
        self.node_row = np.concatenate([inv.reshape(-1) + offsets[t] for t, (_, inv) in
                                        enumerate(rows)])  # fmt: skip
        self.node_t = self.chain.node_t
        P = np.concatenate(self.chain.layer_P)
        self._index = build_node_index(self.node_t, np.concatenate(self.chain.layer_s), P)
        self.enumerate_seconds = time.perf_counter() - t0
        self._nan_logged = False  # the reason for NaN bias2 is logged once a run
        self._failures: set[tuple[str, str]] = set()  # (estimator, error) logged once a run
        log.info(
            "truth: a pass scores %d prompts x %d actions (chain of %d nodes) every %d "
            "iterations; enumerated in %.2fs",
            self.row_code.size, self.env.n_actions, self.chain.n_nodes, cfg.truth_every,
            self.enumerate_seconds,
        )  # fmt: skip

    # -- prompts and the policy table ----------------------------------------------------------
    def prompt(self, t: int, code: int) -> str:
        """The prompt the rollout shows at step ``t`` with K-step context ``code``."""
        env, tt = self.env, self.text
        past_o, past_a, o = decode_context(
            int(code), K=self.K, n_obs=env.n_obs, n_actions=env.n_actions
        )
        real = [(tt.obs_text[po], tt.actions[pa]) for po, pa in zip(past_o, past_a, strict=True)
                if po >= 0]  # fmt: skip
        memory = EpisodeMemory([("", "")] * (t - len(real)) + real)  # older steps are not shown
        return toy_prompt(tt.family, tt.task_of_obs[o], tt.obs_text[o], tt.actions, memory, self.K)

    def prompt_ids(self) -> list[list[int]]:
        """Every row's prompt (t, c) as the rollout encodes it (chat template, cut from the
        left to ``max_prompt_tokens``)."""
        from hgpo.train.model import encode_prompt

        limit = self.cfg.max_prompt_tokens
        return [encode_prompt(self.tok, self.prompt(int(t), int(c)), limit)
                for t, c in zip(self.row_t, self.row_code, strict=True)]  # fmt: skip

    def policy_table(self, scorer: Scorer) -> np.ndarray:
        """float64[n_rows, A] pi(. | t, c) of the current weights: every action's response
        scored by ``scorer`` after every row's prompt, softmax at the rollout temperature.

        The prompts go to the scorer ordered by length, then by tokens (neighbours share long
        prefixes and no padding: what :func:`hgpo.train.batched_score.batched_score` batches),
        ``PROMPTS_PER_CALL`` at a time, under a progress bar (``--progress``)."""
        tok, cfg = self.tok, self.cfg
        resp = [tok(response_text(a), add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
                for a in self.text.actions]  # fmt: skip
        A = len(resp)
        prompts = self.prompt_ids()
        order = sorted(range(len(prompts)), key=lambda i: (len(prompts[i]), prompts[i]))
        logits = np.empty((len(prompts), A))
        with _progress(cfg.progress, len(prompts)) as bar:
            for lo in range(0, len(order), PROMPTS_PER_CALL):
                rows = order[lo : lo + PROMPTS_PER_CALL]
                flat_p = [prompts[i] for i in rows for _ in range(A)]
                scores = scorer(flat_p, resp * len(rows))
                logits[rows] = np.asarray(scores, dtype=np.float64).reshape(-1, A)
                bar.update(len(rows))
        logits /= cfg.temperature
        z = np.exp(logits - logits.max(axis=1, keepdims=True))
        return z / z.sum(axis=1, keepdims=True)

    # -- the exact solution --------------------------------------------------------------------
    def solve(self, probs: np.ndarray, score_seconds: float = 0.0) -> LLMTruth:
        """V, Q, d, J and the exact logit-space gradients of the policy ``probs``."""
        t0 = time.perf_counter()
        sizes = [s.size for s in self.chain.layer_s]
        node_pi = probs[self.node_row]
        pis = np.split(node_pi, np.cumsum(sizes)[:-1])
        sol = solve_chain(self.chain, pis, self.cfg.gamma)
        V, Q, d = np.concatenate(sol.V), np.concatenate(sol.Q), np.concatenate(sol.d)
        term = d[:, None] * node_pi * (Q - V[:, None])  # (n_nodes, A)
        disc = self.cfg.gamma ** self.node_t.astype(np.float64)
        n_rows, A = probs.shape
        g_u, g = np.zeros((n_rows, A)), np.zeros((n_rows, A))
        for b in range(A):
            g_u[:, b] = np.bincount(self.node_row, weights=term[:, b], minlength=n_rows)
            g[:, b] = np.bincount(self.node_row, weights=disc * term[:, b], minlength=n_rows)
        J = float(sol.d[0] @ sol.V[0])
        return LLMTruth(self.node_row, probs, V, Q, d, J, g, g_u, score_seconds,
                        time.perf_counter() - t0)  # fmt: skip

    def policy_truth(self, scorer: Scorer) -> LLMTruth:
        """The exact truth of the policy ``scorer`` scores (e.g. ``engine.score``)."""
        t0 = time.perf_counter()
        probs = self.policy_table(scorer)
        return self.solve(probs, time.perf_counter() - t0)

    # -- the rollout batch in the chain --------------------------------------------------------
    def action_ids(self, response_ids: Sequence[Sequence[int]]) -> np.ndarray:
        """int64[n] the id of the action each response names (our parser), -1 where none."""
        return np.array([
            self.text.action_id(parse_action(self.tok.decode(list(r), skip_special_tokens=True))
                                .action)
            for r in response_ids
        ], dtype=np.int64)  # fmt: skip

    def rollout_steps(self, roll: Any) -> TruthSteps:
        """The :class:`TruthSteps` of our trainer's score-mode rollout ``roll``."""
        return TruthSteps(roll.step_batch(), np.asarray(roll.hidden, dtype=np.int64),
                          self.action_ids(roll.response_ids), list(roll.observation))  # fmt: skip

    def step_nodes(self, steps: TruthSteps) -> StepNodes:
        """Node, row and action of every step of ``steps`` (score-mode toy steps).

        Raises:
            ValueError when a step names no action or is not in the chain (another env, K or
            task set).
        """
        env, K = self.env, self.K
        step, hidden, action = steps.batch.step, steps.hidden, steps.action
        if (action < 0).any():
            raise ValueError("truth: a step's response names no action (score mode lists them all)")
        obs = env.obs_of_state[hidden]
        P = np.empty(step.size, dtype=np.int64)
        for i, past in enumerate(_context_rows(steps.batch, K)):
            code = encode_context(obs[past], action[past], int(obs[i]), K=K, n_obs=env.n_obs,
                                  n_actions=env.n_actions)  # fmt: skip
            P[i] = code // env.n_obs
        node = lookup_nodes(self._index, step, hidden, P)
        if (node < 0).any():
            i = int(np.flatnonzero(node < 0)[0])
            raise ValueError(f"truth: step {i} (t={step[i]}, hidden={hidden[i]}) is not in "
                             "the chain (different env, tasks or K?)")  # fmt: skip
        return StepNodes(node, self.node_row[node], action)

    # -- every estimator against the truth -----------------------------------------------------
    def estimator_metrics(
        self, truth: LLMTruth, steps: TruthSteps, nodes: StepNodes
    ) -> dict[str, float]:
        """``truth/<estimator>/<metric>`` of every registered estimator on ``steps``. The
        batch's ``action`` column is the action id each response names (score mode: the
        listed actions are the canonical ones), which ecpo reads."""
        batch = steps.batch
        if batch.action is None:
            batch = dataclasses.replace(batch, action=nodes.action)
        A_true = truth.Q[nodes.node, nodes.action] - truth.V[nodes.node]
        group = batch.group
        # the key is (task, z, a): an estimator's mean at (z, a) may depend on the group's task
        traj, hidden = batch.traj, steps.hidden
        if batch.branches is not None:  # a branch's task is its root's start state
            task_of_row = hidden[batch.branches.virtual_rows[batch.traj_index, 0]]
        else:
            first = batch.step == 0
            task = np.zeros(int(traj.max()) + 1, dtype=np.int64)
            task[traj[first]] = hidden[first]
            task_of_row = task[traj]
        triple = np.stack([task_of_row, nodes.node, nodes.action], axis=1)
        _, first_of, key = np.unique(triple, axis=0, return_index=True, return_inverse=True)
        key = key.reshape(-1)
        # each key weighs its exact visit probability d(z) pi(a | z) (summed over tasks)
        weight = truth.d[nodes.node[first_of]] * truth.probs[nodes.row[first_of],
                                                             nodes.action[first_of]]  # fmt: skip
        self._explain_nan(key, group, task_of_row)
        n_traj = int(np.unique(traj).size)
        base = self.cfg.estimator_config().replace(norm="mean")
        inputs = self.exact_inputs(truth, steps, nodes)
        out: dict[str, float] = {}
        for name in ESTIMATORS:
            try:
                adv = self._advantages(name, batch, base, inputs)
            except Exception as exc:
                if not self._may_fail(name):
                    raise
                self._log_failure(name, exc)
                out[f"truth/{name}/failed"] = 1.0
                continue
            bv = cross_group_bias_variance(key, group, adv - A_true, weight)
            cos, _ = gradient_compare(nodes.row, nodes.action, adv, truth.probs, n_traj,
                                        truth.grad)  # fmt: skip
            cos_u, _ = gradient_compare(nodes.row, nodes.action, adv, truth.probs, n_traj,
                                          truth.grad_undiscounted)  # fmt: skip
            figures = {
                "bias2": bv.bias2, "variance": bv.variance, "mse": bv.mse,
                "coverage": bv.coverage, "mse_all": float(np.mean((adv - A_true) ** 2)),
                "sign": sign_agreement(adv, A_true), "grad_cos": cos,
                "grad_cos_undiscounted": cos_u,
            }  # fmt: skip
            out.update({f"truth/{name}/{k}": float(v) for k, v in figures.items()})
        return out

    def exact_inputs(self, truth: LLMTruth, steps: TruthSteps, nodes: StepNodes) -> dict[str, Any]:
        """Every per-step input an estimator may read (``hgpo.STEP_INPUTS``), exact:

        - ``values``: V(z_t) of the chain (a perfect critic);
        - ``entropy``: H(pi_theta(. | t, c_t)) = -sum_b pi(b | t, c_t) log pi(b | t, c_t) in
          nats, over the listed actions at the rollout temperature (the policy's own entropy
          at the step's prompt);
        - ``observations``: the observation text of each step (:class:`TruthSteps`).
        """
        p = truth.probs
        row_entropy = -np.sum(p * np.log(np.where(p > 0, p, 1.0)), axis=1)
        return {
            "values": truth.V[nodes.node],
            "entropy": np.maximum(row_entropy, 0.0)[nodes.row],
            "observations": list(steps.observations),
        }

    def _advantages(
        self, name: str, batch: StepBatch, base: Any, inputs: dict[str, Any]
    ) -> np.ndarray:
        """Estimator ``name``'s advantages of ``batch`` on the inputs it reads (an estimator
        that reads state values: gae_lambda = 1, the exact V as its critic)."""
        reads = estimator_reads(name)
        lacking = [k for k in reads if k not in inputs]
        if lacking:
            raise ValueError(f"it reads {', '.join(lacking)}, which the truth cannot supply")
        cfg = base.replace(gae_lambda=1.0) if "values" in reads else base
        return compute_advantages(name, batch, cfg, **{k: inputs[k] for k in reads}).advantages

    def _may_fail(self, name: str) -> bool:
        """A user's estimator the run does not train: its error leaves it out of the batch's
        figures (``truth/<name>/failed``) instead of stopping the run."""
        return name != self.cfg.estimator and not get_spec(name).builtin

    def _log_failure(self, name: str, exc: BaseException) -> None:
        """Log estimator ``name``'s error once per distinct message."""
        msg = f"{type(exc).__name__}: {exc}"
        if (name, msg) in self._failures:
            return
        self._failures.add((name, msg))
        log.error(
            "truth: estimator %r (%s) failed on this batch; its truth/%s/* figures are left "
            "out (truth/%s/failed = 1): %s",
            name, get_spec(name).origin, name, name, msg,
        )  # fmt: skip

    def _explain_nan(self, key: np.ndarray, group: np.ndarray, task: np.ndarray) -> None:
        """Log once why bias2, variance and mse are NaN when no (task, z, a) key of the batch
        was met by two rollout groups (coverage 0)."""
        pairs = np.unique(np.stack([key, group], axis=1), axis=0)
        if (np.bincount(pairs[:, 0]) >= 2).any() or self._nan_logged:
            return
        self._nan_logged = True
        groups = np.unique(np.stack([task, group], axis=1), axis=0)
        n_groups, n_tasks = np.unique(groups[:, 1]).size, np.unique(groups[:, 0]).size
        why = (
            f"each of the batch's {n_groups} rollout groups plays a different task (tasks are "
            "drawn without repeats while --groups-per-iter <= the train tasks): set "
            "--train-tasks below --groups-per-iter (e.g. --train-tasks 1)"
            if n_tasks == n_groups
            else f"its {n_groups} groups of {n_tasks} tasks met no (task, state, action) twice: "
            "raise --group-size or --groups-per-iter"
        )
        log.warning(
            "truth/<est>/bias2, variance and mse are NaN (coverage 0): 0 of %d batch steps have "
            "their (task, state, action) met by two rollout groups, and %s",
            key.size, why,
        )  # fmt: skip

    def measure(self, roll: Any, engine: Any) -> dict[str, float]:
        """The iteration's truth metrics: the exact truth of the weights that played ``roll``
        (call it before the update), the chain's size and times, every estimator's errors.

        ``engine``: its ``score_batched`` (:class:`~hgpo.train.hf_engine.HFEngine`: prompts
        batched, prefixes shared) where it has one, else its ``score``."""
        scorer = getattr(engine, "score_batched", None) or engine.score
        return self.measure_steps(self.rollout_steps(roll), scorer)

    def measure_steps(self, steps: TruthSteps, scorer: Scorer) -> dict[str, float]:
        """:meth:`measure` for any player: ``steps`` and the ``scorer`` of the weights that
        played them (call it before the update)."""
        t0 = time.perf_counter()
        nodes = self.step_nodes(steps)  # a batch outside the chain fails before any scoring
        truth = self.policy_truth(scorer)
        out = {
            "truth/J": truth.J,
            "truth/nodes": float(self.chain.n_nodes),
            "truth/prompts": float(self.row_code.size),
            "truth/time_score": truth.score_seconds,
            "truth/time_solve": truth.solve_seconds,
            "truth/batch_steps_coverage": float(np.unique(nodes.node).size / self.chain.n_nodes),
        }
        out.update(self.estimator_metrics(truth, steps, nodes))
        out["truth/time"] = time.perf_counter() - t0
        return out


def _progress(enabled: bool, total: int) -> Any:
    """A tqdm bar over the truth pass's prompts (a no-op bar when ``enabled`` is false)."""
    return tqdm(total=total, desc="truth", unit="prompt", disable=not enabled, leave=False)


def _context_rows(batch: StepBatch, K: int) -> list[np.ndarray]:
    """Per row, the rows of its last min(K, t) steps, oldest first: the rows before it in its
    trajectory, read across the branch point for a branch (hgpo.branched_batch.lookback_rows)."""
    if batch.branches is None:
        start = batch.traj_start[batch.traj_index]
        return [np.arange(max(int(s), i - K), i) for i, s in enumerate(start)]
    back = lookback_rows(batch, K)  # back[k, i]: the row of s_{t-k}
    return [back[min(K, int(t)) : 0 : -1, i] for i, t in enumerate(batch.step)]
