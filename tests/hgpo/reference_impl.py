"""Slow, obviously-correct estimators written straight from the paper's equations.

Loops over steps and dicts of tuples; group statistics in exact rational arithmetic
(fractions.Fraction), so the only rounding is the final float conversion. The fast numpy
estimators in hgpo/ must equal these to 1e-12.
"""

from __future__ import annotations

import itertools
import math
from collections import defaultdict
from difflib import SequenceMatcher
from fractions import Fraction

import numpy as np

from hgpo import EstimatorConfig, StepBatch


def _trajectories(b: StepBatch) -> list[list[int]]:
    trajs: dict[int, list[int]] = {}
    for row in range(b.n_steps):
        trajs.setdefault(int(b.traj[row]), []).append(row)
    return list(trajs.values())


def _virtual(b: StepBatch) -> dict[int, list[int]]:
    """traj id -> the rows of its virtual full trajectory, step 0 first: a branch (parent p,
    first own step t0) is p's virtual rows at steps 0..t0-1 followed by its own rows."""
    virtual: dict[int, list[int]] = {}
    for rows in _trajectories(b):
        tid = int(b.traj[rows[0]])
        parent = -1 if b.parent is None else int(b.parent[rows[0]])
        prefix = [] if parent < 0 else virtual[parent][: int(b.step[rows[0]])]
        virtual[tid] = prefix + rows
    return virtual


def _rewards(b: StepBatch, cfg: EstimatorConfig, with_penalty: bool) -> list[float]:
    out = []
    for row in range(b.n_steps):
        r = float(b.reward[row])
        if with_penalty and b.invalid is not None and b.invalid[row]:
            r = r - cfg.invalid_penalty
        out.append(r)
    return out


def _total(values: list[float]) -> float:
    """Sum from the last element back: R_0 at gamma = 1, the library's definition."""
    total = values[-1]
    for v in reversed(values[:-1]):
        total = v + total
    return total


def ref_returns(b: StepBatch, cfg: EstimatorConfig) -> list[float]:
    propagate = cfg.penalty_mode == "return"
    r = _rewards(b, cfg, with_penalty=propagate)
    R = [0.0] * b.n_steps
    for rows in _trajectories(b):
        running = None
        for row in reversed(rows):
            running = r[row] if running is None else r[row] + cfg.gamma * running
            R[row] = running
    if not propagate and b.invalid is not None:
        R = [R[i] - cfg.invalid_penalty * bool(b.invalid[i]) for i in range(b.n_steps)]
    return R


def ref_normalise(
    values: list[float],
    norm: str,
    std: str,
    eps: float,
    singleton: str = "zero",
    leave_one_out: bool = False,
) -> list[float]:
    """(x - mean) / (std + eps) or x - mean for one group; singleton/tied -> 0.

    leave_one_out: the baseline of x_i is the mean of the other members, straight from the
    definition: x_i - (sum_j x_j - x_i) / (n - 1); the std stays the whole group's.
    """
    n = len(values)
    if n == 1:
        if singleton == "raw":
            return [values[0] if norm == "mean" else values[0] / (1.0 + eps)]
        return [0.0]
    if all(v == values[0] for v in values):
        return [0.0] * n
    fr = [Fraction(v) for v in values]
    mean = sum(fr) / n
    devs = [f - mean for f in fr]
    denom = n if std == "population" else n - 1
    sd = math.sqrt(float(sum(d * d for d in devs) / denom))
    if leave_one_out:
        devs = [f - (sum(fr) - f) / (n - 1) for f in fr]
    if norm == "mean":
        return [float(d) for d in devs]
    return [float(d) / (sd + eps) for d in devs]


def _group_informative(keys: list, x: list[float], singleton: str = "zero") -> list[bool]:
    """A row's group gives an estimate: >= 2 members not all equal (or a raw singleton)."""
    members: dict = defaultdict(list)
    for i, k in enumerate(keys):
        if k is not None:
            members[k].append(i)
    out = [False] * len(x)
    for rows in members.values():
        vals = [x[i] for i in rows]
        ok = (len(rows) == 1 and singleton == "raw") or (len(rows) > 1 and len(set(vals)) > 1)
        for i in rows:
            out[i] = ok
    return out


