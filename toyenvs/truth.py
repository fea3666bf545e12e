"""Ground truth: exact values, advantages, occupancy and policy gradient, or Monte Carlo.

Under a fixed context policy, z_t = (s_t, c_t, t) (hidden state, K-step context, time) is a
finite Markov chain: the next context is a function of (c_t, o_t, a_t) and the next observation.
:func:`exact_ground_truth` enumerates the chain reachable from the task distribution, layer by
layer in t, and computes with the true reward r_t - 0.1 * invalid_t and discount gamma

    Q_t(z, a) = sum_{s'} P(s' | s, a) [r(s, a, s') + gamma * [s' not terminal, t+1 < T] V_{t+1}(z')]
    V_t(z)    = sum_a pi(a | c) Q_t(z, a),        A*(z, a) = Q_t(z, a) - V_t(z)
    d_0(z)    = task distribution,  d_{t+1}(z') = sum_{z, a} d_t(z) pi(a | c) P(z' | z, a)
    J         = sum_z d_0(z) V_0(z)
    dJ/dlogits[c, b] = sum_{t, z: c(z) = c} gamma^t d_t(z) pi(b | c) A*(z, b) / temperature

(the last line is the policy-gradient theorem, sum_t gamma^t E[Q grad log pi], with
grad_{l_b} log pi(a | c) = (1[a = b] - pi(b | c)) / temperature). ``policy_gradient_undiscounted``
drops the gamma^t weight: the direction stepwise group estimators follow.

:func:`mc_ground_truth` gives the same quantities by simulation with standard errors, for
chains too large to enumerate.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from hgpo.options import bad, check_int, check_number
from toyenvs import _kernels as kn
from toyenvs._kernels import build_node_index, lookup_nodes  # public here: the node index
from toyenvs.core import POMDP, check_tasks
from toyenvs.policy import TabularPolicy, context_radix
from toyenvs.rollout import Rollouts, _check_common, env_args, rollout_arrays

if TYPE_CHECKING:
    from toyenvs.neural import NeuralPolicy

__all__ = [
    "Chain",
    "ChainSolution",
    "ChainTooLarge",
    "ExactGroundTruth",
    "MCGroundTruth",
    "build_node_index",
    "enumerate_chain",
    "exact_ground_truth",
    "lookup_nodes",
    "mc_ground_truth",
    "solve_chain",
]

log = logging.getLogger(__name__)

DEFAULT_MAX_NODES = 5_000_000  # ~1 KB peak per node: about 5 GB at the limit


class ChainTooLarge(ValueError):
    """The reachable (state, context, t) chain exceeds the exact solver's size limit.

    nodes: the nodes enumerated when it stopped (more than the limit; the whole chain is
    larger still), t: the layer that crossed the limit, horizon: the env's horizon.
    """

    def __init__(self, message: str, nodes: int = 0, t: int = 0, horizon: int = 0) -> None:
        super().__init__(message)
        self.nodes, self.t, self.horizon = nodes, t, horizon


def _check_gamma(gamma: float) -> float:
    return check_number("gamma", gamma, lo=0.0, hi=1.0)


@dataclass(frozen=True, eq=False)
class ExactGroundTruth:
    """Exact V, Q, A*, occupancy and policy gradient of one policy on one task distribution.

    Per-node arrays (one node = one reachable z = (t, hidden state, context)):
        node_t, node_hidden, node_code (full context code), node_context (policy row):
        int64[n_nodes]; V: float64[n_nodes]; Q, A: float64[n_nodes, A];
        occupancy: float64[n_nodes] d_t(z) (sums to the probability of being alive at t per t).
    J: exact expected discounted true return over the task distribution.
    policy_gradient / policy_gradient_undiscounted: float64[n_contexts, A] (rows = policy rows
        as of the computation, every reachable context included).
    parameter_gradient / parameter_gradient_undiscounted: float64[n_parameters], the same
        gradients with respect to the policy's parameters, ``pol.pullback`` of the logit
        gradients (a TabularPolicy's parameters are its logits: the rows flattened; a
        NeuralPolicy's: dJ/dtheta = sum_{c, b} dJ/dl_b(c) dl_b(c)/dtheta by autograd).
    """

    env: POMDP
    K: int
    gamma: float
    tasks: np.ndarray
    node_t: np.ndarray
    node_hidden: np.ndarray
    node_code: np.ndarray
    node_context: np.ndarray
    V: np.ndarray
    Q: np.ndarray
    occupancy: np.ndarray
    J: float
    policy_gradient: np.ndarray
    policy_gradient_undiscounted: np.ndarray
    seconds: float
    parameter_gradient: np.ndarray | None = None
    parameter_gradient_undiscounted: np.ndarray | None = None
    _index: Any = field(default=None, repr=False)

    @property
    def A(self) -> np.ndarray:
        return self.Q - self.V[:, None]

    @property
    def n_nodes(self) -> int:
        return int(self.node_t.shape[0])

    @property
    def nbytes(self) -> int:
        return sum(
            getattr(self, k).nbytes
            for k in ("node_t", "node_hidden", "node_code", "node_context", "V", "Q", "occupancy")
        )

    def node_index(self, rb: Rollouts) -> np.ndarray:
        """int64[n] node of each rollout step's z = (t, s_t, c_t).

        Raises:
            ValueError when a step's z is not in the chain (another env, K or task set).
        """
        _check_rollouts(rb, self.K, "the ground truth")
        if self._index is None:
            P = self.node_code // self.env.n_obs
            object.__setattr__(
                self, "_index", kn.build_node_index(self.node_t, self.node_hidden, P)
            )
        idx = kn.lookup_nodes(self._index, rb.batch.step, rb.hidden, rb.code // self.env.n_obs)
        if (idx < 0).any():
            i = int(np.flatnonzero(idx < 0)[0])
            raise ValueError(
                f"step {i} (t={rb.batch.step[i]}, hidden={rb.hidden[i]}, code={rb.code[i]}) is "
                "not reachable in this ground truth's chain (different env, tasks or K?)"
            )
        return idx

    def value(self, rb: Rollouts) -> np.ndarray:
        """float64[n] V(z_t) of every step."""
        return self.V[self.node_index(rb)]

    def q(self, rb: Rollouts) -> np.ndarray:
        """float64[n] Q(z_t, a_t) of every step."""
        return self.Q[self.node_index(rb), rb.batch.action]

    def advantage(self, rb: Rollouts) -> np.ndarray:
        """float64[n] A*(z_t, a_t) = Q(z_t, a_t) - V(z_t) of every step."""
        idx = self.node_index(rb)
        return self.Q[idx, rb.batch.action] - self.V[idx]

    def occupancy_of(self, rb: Rollouts) -> np.ndarray:
        """float64[n] d_t(z_t): probability that an episode is at z_t at time t."""
        return self.occupancy[self.node_index(rb)]


@dataclass(frozen=True, eq=False)
class Chain:
    """The reachable (t, hidden state, K-step context) chain from a task distribution.

    It does not depend on the policy: every action's successors are enumerated, so one chain
    serves every policy with the same K (the LLM trainer enumerates it once per run).

    Per layer t (n_t nodes): layer_s int64[n_t] hidden states, layer_P int64[n_t] codes of the
    K past (observation, action) pairs, codes int64[n_t] full context codes
    (P * n_obs + o_t), succ int64[n_t, A, B] index of each outcome's node in layer t + 1
    (-1 where the episode ends). d0: float64[n_0] the task distribution over layer 0.
    """

    env: POMDP
    K: int
    tasks: np.ndarray
    d0: np.ndarray
    layer_s: list[np.ndarray]
    layer_P: list[np.ndarray]
    codes: list[np.ndarray]
    succ: list[np.ndarray]

    @property
    def n_nodes(self) -> int:
        return int(sum(s.size for s in self.layer_s))

    @property
    def node_t(self) -> np.ndarray:
        """int64[n_nodes] the time of each node, layers concatenated."""
        return np.repeat(
            np.arange(len(self.layer_s), dtype=np.int64), [s.size for s in self.layer_s]
        )


def _check_rollouts(rb: Any, K: int, whose: str) -> None:
    """``rb`` is a :class:`Rollouts` (what toyenvs.rollout returns, not e.g. its StepBatch)
    of memory ``K``, the K of ``whose``."""
    if not isinstance(rb, Rollouts):
        raise bad(
            "rollouts", "a toyenvs.Rollouts (what toyenvs.rollout returns)", type(rb).__name__
        )
    if rb.K != K:
        raise ValueError(f"rollouts have K={rb.K}, {whose} K={K}")


def enumerate_chain(
    env: POMDP, K: int, tasks: np.ndarray | None = None, max_nodes: int = DEFAULT_MAX_NODES
) -> Chain:
    """Enumerate the chain reachable from ``tasks`` (uniform, duplicates weigh more) layer by
    layer in t, for a context policy of history length ``K``.

    Raises:
        ChainTooLarge (a ValueError) when it holds more than ``max_nodes`` nodes.
    """
    K = check_int("K", K, lo=0)
    max_nodes = check_int("max_nodes", max_nodes, lo=1)
    tasks = check_tasks(env, tasks)
    M, _ = context_radix(env.n_obs, env.n_actions, K)
    powM = np.array([M**k for k in range(K + 1)], dtype=np.int64)
    n_obs = env.n_obs
    uniq, counts = np.unique(tasks, return_counts=True)
    layer_s = [uniq.astype(np.int64)]
    layer_P = [np.full(uniq.size, powM[K] - 1, dtype=np.int64)]
    succ = []
    total = uniq.size
    T = env.horizon
    for t in range(T):
        sc, ns, nP = kn.expand_layer(
            layer_s[t], layer_P[t], t == T - 1, K, n_obs, powM, env.obs_of_state,
            env.next_state, env.next_prob, env.terminal,
        )  # fmt: skip
        succ.append(sc)
        total += ns.size
        if total > max_nodes:
            raise ChainTooLarge(
                f"the reachable chain of {env.name} with K={K} exceeds max_nodes={max_nodes} "
                f"(at t={t + 1} of {T}); use toyenvs.mc_ground_truth",
                nodes=int(total),
                t=t + 1,
                horizon=T,
            )
        if t < T - 1:
            layer_s.append(ns)
            layer_P.append(nP)
    codes = [P * n_obs + env.obs_of_state[s] for s, P in zip(layer_s, layer_P, strict=True)]
    return Chain(env, K, tasks, counts / tasks.size, layer_s, layer_P, codes, succ[: len(layer_s)])


@dataclass(frozen=True, eq=False)
class ChainSolution:
    """V, Q and occupancy d of every node of a :class:`Chain` under one policy (per layer)."""

    V: list[np.ndarray]
    Q: list[np.ndarray]
    d: list[np.ndarray]


def solve_chain(chain: Chain, pis: list[np.ndarray], gamma: float = 0.95) -> ChainSolution:
    """Backward induction for V, Q and forward propagation of d, with ``pis[t]``:
    float64[n_t, A] the policy's action probabilities at each node of layer t (any function of
    the node: of its context, or of (t, context) as an LLM prompt that shows the step count)."""
    env = chain.env
    gamma = _check_gamma(gamma)
    n_layers = len(chain.layer_s)
    if len(pis) != n_layers or any(
        p.shape != (s.size, env.n_actions) for p, s in zip(pis, chain.layer_s, strict=True)
    ):
        raise ValueError("pis must hold one float64[n_t, A] array per layer of the chain")
    Vs: list[np.ndarray] = [np.empty(0)] * n_layers
    Qs: list[np.ndarray] = [np.empty(0)] * n_layers
    V_next = np.zeros(0)
    for t in range(n_layers - 1, -1, -1):
        Qs[t], Vs[t] = kn.backward_layer(
            chain.layer_s[t], chain.succ[t], pis[t], V_next, gamma, env.next_state,
            env.next_prob, env.invalid, env.reward_enter,
        )  # fmt: skip
        V_next = Vs[t]
    ds = [chain.d0]
    for t in range(n_layers - 1):
        ds.append(kn.forward_layer(chain.layer_s[t], ds[t], pis[t], chain.succ[t],
                                   env.next_prob, chain.layer_s[t + 1].size))  # fmt: skip
    return ChainSolution(Vs, Qs, ds)


def exact_ground_truth(
    env: POMDP,
    pol: TabularPolicy | NeuralPolicy,
    gamma: float = 0.95,
    tasks: np.ndarray | None = None,
    max_nodes: int = DEFAULT_MAX_NODES,
) -> ExactGroundTruth:
    """Enumerate the reachable (t, hidden state, context) chain and solve it exactly.

    Args:
        env, pol: the POMDP and the policy (rows for every reachable context are added).
        gamma: discount in [0, 1].
        tasks: start states, uniform over the list (default ``env.tasks``); duplicates weigh more.
        max_nodes: size limit; beyond it :class:`ChainTooLarge` (a ValueError) is raised and
            :func:`mc_ground_truth` is the way.

    Returns:
        :class:`ExactGroundTruth`.
    """
    import time

    start = time.perf_counter()
    gamma = _check_gamma(gamma)
    _check_common(env, pol, 1, 0)
    chain = enumerate_chain(env, pol.K, tasks, max_nodes)
    rows = [pol.index_of(c) for c in chain.codes]
    pis = [pol.probs(r) for r in rows]
    sol = solve_chain(chain, pis, gamma)
    node_t = chain.node_t
    V, Q, d = np.concatenate(sol.V), np.concatenate(sol.Q), np.concatenate(sol.d)
    ctx = np.concatenate(rows)
    pi = np.concatenate(pis)
    A = Q - V[:, None]
    n_ctx, n_act = pol.n_contexts, env.n_actions
    term = d[:, None] * pi * A / pol.temperature  # (n_nodes, A)
    disc = gamma ** node_t.astype(np.float64)
    grad_u = np.zeros((n_ctx, n_act))
    grad_d = np.zeros((n_ctx, n_act))
    for b in range(n_act):
        grad_u[:, b] = np.bincount(ctx, weights=term[:, b], minlength=n_ctx)
        grad_d[:, b] = np.bincount(ctx, weights=disc * term[:, b], minlength=n_ctx)
    J = float(sol.d[0] @ sol.V[0])
    par_d, par_u = pol.pullbacks([grad_d, grad_u])  # one forward pass for both
    seconds = time.perf_counter() - start
    log.debug("exact ground truth: %d nodes in %.2fs", node_t.size, seconds)
    return ExactGroundTruth(
        env=env, K=pol.K, gamma=gamma, tasks=chain.tasks, node_t=node_t,
        node_hidden=np.concatenate(chain.layer_s), node_code=np.concatenate(chain.codes),
        node_context=ctx, V=V, Q=Q, occupancy=d, J=J, policy_gradient=grad_d,
        policy_gradient_undiscounted=grad_u, seconds=seconds,
        parameter_gradient=par_d, parameter_gradient_undiscounted=par_u,
    )  # fmt: skip


@dataclass(eq=False)
class MCGroundTruth:
    """Monte Carlo estimates of the ground truth, each with its standard error.

    J, J_stderr: mean discounted true return over ``n_rollouts`` rollouts per task.
    policy_gradient(_undiscounted)(_stderr): REINFORCE means (unbiased for the exact
        gradients) over the same rollouts, float64[n_contexts, A].
    advantage / q / value (rb): per step, from ``n_rollouts`` continuations of each distinct z
        of the batch per action, with common random numbers across actions; the matching
        ``*_stderr(rb)`` give standard errors. Results are cached per z and depend only on
        (seed, z), not on the batch.
    occupancy_of(rb): visit frequency of each step's z among ``n_rollouts`` rollouts per task.
    """

    env: POMDP
    pol: TabularPolicy | NeuralPolicy
    gamma: float
    tasks: np.ndarray
    n_rollouts: int
    seed: int
    J: float
    J_stderr: float
    policy_gradient: np.ndarray
    policy_gradient_stderr: np.ndarray
    policy_gradient_undiscounted: np.ndarray
    policy_gradient_undiscounted_stderr: np.ndarray
    _cache: dict = field(default_factory=dict, repr=False)
    _visits: Any = field(default=None, repr=False)

    def _stats(self, rb: Rollouts) -> tuple[np.ndarray, ...]:
        _check_rollouts(rb, self.pol.K, "the policy")
        # (the kernel reads the env's tables at these states without bounds checks)
        if rb.hidden.size and (rb.hidden.min() < 0 or rb.hidden.max() >= self.env.n_states):
            raise ValueError(
                f"rollouts hold hidden states outside 0..{self.env.n_states - 1} of this "
                "ground truth's env (rollouts of another env?)"
            )
        n_obs = self.env.n_obs
        P = rb.code // n_obs
        trip = np.stack([rb.batch.step, rb.hidden, P], axis=1)
        uniq, inv = np.unique(trip, axis=0, return_inverse=True)
        inv = inv.reshape(-1)
        todo = [i for i, z in enumerate(map(tuple, uniq)) if z not in self._cache]
        if todo:
            z = uniq[todo]
            zs, zP, zt = (np.ascontiguousarray(z[:, k]) for k in (1, 2, 0))
            n, A = len(todo), self.env.n_actions
            out = [np.empty((n, A)) for _ in range(4)] + [np.empty(n), np.empty(n)]
            zseed = kn.z_seeds(self.seed, zt, zs, zP)

            def call(tables: tuple) -> bool:
                codes = zP * n_obs + self.env.obs_of_state[zs]
                rows, ok = kn.table_insert_many(codes, *tables)
                if not ok:
                    return False
                return kn.mc_state_kernel(
                    zs, zP, zt, rows, zseed, self.n_rollouts, self.gamma, self.env.horizon,
                    self.pol.K, n_obs, self.pol.powM, *env_args(self.env), *tables, *out,
                )  # fmt: skip

            self.pol.run_growing(call)
            q, qse, a, ase, v, vse = out
            for k, zi in enumerate(todo):
                self._cache[tuple(uniq[zi])] = (q[k], qse[k], a[k], ase[k], v[k], vse[k])
        stats = [self._cache[tuple(z)] for z in uniq]
        arrs = [np.array([st[k] for st in stats]) for k in range(6)]
        return tuple(x[inv] for x in arrs)

    def _pick(self, rb: Rollouts, k: int) -> np.ndarray:
        x = self._stats(rb)[k]
        return x[np.arange(rb.n_steps), rb.batch.action] if x.ndim == 2 else x

    def q(self, rb: Rollouts) -> np.ndarray:
        return self._pick(rb, 0)

    def q_stderr(self, rb: Rollouts) -> np.ndarray:
        return self._pick(rb, 1)

    def advantage(self, rb: Rollouts) -> np.ndarray:
        return self._pick(rb, 2)

    def advantage_stderr(self, rb: Rollouts) -> np.ndarray:
        return self._pick(rb, 3)

    def value(self, rb: Rollouts) -> np.ndarray:
        return self._pick(rb, 4)

    def value_stderr(self, rb: Rollouts) -> np.ndarray:
        return self._pick(rb, 5)

    def _visit_table(self) -> tuple[np.ndarray, np.ndarray, int]:
        if self._visits is None:
            r = rollout_arrays(self.env, self.pol, self.tasks, self.n_rollouts, self.seed + 1)
            trip = np.stack([r["step"], r["hidden"], r["context_keys"][self.pol.K]], axis=1)
            uniq, counts = np.unique(trip, axis=0, return_counts=True)
            self._visits = (uniq, counts, self.tasks.size * self.n_rollouts)
        return self._visits

    def occupancy_of(self, rb: Rollouts) -> np.ndarray:
        """float64[n] Monte Carlo estimate of d_t(z_t) (0 where the sample never visited z)."""
        uniq, counts, n = self._visit_table()
        trip = np.stack([rb.batch.step, rb.hidden, rb.code], axis=1)
        allz = np.concatenate([uniq, trip])
        _, inv = np.unique(allz, axis=0, return_inverse=True)
        inv = inv.reshape(-1)
        freq = np.zeros(inv.max() + 1)
        freq[inv[: uniq.shape[0]]] = counts / n
        return freq[inv[uniq.shape[0] :]]

    def occupancy_stderr(self, rb: Rollouts) -> np.ndarray:
        p = self.occupancy_of(rb)
        return np.sqrt(p * (1 - p) / self._visit_table()[2])


def mc_ground_truth(
    env: POMDP,
    pol: TabularPolicy | NeuralPolicy,
    gamma: float = 0.95,
    n_rollouts: int = 1000,
    seed: int = 0,
    tasks: np.ndarray | None = None,
) -> MCGroundTruth:
    """Monte Carlo ground truth with standard errors (see :class:`MCGroundTruth`).

    Args:
        env, pol: the POMDP and the policy (held by reference: later changes to its logits
            change later per-step estimates; copy it first to freeze it).
        gamma: discount in [0, 1].
        n_rollouts: rollouts per task for J and the gradients, continuations per (z, action)
            for the per-step quantities.
        seed: non-negative seed.
        tasks: start states (default ``env.tasks``).
    """
    gamma = _check_gamma(gamma)
    tasks = check_tasks(env, tasks)
    _check_common(env, pol, n_rollouts, seed)
    n_rollouts, seed = int(n_rollouts), int(seed)
    pol.cover(env, tasks)
    n_traj = tasks.size * n_rollouts
    returns = np.empty(n_traj)
    sums: list[np.ndarray] = []

    def call(tables: tuple) -> bool:
        cap = tables[2].shape[0]
        sums[:] = [np.zeros((cap, env.n_actions)) for _ in range(4)]
        return kn.mc_gradient_kernel(
            tasks, n_rollouts, seed, gamma, 1.0 / pol.temperature, env.horizon, pol.K,
            pol.n_obs, pol.powM, *env_args(env), *tables, *sums, returns,
        )  # fmt: skip

    pol.run_growing(call)
    n_ctx = pol.n_contexts
    g_sum, g_sq, u_sum, u_sq = (x[:n_ctx] for x in sums)

    def mean_se(s: np.ndarray, sq: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        m = s / n_traj
        var = np.maximum(sq / n_traj - m * m, 0.0) * n_traj / max(n_traj - 1, 1)
        return m, np.sqrt(var / n_traj)

    g, g_se = mean_se(g_sum, g_sq)
    u, u_se = mean_se(u_sum, u_sq)
    return MCGroundTruth(
        env=env, pol=pol, gamma=gamma, tasks=tasks, n_rollouts=n_rollouts, seed=seed,
        J=float(returns.mean()), J_stderr=float(returns.std(ddof=1) / np.sqrt(n_traj))
        if n_traj > 1 else 0.0,
        policy_gradient=g, policy_gradient_stderr=g_se, policy_gradient_undiscounted=u,
        policy_gradient_undiscounted_stderr=u_se,
    )  # fmt: skip
