"""The trainer's branch-point rule (``hgpo.train.branched_play.choose``) equals the toyenvs rules it
re-implements (the one-at-a-time reference ``choose_branch_point`` of
tests/toyenvs/reference_branching.py, which ``toyenvs.branched_rollout.branch_kernel`` equals bit for
bit), on the same group of finished trajectories.

Same inputs: a group's rows (trajectory, step t, level-K context code, reward, invalid flag,
branches so far), seeded at random over every rule. The reference reads its level-K counts and
return-to-go sums from its own ``_record``; the trainer's side builds them as
``_Game._candidates`` does (``hgpo.estimators.step_returns`` at gamma = 1 with the default
penalty, which is ``toyenvs.INVALID_PENALTY``, and ``_group_spread``). Same draws, by
construction: the trainer's generator is replaced by one that draws ``u`` from the reference's
choice stream and takes the ``floor(u n)``-th of the eligible rows it is given, as the
reference's ``_pick`` does. So the chosen row, the eligible set it was drawn from and the
stream's state afterwards must all be equal. No torch is needed.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

import toyenvs
from hgpo import StepBatch
from hgpo.config import EstimatorConfig
from hgpo.estimators import step_returns
from hgpo.train.branched_play import Candidates, _group_spread, choose, spo3_fields
from tests.toyenvs import reference_branching as ref
from toyenvs import _kernels as kn
from toyenvs.branched_rollout import _RULE_CODE, parse_scheme, spo3_params

CASES = 400  # per rule


class _Stream:
    """A stand-in for the trainer's generator: ``choice`` draws as the reference's ``_pick``."""

    def __init__(self, state: int) -> None:
        self.state = np.int64(state)
        self.offered: np.ndarray | None = None

    def choice(self, a: np.ndarray) -> int:
        self.offered = np.asarray(a).copy()
        self.state, u = kn.rng_uniform(self.state)
        return int(a[min(int(u * a.size), a.size - 1)])


def _group(rng: np.random.Generator) -> dict[str, np.ndarray]:
    """A random group of finished trajectories in row order: roots from t = 0, then branches
    from a step t >= 1 of an earlier trajectory (a parent's own steps, as the trainer's)."""
    n_codes = int(rng.integers(1, 6))  # few codes: level-K groups collide
    traj, step, parent, code = [], [], [], []
    first = {}  # (trajectory, t) -> its row
    spans: list[tuple[int, int]] = []  # (first t, end t) of each trajectory
    for k in range(int(rng.integers(1, 7))):
        froms = [(p, t) for p, (a, b) in enumerate(spans) for t in range(max(a, 1), b)]
        if k == 0 or not froms or rng.random() < 0.3:
            p, t0 = -1, 0
        else:
            p, t0 = froms[int(rng.integers(len(froms)))]
        L = int(rng.integers(1, 5))
        spans.append((t0, t0 + L))
        for t in range(t0, t0 + L):
            first[k, t] = len(traj)
            traj.append(k)
            step.append(t)
            parent.append(p)
            # a branch's first step is its parent's (same snapshot, same level-K context)
            code.append(code[first[p, t]] if t == t0 and p >= 0 else int(rng.integers(n_codes)))
    n = len(traj)
    return {
        "traj": np.array(traj, dtype=np.int64),
        "step": np.array(step, dtype=np.int64),
        "parent": np.array(parent, dtype=np.int64),
        "code": np.array(code, dtype=np.int64),
        "reward": rng.choice([0.0, 0.0, 1.0, 10.0], n),
        "invalid": rng.random(n) < 0.25,
        "nchild": rng.integers(0, 3, n).astype(np.int64),
    }


N_OBS = 6  # the codes (observations at K = 0) are 0..5


def _reference(rule: int, g: dict, at_depth: np.ndarray, cst: int, est: EstimatorConfig):
    """(row or -1, eligible mask, stream) of the reference on group ``g``."""
    n = g["step"].size
    size = 1
    while size < 2 * n:
        size *= 2
    gkey = np.full(size, -1, dtype=np.int64)
    gcnt, gsum, gsq = np.zeros(size, np.int64), np.zeros(size), np.zeros(size)
    slot = np.empty(n, dtype=np.int64)
    keys = g["code"][None, :].copy()  # K = 0: the level-K key is the code itself
    starts = np.flatnonzero(np.r_[True, g["traj"][1:] != g["traj"][:-1]])
    for a, b in zip(starts, np.r_[starts[1:], n], strict=True):
        ref._record(0, a, b, keys, 0, g["reward"], g["invalid"], slot, gkey, gcnt, gsum, gsq)
    elig = np.empty(n, dtype=np.bool_)
    r, cst = ref.choose_branch_point(
        rule, 0, n, g["step"], slot, gcnt, gsum, gsq, g["nchild"].copy(), at_depth, elig, cst,
        g["code"], g["traj"], g["parent"], g["reward"], spo3_params(est), N_OBS,
    )  # fmt: skip
    return int(r), elig, int(cst)


def _trainer(scheme, g: dict, cst: int, est: EstimatorConfig):
    """(row or -1, eligible rows offered to the draw or None, stream) of ``choose``."""
    n = g["step"].size
    parent = g["parent"] if (g["parent"] >= 0).any() else None
    batch = StepBatch(
        group=np.zeros(n, dtype=np.int64), traj=g["traj"], step=g["step"], reward=g["reward"],
        state=g["code"], invalid=g["invalid"], parent=parent,
    )  # fmt: skip
    R = step_returns(batch, EstimatorConfig(gamma=1.0))
    level = np.unique(g["code"], return_inverse=True)[1].astype(np.int64).reshape(-1)
    size = np.bincount(level)[level]
    spread = _group_spread(level, R, np.ones(n, dtype=bool))
    rows = [(0, i) for i in range(n)]  # one record holds every row: children[i] = row i's
    trajs = [SimpleNamespace(children=list(g["nchild"]))]
    cands = Candidates(rows, g["step"].copy(), size, level, spread, np.ones(n, dtype=bool))
    if scheme.rule == "branch:3spo":  # as _Game._candidates: every trajectory here finished
        done = np.ones(batch.n_traj, dtype=bool)
        cands.key, cands.score, cands.left = spo3_fields(batch, done, g["nchild"], est)
    stream = _Stream(cst)
    r = choose(scheme, cands, trajs, stream)  # type: ignore[arg-type]
    return (-1 if r is None else r), stream.offered, int(stream.state)


def test_same_penalty():
    assert EstimatorConfig().invalid_penalty == toyenvs.INVALID_PENALTY
    assert EstimatorConfig().penalty_mode == "return"  # R_t sums the penalised rewards


RULE_NAMES = ["branch:uniform", "branch:singleton", "branch:hard", "tree", "branch:3spo"]


@pytest.mark.parametrize("name", RULE_NAMES)
def test_choose_equals_reference(name):
    rng = np.random.default_rng(RULE_NAMES.index(name))
    drawn = fell_back = picked = 0
    for case in range(CASES):
        g = _group(rng)
        # 3spo's options: the authors' alpha and a graded one; xi low enough to truncate
        est = EstimatorConfig(spo3_alpha=float(rng.choice([50.0, 1.0, 0.3])),
                              spo3_xi=float(rng.choice([10.0, 2.0])),
                              spo3_g_max=int(rng.choice([8, 2, 3])))  # fmt: skip
        T = int(g["step"].max()) + 1
        if name == "tree":
            depths = sorted({int(d) for d in rng.integers(1, T + 2, int(rng.integers(1, 3)))})
            scheme = parse_scheme("tree:" + ",".join(map(str, depths)))
        else:
            scheme = parse_scheme(name)
        at_depth = np.zeros(max(T, max(scheme.depths, default=0)) + 1, dtype=np.bool_)
        at_depth[list(scheme.depths)] = True
        cst = int(kn.stream_seed(case, 7))
        r_ref, elig, cst_ref = _reference(_RULE_CODE[scheme.rule], g, at_depth, cst, est)
        r_tr, offered, cst_tr = _trainer(scheme, g, cst, est)
        where = f"{name} case {case}: {g}"
        assert r_tr == r_ref, where
        assert cst_tr == cst_ref, where  # the same number of draws
        if offered is not None:  # a draw: from the same eligible rows
            np.testing.assert_array_equal(offered, np.flatnonzero(elig), err_msg=where)
            drawn += 1
            fell_back += offered.size == int((g["step"] >= 1).sum())
        picked += offered is None and r_tr >= 0  # tree's own pick: no draw
    # the cases reach the rule's own choices, its fallback to uniform and "no step t >= 1"
    if name == "tree":
        assert picked > 0 and drawn > 0 and picked + drawn < CASES
    else:
        assert CASES // 2 < drawn < CASES
        assert 0 < fell_back < drawn or name == "branch:uniform"