def _group_norm(
    keys: list,
    x: list[float],
    norm: str,
    std: str,
    eps: float,
    singleton: str = "zero",
    leave_one_out: bool = False,
) -> list[float]:
    members: dict = defaultdict(list)
    for i, k in enumerate(keys):
        if k is not None:
            members[k].append(i)
    out = [0.0] * len(x)
    for rows in members.values():
        for i, v in zip(
            rows,
            ref_normalise([x[i] for i in rows], norm, std, eps, singleton, leave_one_out),
            strict=False,
        ):
            out[i] = v
    return out


def ref_context(b: StepBatch, row: int, k: int, cfg: EstimatorConfig):
    """C_k(s_t) of Eq. (3) as a tuple (with the rollout group), None if left out."""
    t = int(b.step[row])
    if t < k and cfg.early == "drop":
        return None
    history = _virtual(b)[int(b.traj[row])]
    seq: list = []
    for j in history[t - min(t, k) : t + 1]:
        seq.append(("s", int(b.state[j])))
        if cfg.include_actions and j != row:
            seq.append(("a", int(b.action[j])))
    return (int(b.group[row]), tuple(seq))


def ref_levels(b: StepBatch, cfg: EstimatorConfig, K: int):
    R = ref_returns(b, cfg)
    keys = [[ref_context(b, row, k, cfg) for row in range(b.n_steps)] for k in range(K + 1)]
    A = [
        _group_norm(keys[k], R, cfg.norm, cfg.std, cfg.eps, leave_one_out=cfg.leave_one_out)
        for k in range(K + 1)
    ]
    sizes = []
    for k in range(K + 1):
        count: dict = defaultdict(int)
        for key in keys[k]:
            count[key] += 1
        sizes.append([count[key] if key is not None else 0 for key in keys[k]])
    return A, keys, sizes


def _episode_units(b: StepBatch, cfg: EstimatorConfig) -> tuple[list[list[int]], list[float]]:
    """Members of the episode-level groups (lists of rows) and their scores."""
    propagate = cfg.penalty_mode == "return"
    r = _rewards(b, cfg, with_penalty=propagate)
    trajs = _trajectories(b)
    virtual = _virtual(b)
    totals = [_total([r[j] for j in virtual[int(b.traj[rows[0]])]]) for rows in trajs]
    if cfg.episode_pooling == "steps":
        units = [[i] for rows in trajs for i in rows]  # every step row is a unit
        scores = []
        for rows, total in zip(trajs, totals, strict=True):
            for i in rows:
                s = total
                if not propagate and b.invalid is not None and b.invalid[i]:
                    s -= cfg.invalid_penalty
                scores.append(s)
        return units, scores
    return trajs, totals


def ref_episode(b: StepBatch, cfg: EstimatorConfig) -> tuple[list[float], list[bool]]:
    """Episode advantage of every step and whether its group gives an estimate."""
    units, scores = _episode_units(b, cfg)
    out, informative = [0.0] * b.n_steps, [False] * b.n_steps
    keys = [int(b.group[u[0]]) for u in units]
    vals = _group_norm(keys, scores, cfg.norm, cfg.episode_std, cfg.eps, cfg.episode_singleton)
    info = _group_informative(keys, scores, cfg.episode_singleton)
    for u, v, ok in zip(units, vals, info, strict=True):
        for i in u:
            out[i], informative[i] = v, ok
    return out, informative


def ref_3spo_counts(b: StepBatch, cfg: EstimatorConfig) -> tuple[dict, dict]:
    """3SPO's counts from the definition: {(scope, state): [N, W]} over every trajectory of
    the batch (each counts the states of its virtual full trajectory once; W those whose
    last reward is > 0) and {scope: t = 1 + its trajectories}; scope None or the group."""
    counts: dict = defaultdict(lambda: [0, 0])
    t: dict = defaultdict(lambda: 1)
    virtual = _virtual(b)
    for rows in _trajectories(b):
        scope = None if cfg.spo3_count_scope == "batch" else int(b.group[rows[0]])
        t[scope] += 1
        won = float(b.reward[rows[-1]]) > 0.0
        for state in {int(b.state[j]) for j in virtual[int(b.traj[rows[0]])]}:
            counts[scope, state][0] += 1
            counts[scope, state][1] += won
    return counts, t


