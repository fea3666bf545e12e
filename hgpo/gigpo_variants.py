"""verl-agent's GiGPO variants: similarity-based anchor grouping and dynamic sampling.

- ``gigpo_similarity``: GiGPO whose step groups are greedy clusters of similar observation
  texts instead of identical states (verl-agent ``gigpo/core_gigpo.py``, ``build_step_group``
  with ``enable_similarity=True``; ``examples/gigpo_trainer/run_search.sh``).
- ``gigpo_dynamic``: GiGPO on the groups that DAPO-style dynamic sampling keeps
  (``examples/gigpo_dynamic_trainer``: ``algorithm.filter_groups.enable=True``,
  ``agent_system/multi_turn_rollout/utils.py::filter_group_data``).

Both as in vanzll/verl-agent at d0b97244c50f17fb43a6ef0a15bca0e95a044ff7 (a copy of the GiGPO
authors' langfengQ/verl-agent).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from difflib import SequenceMatcher

import numpy as np

from hgpo.batch import StepBatch
from hgpo.config import EstimatorConfig
from hgpo.estimators import Advantages, check_inputs, gigpo
from hgpo.groups import dense_rank
from hgpo.returns import check_step_texts, episode_returns

__all__ = ["dynamic_keep", "gigpo_dynamic", "gigpo_similarity", "similarity_clusters"]

# --------------------------------------------------------------------------- similarity


def lcs_bounds(texts: list[str]) -> np.ndarray:
    """float64[D, D] an exact upper bound of difflib's ratio for every pair of ``texts``:
    bound[a, b] = 2 LCS(a, b) / (|a| + |b|) >= SequenceMatcher(None, a, b).ratio(), in either
    argument order (1 for two empty texts, as difflib's ratio).

    Why it bounds: difflib's ratio is 2 M / (|a| + |b|), M the summed sizes of its matching
    blocks (``get_matching_blocks``). Each block is a run of equal characters a[i:i+k] ==
    b[j:j+k]; the blocks come from disjoint sub-ranges found recursively left and right of
    each longest match, so in order they rise in both texts: together they are a common
    subsequence, M <= LCS. The autojunk heuristic (b of 200 characters or more: characters
    filling more than 1% + 1 of b are not used to seed a match) only keeps difflib from some
    matches, so it lowers M, never raises it. In floats the bound is exact too: LCS comes as an
    integer, 2 LCS = |a| + |b| - Indel distance, and 2.0 * LCS / S is computed as difflib
    computes 2.0 * M / S (one correctly rounded division, monotone in the numerator).

    The Indel distances come from rapidfuzz's ``process.cdist`` (bit-parallel LCS in C, each
    pair once: the scorer is symmetric and the queries are the choices).
    """
    from rapidfuzz import process
    from rapidfuzz.distance import Indel

    D = len(texts)
    dist = process.cdist(texts, texts, scorer=Indel.distance, processor=None, dtype=np.int64)
    lengths = np.fromiter(map(len, texts), np.int64, D)
    total = lengths[:, None] + lengths[None, :]
    with np.errstate(invalid="ignore"):  # two empty texts: 0 / 0, difflib's ratio is 1
        bound = (total - dist).astype(np.float64) / total
    bound[total == 0] = 1.0
    return bound


def _self_similar(x: str, thresh: float) -> bool:
    """difflib's ratio(x, x) >= thresh. Below 200 characters difflib has no autojunk
    heuristic, the longest match of x with itself is x and the ratio is 1."""
    return len(x) < 200 or SequenceMatcher(None, x, x).ratio() >= thresh


def _greedy_literal(obs: Sequence[str], thresh: float) -> list[int]:
    """verl-agent's loop as written: each observation in order joins the first cluster whose
    representative (first member) it is similar to, else starts a new one."""
    reps: list[str] = []
    out = []
    for x in obs:
        for j, r in enumerate(reps):
            if SequenceMatcher(None, x, r).ratio() >= thresh:
                out.append(j)
                break
        else:
            out.append(len(reps))
            reps.append(x)
    return out


def _greedy_distinct(distinct: list[str], thresh: float) -> list[int] | None:
    """The greedy clusters of a group's distinct observations (in order of first occurrence),
    or None when some x starting a cluster has ratio(x, x) < thresh (then a later copy of x
    would not follow the first one: the caller runs the literal loop).

    A pair goes to difflib only when its exact upper bound (:func:`lcs_bounds`) reaches
    thresh; representatives are tried in order of creation, as in the authors' loop.
    """
    D = len(distinct)
    maybe = np.tril(lcs_bounds(distinct) >= thresh, -1)  # earlier texts b < a only
    has = maybe.any(axis=1).tolist()
    cluster_of: list[int] = []  # cluster of each distinct text so far
    rep_of: list[int] = []  # each cluster's representative (a position in ``distinct``)
    matchers: dict[int, SequenceMatcher] = {}  # b = the representative: difflib caches b
    for a in range(D):
        x = distinct[a]
        cluster = -1
        for b in np.flatnonzero(maybe[a]).tolist() if has[a] else ():
            j = cluster_of[b]
            if rep_of[j] != b:
                continue  # b joined a cluster: not a representative
            m = matchers.get(b)
            if m is None:
                m = matchers[b] = SequenceMatcher(None, "", distinct[b])
            m.set_seq1(x)
            if m.ratio() >= thresh:
                cluster = j
                break
        if cluster < 0:
            if not _self_similar(x, thresh):
                return None
            cluster = len(rep_of)
            rep_of.append(a)
        cluster_of.append(cluster)
    return cluster_of


def similarity_clusters(batch: StepBatch, observations: Sequence[str], thresh: float) -> np.ndarray:
    """int64[n] step-group id of every row: greedy clusters of similar observations within
    each rollout group, as verl-agent's ``build_step_group(enable_similarity=True)``.

    Within a rollout group, rows are taken in batch order; a row joins the first cluster whose
    representative r (its first row) has ``SequenceMatcher(None, obs, r).ratio() >= thresh``
    (the argument order is the authors': the ratio is not symmetric past 200 characters),
    else it starts a cluster. Identical observations always land in one cluster (the ratio of
    a string with itself is checked), so only distinct texts are compared, and an exact upper
    bound of the ratio (:func:`lcs_bounds`) skips the pairs that cannot match
    (:func:`_greedy_distinct`).
    """
    n = batch.n_steps
    sid_of: dict[str, int] = {}
    sid = np.fromiter((sid_of.setdefault(o, len(sid_of)) for o in observations), np.int64, n)
    texts = list(sid_of)
    g, _ = dense_rank(batch.group)
    key, n_keys = dense_rank(g * len(texts) + sid)
    first = np.full(n_keys, n, dtype=np.int64)
    np.minimum.at(first, key, np.arange(n, dtype=np.int64))
    order = np.lexsort((first, g[first]))  # keys by group, then by first row
    groups_of_keys = g[first[order]]
    starts = np.flatnonzero(np.r_[True, groups_of_keys[1:] != groups_of_keys[:-1]])
    ends = np.r_[starts[1:], n_keys]
    cluster_of_key = np.empty(n_keys, dtype=np.int64)
    literal: list[int] = []  # rollout groups whose clusters need the literal loop
    offset = 0
    for lo, hi in zip(starts.tolist(), ends.tolist(), strict=True):
        keys = order[lo:hi]
        group_texts = sid[first[keys]].tolist()
        labels = _greedy_distinct([texts[t] for t in group_texts], thresh)
        if labels is None:  # pragma: no cover - needs a text whose ratio with itself < thresh
            literal.append(int(groups_of_keys[lo]))
            continue
        cluster_of_key[keys] = np.asarray(labels, dtype=np.int64) + offset
        offset += max(labels) + 1
    ids = cluster_of_key[key]
    for group in literal:  # pragma: no cover
        rows = np.flatnonzero(g == group)
        labels = _greedy_literal([observations[i] for i in rows.tolist()], thresh)
        ids[rows] = np.asarray(labels, dtype=np.int64) + offset
        offset += max(labels) + 1
    return ids


def check_observations(name: str, batch: StepBatch, observations: object) -> list[str]:
    """``observations`` as a list of n str; a ValueError naming ``name`` otherwise."""
    n = batch.n_steps
    if observations is None:
        raise ValueError(
            f"estimator {name!r} needs observations: a sequence of {n} str, the observation "
            "text of every step"
        )
    return check_step_texts(batch, observations, f"{name}: observations")


def gigpo_similarity(
    batch: StepBatch,
    cfg: EstimatorConfig,
    values: np.ndarray | None = None,
    *,
    observations: Sequence[str] | None = None,
) -> Advantages:
    """GiGPO with similarity-based anchor groups (verl-agent ``gigpo/core_gigpo.py``,
    ``compute_gigpo_outcome_advantage(..., enable_similarity=True, similarity_thresh)`` at
    vanzll/verl-agent@d0b97244c50f17fb43a6ef0a15bca0e95a044ff7):

        A(i, t) = A^E(tau_i) + omega A^S(i, t),
        A^S(i, t) = R_t normalised within S(i, t) = {steps (j, t') of the same rollout group
                    whose observation is in the same greedy cluster},

    the clusters of :func:`similarity_clusters`: o joins the first cluster (in order of
    creation) whose representative r has difflib ``SequenceMatcher(None, o, r).ratio() >=
    gigpo_similarity_thresh``. A^E is Eq. (1)'s episode term, the step term uses ``norm``,
    ``std``, ``eps`` and ``leave_one_out`` as ``gigpo`` does; ``batch.state`` is not used.
    ``observations``: a sequence of n str. ``level_groups[0]`` holds the cluster of each step.
    """
    check_inputs("gigpo_similarity", batch, cfg)
    obs = check_observations("gigpo_similarity", batch, observations)
    clusters = similarity_clusters(batch, obs, cfg.gigpo_similarity_thresh)
    try:  # (the clusters replace the states: a next_state in the batch's keys would not fit)
        clustered = dataclasses.replace(batch, state=clusters, next_state=None)
    except ValueError as exc:  # a branch whose first observation differs from its parent's
        raise ValueError(f"gigpo_similarity: observations: {exc}") from None
    return gigpo(clustered, cfg)


# --------------------------------------------------------------------------- dynamic sampling


def dynamic_keep(batch: StepBatch) -> np.ndarray:
    """bool[n]: the step's rollout group would survive DAPO's dynamic-sampling filter, i.e.
    not all its trajectories have the same episode reward (the undiscounted sum of the env
    rewards, without the invalid-action penalty, as verl-agent's ``filter_group_data``
    compares ``episode_rewards``). A group of one trajectory is dropped too."""
    E = episode_returns(batch)
    g, n_groups = dense_rank(batch.group[batch.traj_start])
    lo = np.full(n_groups, np.inf)
    hi = np.full(n_groups, -np.inf)
    np.minimum.at(lo, g, E)
    np.maximum.at(hi, g, E)
    return (hi > lo)[g][batch.traj_index]


def gigpo_dynamic(
    batch: StepBatch, cfg: EstimatorConfig, values: np.ndarray | None = None
) -> Advantages:
    """GiGPO on the rollout groups that dynamic sampling keeps (verl-agent
    ``examples/gigpo_dynamic_trainer``, ``agent_system/multi_turn_rollout/utils.py``
    ``filter_group_data``, at vanzll/verl-agent@d0b97244c50f17fb43a6ef0a15bca0e95a044ff7):

        A(i, t) = keep(g) [A^E(tau_i) + omega A^S(i, t)] (x n / n_kept with gigpo_dynamic_rescale)
        keep(g) = not all episode rewards R(tau_j), tau_j in g, are equal

    (:func:`dynamic_keep`). Groups never mix in GiGPO, so dropping one changes no other
    group's advantage: this is ``gigpo`` with the dropped groups' steps set to 0. Sampling new
    groups until the batch is full, the last try kept unfiltered, and the clip-higher range
    (``clip_ratio_high`` = 0.28) of those scripts are the rollout's and the loss's business,
    not the estimator's. ``diagnostics["kept"]`` is bool[n], ``["kept_share"]`` the share of
    steps kept.
    """
    check_inputs("gigpo_dynamic", batch, cfg)
    out = gigpo(batch, cfg)
    keep = dynamic_keep(batch)
    n_kept = int(np.count_nonzero(keep))
    scale = batch.n_steps / n_kept if cfg.gigpo_dynamic_rescale and n_kept else 1.0
    A = np.where(keep, out.advantages * scale, 0.0)
    diagnostics = {**out.diagnostics, "kept": keep, "kept_share": n_kept / batch.n_steps}
    return dataclasses.replace(out, advantages=A, diagnostics=diagnostics)