def ref_3spo_score(N: int, W: int, t: int, cfg: EstimatorConfig) -> float:
    """Eq. 1 of 3SPO, as the authors' StateScoreManager.get_score computes it."""
    if N == 0:
        return 1.0
    rate = W / (N + cfg.spo3_eps)
    lam = cfg.spo3_alpha * np.log(t)
    n_fail = N - W
    if not (n_fail < cfg.spo3_xi or rate > cfg.spo3_zeta):
        return 0.0
    return float(np.exp(-lam * rate))


def ref_3spo_rewards(b: StepBatch, cfg: EstimatorConfig) -> list[float]:
    """Eq. 2 of 3SPO for every step, one step at a time; after a trajectory's last step the
    next observation is next_state (scored from its counts, spo3_terminal_score if it has
    none), or without that column a never-counted one (R_novel 1, S = spo3_terminal_score)."""
    counts, t = ref_3spo_counts(b, cfg)
    out = [0.0] * b.n_steps
    for rows in _trajectories(b):
        scope = None if cfg.spo3_count_scope == "batch" else int(b.group[rows[0]])
        for i, row in enumerate(rows):
            N, W = counts[scope, int(b.state[row])]
            s_t = ref_3spo_score(N, W, t[scope], cfg)
            if i + 1 < len(rows):
                nxt = rows[i + 1]
                s_next = ref_3spo_score(*counts[scope, int(b.state[nxt])], t[scope], cfg)
                novel = 1.0 if int(b.state[nxt]) != int(b.state[row]) else 0.0
            elif b.next_state is None:
                s_next, novel = cfg.spo3_terminal_score, 1.0
            else:
                after = int(b.next_state[row])
                N1, W1 = counts.get((scope, after), (0, 0))
                s_next = ref_3spo_score(N1, W1, t[scope], cfg) if N1 else cfg.spo3_terminal_score
                novel = 1.0 if after != int(b.state[row]) else 0.0
            w = 0.5 * float(np.exp(-cfg.spo3_omega_k * N))
            out[row] = w * novel + (0.5 - w) * (s_t - s_next) + 0.5 * float(b.reward[row])
    return out


def ref_3spo(b: StepBatch, cfg: EstimatorConfig) -> list[float]:
    """3SPO's advantage: the shaped reward (less the invalid penalty, or its discounted
    return) normalised within the steps of the same group and state."""
    R = ref_3spo_rewards(b, cfg)
    pen = [cfg.invalid_penalty if b.invalid is not None and b.invalid[i] else 0.0
           for i in range(b.n_steps)]  # fmt: skip
    if cfg.spo3_target == "reward":
        target = [r - p if p else r for r, p in zip(R, pen, strict=True)]
    else:
        propagate = cfg.penalty_mode == "return"
        r = [x - p if (p and propagate) else x for x, p in zip(R, pen, strict=True)]
        target = [0.0] * b.n_steps
        for rows in _trajectories(b):
            running = None
            for row in reversed(rows):
                running = r[row] if running is None else r[row] + cfg.gamma * running
                target[row] = running
        if not propagate:
            target = [x - p if p else x for x, p in zip(target, pen, strict=True)]
    keys = [(int(b.group[i]), int(b.state[i])) for i in range(b.n_steps)]
    return _group_norm(keys, target, cfg.norm, cfg.std, cfg.eps,
                       leave_one_out=cfg.leave_one_out)  # fmt: skip


def ref_graph_distances(b: StepBatch, cfg: EstimatorConfig) -> tuple[list[int], list[int]]:
    """GraphGPO's d(s_t) and d(s'_t) per row, by hand: one dict graph per rollout group, edges
    state -> next state (the next row's, the goal after a successful episode, else the
    terminal next_state or, without it, a dead end of the row's own), breadth-first search
    from the goal over the reversed edges, unreachable -> the group's largest distance + 1."""
    goal = ("goal",)
    virtual = _virtual(b)
    edges: dict = defaultdict(set)
    nxt: dict = {}
    for rows in _trajectories(b):
        tid = int(b.traj[rows[0]])
        success = _total([float(b.reward[j]) for j in virtual[tid]]) > cfg.graph_success_return
        g = int(b.group[rows[0]])
        for k, row in enumerate(rows):
            if k + 1 < len(rows):
                v = ("s", int(b.state[rows[k + 1]]))
            elif success:
                v = goal
            elif b.next_state is not None:
                v = ("s", int(b.next_state[row]))
            else:
                v = ("dead end", row)
            nxt[row] = v
            edges[g].add((("s", int(b.state[row])), v))
    dist: dict = {}
    for g, es in edges.items():
        reverse: dict = defaultdict(list)
        for u, v in es:
            reverse[v].append(u)
        d = {goal: 0}
        frontier = [goal]
        while frontier:
            new = []
            for v in frontier:
                for u in reverse[v]:
                    if u not in d:
                        d[u] = d[v] + 1
                        new.append(u)
            frontier = new
        far = max(d.values())
        for u, v in es:
            dist[g, u] = d.get(u, far + 1)
            dist[g, v] = d.get(v, far + 1)
    d_state = [dist[int(b.group[i]), ("s", int(b.state[i]))] for i in range(b.n_steps)]
    d_next = [dist[int(b.group[i]), nxt[i]] for i in range(b.n_steps)]
    return d_state, d_next


def ref_graphgpo(b: StepBatch, cfg: EstimatorConfig) -> tuple[list[float], list[float]]:
    """GraphGPO's (returns, advantages): R_t = 10 gamma^d(s'_t) (or ^(d(s'_t) - d(s_t) + 1))
    less the penalty, normalised among the group's steps from the same state, plus the
    weighted episode advantage."""
    d_state, d_next = ref_graph_distances(b, cfg)
    R = []
    for i in range(b.n_steps):
        e = d_next[i] - d_state[i] + 1 if cfg.graph_normalize_distance else d_next[i]
        r = 10.0 * cfg.graph_gamma**e
        if b.invalid is not None and b.invalid[i]:
            r -= cfg.invalid_penalty
        R.append(r)
    keys = [(int(b.group[i]), int(b.state[i])) for i in range(b.n_steps)]
    step = _group_norm(keys, R, cfg.norm, cfg.std, cfg.eps, leave_one_out=cfg.leave_one_out)
    ep = ref_episode(b, cfg)[0]
    w_s, w_e = cfg.graph_step_weight, cfg.graph_episode_weight
    return R, [w_s * a + w_e * e for a, e in zip(step, ep, strict=True)]


def ref_empg(b: StepBatch, cfg: EstimatorConfig, entropy: list[float]) -> list[float]:
    """EMPG from arXiv 2509.09265 Eq. 8 / S21-S23, step by step: min-max normalised entropy,
    g = exp(-k H~) / (mean exp(-k H~) + eps), bonus zeta exp(-k' H~) of the next step of the
    same trajectory, then the batch mean subtracted."""
    n = b.n_steps
    H = [float(h) for h in entropy]
    lo, hi = min(H), max(H)
    den = (hi - lo) + cfg.empg_eps
    Hn = [(h - lo) / den if den > 0 else 0.0 for h in H]
    e = [math.exp(-cfg.empg_k * h) for h in Hn]
    mean_e = math.fsum(e) / n
    g = [x / (mean_e + cfg.empg_eps) for x in e]
    f = [math.exp(-cfg.empg_k_future * h) for h in Hn]
    bonus = [0.0] * n
    for rows in _trajectories(b):
        for here, nxt in itertools.pairwise(rows):
            bonus[here] = cfg.empg_zeta * f[nxt]
    A_ep = ref_episode(b, cfg)[0]
    A = [g[i] * A_ep[i] + bonus[i] for i in range(n)]
    if cfg.empg_final_norm == "mean":
        mean = math.fsum(A) / n
        A = [a - mean for a in A]
    return A


def ref_similarity_clusters(b: StepBatch, observations: list[str], thresh: float) -> list:
    """verl-agent's build_step_group(enable_similarity=True) as written: per rollout group, each
    row in batch order joins the first cluster whose representative (first member) r has
    SequenceMatcher(None, obs, r).ratio() >= thresh, else starts one. Returns (group, cluster)."""
    reps: dict[int, list[str]] = defaultdict(list)
    out = []
    for row in range(b.n_steps):
        g, x = int(b.group[row]), observations[row]
        for j, r in enumerate(reps[g]):
            if SequenceMatcher(None, x, r).ratio() >= thresh:
                out.append((g, j))
                break
        else:
            out.append((g, len(reps[g])))
            reps[g].append(x)
    return out


def ref_dynamic_keep(b: StepBatch) -> list[bool]:
    """verl-agent's filter_group_data: a rollout group stays unless all its episode rewards
    (env rewards summed over the virtual trajectory, no penalty) are equal."""
    virtual = _virtual(b)
    totals: dict[int, list[float]] = defaultdict(list)
    for rows in _trajectories(b):
        tid = int(b.traj[rows[0]])
        totals[int(b.group[rows[0]])].append(_total([float(b.reward[j]) for j in virtual[tid]]))
    return [len(set(totals[int(b.group[row])])) > 1 for row in range(b.n_steps)]


def ref_ecpo_terms(b: StepBatch, cfg: EstimatorConfig) -> tuple[list[float], list[float]]:
    """ECPO's (A_act, rho) of every step, straight from the definitions (hgpo/ecpo.py), one
    anchor (group, state) at a time, every mean and variance in exact rational arithmetic:

        mu~_{s,u} = (n_{s,u} Gbar_{s,u} + kappa mu_s) / (n_{s,u} + kappa)
        A_act     = (mu~_{s,u} - mu_s) [/ (sigma_s + eps)]
        rho(s)    = tanh(n_s / tau) B_s / (B_s + W_s + eps_g)   (0 for equal returns / 0 / 0)
    """
    R = ref_returns(b, cfg)
    anchors: dict = defaultdict(list)
    for row in range(b.n_steps):
        anchors[int(b.group[row]), int(b.state[row])].append(row)
    A_act, rho = [0.0] * b.n_steps, [0.0] * b.n_steps
    kappa = Fraction(cfg.ecpo_kappa)
    for rows in anchors.values():
        G = {i: Fraction(R[i]) for i in rows}
        n = len(rows)
        mu = sum(G.values()) / n
        by_action: dict = defaultdict(list)
        for i in rows:
            by_action[int(b.action[i])].append(i)
        gbar = {u: sum(G[i] for i in m) / len(m) for u, m in by_action.items()}
        B = sum(len(m) * (gbar[u] - mu) ** 2 for u, m in by_action.items()) / n
        W = sum((G[i] - gbar[u]) ** 2 for u, m in by_action.items() for i in m) / n
        ddof = 0 if cfg.std == "population" else 1
        sd = math.sqrt(float(sum((g - mu) ** 2 for g in G.values()) / max(n - ddof, 1)))
        tied = len(set(G.values())) == 1
        den = B + W + Fraction(cfg.ecpo_gate_eps)
        share = 0.0 if tied or den == 0 else float(B / den)
        gate = 1.0 if cfg.ecpo_gate == "none" else math.tanh(n / cfg.ecpo_tau) * share
        for u, m in by_action.items():
            shrunk = (len(m) * gbar[u] + kappa * mu) / (len(m) + kappa) - mu
            if tied:
                a = 0.0
            elif cfg.norm == "mean":
                a = float(shrunk)
            else:
                a = float(shrunk) / (sd + cfg.eps)
            for i in m:
                A_act[i], rho[i] = a, gate
    return A_act, rho


def ref_ecpo(b: StepBatch, cfg: EstimatorConfig) -> list[float]:
    """ECPO: A = A^GRPO + omega rho(s) A_act(s, u) (:func:`ref_ecpo_terms`)."""
    A_act, rho = ref_ecpo_terms(b, cfg)
    ep = ref_episode(b, cfg)[0]
    return [e + cfg.ecpo_omega * r * a for e, r, a in zip(ep, rho, A_act, strict=True)]


def ref_estimate(
    name: str,
    b: StepBatch,
    cfg: EstimatorConfig,
    entropy: list[float] | None = None,
    observations: list[str] | None = None,
) -> list[float]:
    if name == "3spo":
        return ref_3spo(b, cfg)
    if name == "ecpo":
        return ref_ecpo(b, cfg)
    if name == "graphgpo":
        return ref_graphgpo(b, cfg)[1]
    if name == "empg":
        return ref_empg(b, cfg, entropy)
    if name == "gigpo_similarity":
        keys = ref_similarity_clusters(b, observations, cfg.gigpo_similarity_thresh)
        R = ref_returns(b, cfg)
        step = _group_norm(keys, R, cfg.norm, cfg.std, cfg.eps, leave_one_out=cfg.leave_one_out)
        ep = ref_episode(b, cfg)[0]
        return [e + cfg.omega * a for e, a in zip(ep, step, strict=True)]
    if name == "gigpo_dynamic":
        keep = ref_dynamic_keep(b)
        A = ref_estimate("gigpo", b, cfg)
        n_kept = sum(keep)
        scale = b.n_steps / n_kept if cfg.gigpo_dynamic_rescale and n_kept else 1.0
        return [a * scale if k else 0.0 for a, k in zip(A, keep, strict=True)]
    if name == "grpo":
        return ref_episode(b, cfg)[0]
    if name == "rloo":
        units, scores = _episode_units(b, cfg)
        by_group: dict = defaultdict(list)
        for u, sc in zip(units, scores, strict=True):
            by_group[int(b.group[u[0]])].append((u, sc))
        out = [0.0] * b.n_steps
        for members in by_group.values():
            E = [sc for _, sc in members]
            n = len(E)
            if n == 1:
                if cfg.episode_singleton == "raw":
                    raw = E[0] if cfg.norm == "mean" else E[0] / (1.0 + cfg.eps)
                    for i in members[0][0]:
                        out[i] = raw
                continue
            if cfg.norm == "mean_std":
                scale = ref_normalise(E, "mean_std", cfg.episode_std, cfg.eps)
                adv = [s * n / (n - 1) for s in scale]
            else:
                adv = [
                    float(
                        Fraction(E[i]) - sum(Fraction(E[j]) for j in range(n) if j != i) / (n - 1)
                    )
                    if len(set(E)) > 1
                    else 0.0
                    for i in range(n)
                ]
            for (rows, _), a in zip(members, adv, strict=True):
                for i in rows:
                    out[i] = a
        return out
    if name == "stepwise":
        return ref_levels(b, cfg, 0)[0][0]
    if name == "gigpo":
        A0 = ref_levels(b, cfg, 0)[0][0]
        ep = ref_episode(b, cfg)[0]
        return [e + cfg.omega * a for e, a in zip(ep, A0, strict=False)]
    if name == "oracle":
        return ref_levels(b, cfg, cfg.K)[0][cfg.K]
    if name == "hgpo-nohog2":
        A, _, sizes = ref_levels(b, cfg, cfg.K)
        return [A[cfg.K][i] if sizes[cfg.K][i] >= 2 else A[0][i] for i in range(b.n_steps)]
    if name in ("hgpo", "hgpo-uniform"):
        alpha = 0.0 if name == "hgpo-uniform" else cfg.alpha
        A, keys, _ = ref_levels(b, cfg, cfg.K)
        R = ref_returns(b, cfg)
        items_per_level = [
            (float(k + cfg.weight_offset) ** alpha, A[k], keys[k], _group_informative(keys[k], R))
            for k in range(cfg.K + 1)
        ]
        if cfg.base_group:
            ep, ep_info = ref_episode(b, cfg)
            items_per_level.append((cfg.base_weight, ep, [True] * b.n_steps, ep_info))
        out = []
        for i in range(b.n_steps):
            num = 0.0
            den = 0.0
            any_used = False
            for w, Ak, keys_k, info_k in items_per_level:
                if cfg.zero_rule == "degenerate":
                    used = info_k[i]
                elif cfg.zero_rule == "value":
                    used = Ak[i] != 0
                else:
                    used = keys_k[i] is not None
                if used:
                    num += w * Ak[i]
                    den += w
                    any_used = True
            den += cfg.weight_eps
            out.append(num / den if any_used and den > 0 else 0.0)
        return out
    raise ValueError(name)
