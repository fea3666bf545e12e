"""Branched training rollouts (``--rollout-scheme``): roots, then branches from visited steps.

Per rollout group (one task), at the env-step cost of ``group_size`` = N independent episodes
in expectation (docs/branching.md, "In the LLM trainer"):

1. n_root = max(1, ceil((1 - beta) N)) root episodes from the task's start (beta =
   ``branch_budget``); once they have all ended the group's budget is
   S_g = N x (mean length of its roots) env steps.
2. Branches until the group's env steps reach S_g. A branch restarts the environment from the
   snapshot of a visited step (t, trajectory p) with p's prompt memory at t, so its first step
   has exactly p's K-step context: it falls in p's level-K group. It plays to the episode's
   end (or ``max_steps``). Its rows are its own steps only (the shared prefix stays p's
   sample), in a :class:`hgpo.StepBatch` with the ``parent`` column (:mod:`hgpo.branched_batch`).

Branch points are drawn among the group's recorded steps with t >= 1 by the scheme's rule
(as :mod:`toyenvs.branched_rollout`): ``branch:uniform`` uniformly; ``branch:singleton`` among steps
whose level-K group (hgpo's own :func:`hgpo.keys.hierarchy` on the group's partial batch) is
still a singleton; ``branch:hard`` among the steps of the level-K group(s) whose return-to-go
(the estimator's step return R_t, finished trajectories only) has the largest population
variance; ``branch:3spo`` by 3SPO's rollout allocation (arXiv 2606.09961): among the steps
whose observation o still has rollouts left, n(o) = ceil(G_max S(o)) exceeds 1 + the branches
already started from o, those of the highest state score S(o) (:mod:`hgpo.threespo`, Eq. 1,
from the visit and success counts of the group's finished trajectories, t = 1 + their
number; the ``spo3_*`` options of the run's estimator config); ``tree:D`` at the set depths,
fewest branches first. A rule with no eligible step
falls back to uniform, and to a new root (restored from the task's start) when no step has
t >= 1. The draws come from the trainer's per-iteration generator, so same seed, same batch.

A trajectory whose env crashed (a step, snapshot or restore raised, or its worker died or hung)
is left out of the batch with every branch below it (their prefix rows are its rows); it
counts in ``Rollout.crashed``. Its steps count in used_g; S_g is N x the mean length of the
roots that did not crash (0 when every root crashed: the group is left out), and no branch
starts from a crashed trajectory.

Every slot of the group (N of them) plays in lockstep with all others (one engine call per
step for every live slot, as :func:`hgpo.train.episodes.run_episodes`). A free slot takes a new
branch while used_g + reserve_g < S_g, where reserve_g = sum over the group's branches in
flight of (max_steps - t) bounds what they may still take; so the group ends with
S_g <= used_g < S_g + max_steps (the last branch may overshoot by less than one episode).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from agentenvs.memory import EpisodeMemory
from hgpo import StepBatch, state_ids
from hgpo.config import EstimatorConfig
from hgpo.estimators import step_returns
from hgpo.groups import dense_rank
from hgpo.keys import hierarchy
from hgpo.threespo import rollout_allocation, state_score, state_visits
from hgpo.train.envs import EnvSet
from hgpo.train.episodes import (
    Engine,
    Play,
    Rollout,
    StepRecord,
    act,
    after_step,
    warn_crashed,
)
from hgpo.train.run_metrics import BranchFigures

if TYPE_CHECKING:
    from hgpo.schemes import Scheme

__all__ = ["BranchPlan", "branch_figures", "choose", "play_branched", "spo3_fields"]

_TIE = 1e-12  # return-to-go variances this close count as equal (toyenvs' tolerance)


class BranchPlanSettings(Protocol):
    """The settings :meth:`BranchPlan.from_config` reads (``TrainConfig`` has them)."""

    branch_budget: float
    group_size: int
    max_steps: int

    def estimator_config(self) -> EstimatorConfig: ...

    def scheme(self) -> Scheme | None: ...


@dataclass(frozen=True)
class BranchPlan:
    """How branched rollouts are played: the scheme, the branch share, the grouping."""

    scheme: Scheme
    budget: float
    """beta: the share of each group's env steps spent on branches."""
    group_size: int
    max_steps: int
    estimator: EstimatorConfig
    """K, gamma, penalty and early rule of the level-K keys and the return-to-go."""

    @classmethod
    def from_config(cls, cfg: BranchPlanSettings) -> BranchPlan | None:
        """The plan of ``cfg``; None for ``rollout_scheme = "independent"``."""
        scheme = cfg.scheme()
        if scheme is None:
            return None
        return cls(scheme, cfg.branch_budget, cfg.group_size, cfg.max_steps, cfg.estimator_config())

    @property
    def n_roots(self) -> int:
        """Root episodes per group: max(1, ceil((1 - beta) N))."""
        return max(1, math.ceil((1.0 - self.budget) * self.group_size - 1e-9))


@dataclass
class Traj:
    """One trajectory while it is played: its own steps from ``start`` on."""

    group: int
    parent: int
    """Index of the parent trajectory in the play, -1 for a root."""
    start: int
    """Its first step (the branch step b; 0 for a root)."""
    memory: EpisodeMemory
    """The prompt memory of its virtual full trajectory (the parent's first b records, then its
    own); :meth:`EnvSet.remember` appends to it while it holds a slot."""
    steps: list[StepRecord] = field(default_factory=list)
    snaps: list[Any] = field(default_factory=list)
    """The env snapshot before each own step (to branch from it)."""
    children: list[int] = field(default_factory=list)
    """Branches started at each own step (the tree rule's count)."""
    info: dict[str, Any] = field(default_factory=dict)
    finished: bool = False

    @property
    def t(self) -> int:
        """The next step of its virtual trajectory."""
        return self.start + len(self.steps)

    @property
    def crashed(self) -> bool:
        """Its environment crashed (at a step, a snapshot or its restore)."""
        return bool(self.info.get("crashed"))


@dataclass
class Group:
    """One rollout group: its slots, its trajectories, its budget."""

    slots: list[int]
    trajs: list[int] = field(default_factory=list)
    budget: float | None = None
    """S_g, known once its roots have ended."""
    used: int = 0
    """Env steps its trajectories have taken."""


@dataclass
class Candidates:
    """A group's recorded steps as branch points, and what the rules read of them."""

    rows: list[tuple[int, int]]
    """(trajectory, own step index) of each recorded step."""
    step: np.ndarray
    size: np.ndarray
    """Size of each step's level-K group (0 for a step left out of level K)."""
    level: np.ndarray
    """Level-K group id of each step (-1: left out)."""
    spread: np.ndarray
    """Population variance of the finished return-to-go in each step's level-K group."""
    usable: np.ndarray
    """The step has a snapshot (False where taking it crashed the env)."""
    key: np.ndarray | None = None
    """(branch:3spo) Dense id of each step's observation."""
    score: np.ndarray | None = None
    """(branch:3spo) S(o) of each step's observation (:func:`spo3_fields`)."""
    left: np.ndarray | None = None
    """(branch:3spo) Rollouts left at each step's observation, n(o) - 1 - B(o)."""


@dataclass
class Slots:
    """What the lockstep loop knows of every slot."""

    obs: list[str]
    infos: list[dict[str, Any]]
    holder: list[int]
    """The trajectory each slot plays, -1 for a free slot."""
    pending: list[Any]
    """The snapshot of each live slot's current state (for its next step's record)."""


def play_branched(
    envs: EnvSet,
    engine: Engine,
    tok: Any,
    task_ids: list[int],
    play: Play,
    plan: BranchPlan,
    rng: np.random.Generator,
) -> Rollout:
    """Play ``task_ids`` as rollout groups under ``plan`` (module docstring); group g is
    task_ids[g]. Returns the branched :class:`Rollout` (``parent`` per trajectory)."""
    game = _Game(envs, plan, rng)
    t0 = time.perf_counter()
    game.start_roots(task_ids, play.group_size)
    env_s = time.perf_counter() - t0
    gen_tokens, gen_s = 0, 0.0
    while True:
        t = time.perf_counter()
        game.launch_branches()
        live = game.live()
        env_s += time.perf_counter() - t
        if not live:
            break
        s = game.slots
        acted = act(envs, engine, tok, s.obs, s.infos, live, play)
        gen_tokens, gen_s = gen_tokens + acted.gen_tokens, gen_s + acted.gen_seconds
        t = time.perf_counter()
        game.step(live, acted)
        env_s += time.perf_counter() - t
    return game.collect(gen_tokens, gen_s, env_s)


class _Game:
    """The state of one branched rollout: slots, trajectories, groups (one per task)."""

    def __init__(self, envs: EnvSet, plan: BranchPlan, rng: np.random.Generator) -> None:
        self.envs, self.plan, self.rng = envs, plan, rng
        self.trajs: list[Traj] = []
        self.groups: list[Group] = []
        self.slots = Slots([], [], [], [])

    # -- roots -----------------------------------------------------------------------------
    def start_roots(self, task_ids: list[int], group_size: int) -> None:
        """Reset every slot, play n_root of each group's slots as roots, park the others."""
        obs, infos = self.envs.reset(task_ids, group_size)
        B = len(obs)
        self.slots = Slots(list(obs), list(infos), [-1] * B, [None] * B)
        roots = [g * group_size + j for g in range(len(task_ids)) for j in range(self.plan.n_roots)]
        self.groups = [
            Group(list(range(g * group_size, (g + 1) * group_size))) for g in range(len(task_ids))
        ]
        root_set = set(roots)
        self.envs.park([i for i in range(B) if i not in root_set])
        live = [i for i in roots if not infos[i].get("crashed")]
        for i, snap in zip(live, self.envs.snapshot(live), strict=True):
            self.slots.pending[i] = snap
        for i in roots:
            self._hold(i, Traj(i // group_size, -1, 0, self.envs.memory(i)))
        for i in roots:  # after all are held: a group's budget waits for all its roots
            if infos[i].get("crashed"):
                self._finish(i, infos[i])

    def collect(self, gen_tokens: int, gen_s: float, env_s: float) -> Rollout:
        """The trajectories as one :class:`Rollout`, group by group, each group's in the order
        they started (a parent before its branches). A crashed trajectory is left out with
        every branch below it (a branch's prefix rows are its parent's)."""
        out = Rollout(gen_tokens=gen_tokens, gen_seconds=gen_s, env_seconds=env_s)
        order = [k for grp in self.groups for k in grp.trajs if not self._lost(k)]
        new_id = {k: n for n, k in enumerate(order)}
        for k in order:
            tr = self.trajs[k]
            out.parent.append(new_id[tr.parent] if tr.parent >= 0 else -1)
            out.add_trajectory(tr.steps, tr.group, tr.info, tr.start)
        out.crashed = sum(tr.crashed for tr in self.trajs)
        out.dropped = len(self.trajs) - len(order)
        warn_crashed(out)
        return out

    def _lost(self, k: int) -> bool:
        """Trajectory k crashed, or one of its ancestors did."""
        while k >= 0:
            if self.trajs[k].crashed:
                return True
            k = self.trajs[k].parent
        return False

    def _hold(self, slot: int, traj: Traj) -> None:
        self.trajs.append(traj)
        self.groups[traj.group].trajs.append(len(self.trajs) - 1)
        self.slots.holder[slot] = len(self.trajs) - 1

    def live(self) -> list[int]:
        """Slots that play a trajectory this step."""
        return [i for i, h in enumerate(self.slots.holder) if h >= 0]

    # -- one lockstep step -----------------------------------------------------------------
    def step(self, live: list[int], acted: Any) -> None:
        """Record the step of every live slot, step the envs (snapshotting the slots that go
        on, in the same round trip) and end the finished trajectories."""
        actions = [""] * len(self.slots.holder)
        for j, i in enumerate(live):
            tr = self.trajs[self.slots.holder[i]]
            tr.steps.append(acted.records[j])
            tr.snaps.append(self.slots.pending[i])
            tr.children.append(0)
            actions[i] = acted.actions[j]
            self.groups[tr.group].used += 1
        obs, rewards, dones, infos, snaps = self.envs.step_and_snapshot(actions)
        for i in live:
            tr = self.trajs[self.slots.holder[i]]
            after_step(tr.steps[-1], float(rewards[i]), infos[i], self.envs.key(i, obs[i]))
            self.slots.obs[i], self.slots.infos[i] = obs[i], infos[i]
            self.slots.pending[i] = snaps[i]
            if dones[i] or tr.t >= self.plan.max_steps:
                if not dones[i]:
                    self.envs.park([i])  # cut at max_steps, as run_episodes does
                self._finish(i, infos[i])

    def _finish(self, slot: int, info: dict[str, Any]) -> None:
        tr = self.trajs[self.slots.holder[slot]]
        tr.info, tr.finished = info, True
        self.slots.holder[slot] = -1
        grp = self.groups[tr.group]
        roots = [self.trajs[k] for k in grp.trajs if self.trajs[k].parent < 0]
        if grp.budget is None and all(r.finished for r in roots):
            played = [len(r.steps) for r in roots if not r.crashed]  # a crash's length is none
            mean_len = sum(played) / len(played) if played else 0.0
            grp.budget = self.plan.group_size * mean_len

    # -- branches --------------------------------------------------------------------------
    def launch_branches(self) -> None:
        """Fill every group's free slots with branches while its budget allows."""
        pairs: list[tuple[int, Any]] = []
        starts: list[tuple[int, Traj]] = []
        for g, grp in enumerate(self.groups):
            free = [i for i in grp.slots if self.slots.holder[i] < 0]
            if grp.budget is None or not free:
                continue
            cands = None
            for slot in free:
                if grp.used + self._reserve(grp) >= grp.budget:
                    break
                if cands is None:
                    cands = self._candidates(g)
                branch = self._branch_from(g, cands)
                if branch is None:
                    grp.budget = grp.used
                    break
                traj, snap = branch
                self._hold(slot, traj)
                pairs.append((slot, snap))
                starts.append((slot, traj))
        if not pairs:
            return
        obs, infos = self.envs.restore(pairs, [tr.memory for _, tr in starts])
        for (slot, snap), o, info in zip(pairs, obs, infos, strict=True):
            self.slots.obs[slot], self.slots.infos[slot] = o, info
            self.slots.pending[slot] = snap
            if info.get("crashed"):  # the env could not take the snapshot: an empty branch
                self._finish(slot, info)

    def _reserve(self, grp: Group) -> int:
        """The most env steps the group's trajectories in flight may still take."""
        return sum(
            self.plan.max_steps - self.trajs[k].t for k in grp.trajs if not self.trajs[k].finished
        )

    def _branch_from(self, g: int, cands: Candidates) -> tuple[Traj, Any] | None:
        """A new branch of group g by the scheme's rule, or a new root restored from the task's
        start when no step has t >= 1; None when there is nothing to restore from."""
        r = choose(self.plan.scheme, cands, self.trajs, self.rng)
        if r is None:
            started = [
                self.trajs[k]
                for k in self.groups[g].trajs
                if self.trajs[k].snaps and self.trajs[k].snaps[0] is not None
            ]
            if not started:  # every root crashed before its first step
                return None
            return Traj(g, -1, 0, EpisodeMemory()), started[0].snaps[0]
        k, j = cands.rows[r]
        parent = self.trajs[k]
        parent.children[j] += 1
        b = parent.start + j
        memory = EpisodeMemory(list(parent.memory.records[:b]))
        return Traj(g, k, b, memory), parent.snaps[j]

    def _candidates(self, g: int) -> Candidates:
        """The group's recorded steps, their level-K groups (hgpo.keys.hierarchy on the
        group's partial branched batch) and the spread of their finished returns-to-go."""
        ids = [k for k in self.groups[g].trajs if not self._lost(k)]  # no branch of a crash
        local = {k: n for n, k in enumerate(ids)}
        rows = [(k, j) for k in ids for j in range(len(self.trajs[k].steps))]
        if not rows:
            none = np.zeros(0, dtype=np.int64)
            return Candidates([], none, none, none, np.zeros(0), np.zeros(0, dtype=bool))
        recs = [self.trajs[k].steps[j] for k, j in rows]
        traj = np.array([local[k] for k, _ in rows], dtype=np.int64)
        parent = np.array([local.get(self.trajs[k].parent, -1) for k, _ in rows], dtype=np.int64)
        batch = StepBatch(
            group=np.zeros(len(rows), dtype=np.int64),
            traj=traj,
            step=np.array([self.trajs[k].start + j for k, j in rows], dtype=np.int64),
            reward=np.array([r.reward for r in recs], dtype=np.float64),
            state=state_ids([r.key for r in recs]),
            invalid=np.array([r.invalid for r in recs], dtype=bool),
            parent=parent if (parent >= 0).any() else None,
        )
        est = self.plan.estimator
        h = hierarchy(batch, est.K, early=est.early)
        level = h.ids[est.K]
        finished = np.array([self.trajs[k].finished for k, _ in rows], dtype=bool)
        spread = _group_spread(level, step_returns(batch, est), finished)
        usable = np.array([self.trajs[k].snaps[j] is not None for k, j in rows], dtype=bool)
        cands = Candidates(rows, batch.step, h.size_of_row(est.K), level, spread, usable)
        if self.plan.scheme.rule == "branch:3spo":
            done = np.array([self.trajs[ids[i]].finished for i in batch.traj[batch.traj_start]])
            children = np.array([self.trajs[k].children[j] for k, j in rows], dtype=np.int64)
            cands.key, cands.score, cands.left = spo3_fields(batch, done, children, est)
        return cands


def branch_figures(roll: Rollout) -> BranchFigures:
    """The branched rollout's own figures for the metrics row."""
    counts = np.bincount(np.asarray(roll.traj, dtype=np.int64), minlength=len(roll.success))
    branches = [i for i, p in enumerate(roll.parent) if p >= 0]
    return BranchFigures(
        env_steps=len(roll),
        roots=len(roll.parent) - len(branches),
        branch_success=[roll.success[i] for i in branches],
        branch_steps=[int(counts[i]) for i in branches],
    )


def spo3_fields(
    batch: StepBatch, finished: np.ndarray, children: np.ndarray, est: EstimatorConfig
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(key, S, left) of every step of a group's partial batch for ``branch:3spo``: the dense
    id of its observation, S(o) (Eq. 1 of :mod:`hgpo.threespo`, counts over the ``finished``
    trajectories, bool[n_traj]: each counts the observations of its virtual trajectory once,
    W those whose last reward is > 0, t = 1 + their number) and the rollouts left there,
    n(o) - 1 - B(o), n(o) = ceil(G_max S(o)) (Eq. 3), B(o) the branches already started from
    steps with observation o (``children``: int64[n] branches started from each step)."""
    v = state_visits(batch, "batch", counted=finished)
    score = state_score(v.n_total, v.n_success, v.t, est)
    key, n_keys = dense_rank(batch.state)
    started = np.bincount(key, weights=children, minlength=n_keys).astype(np.int64)
    left = rollout_allocation(score, est.spo3_g_max) - 1 - started[key]
    return key, score, left


def _group_spread(level: np.ndarray, R: np.ndarray, finished: np.ndarray) -> np.ndarray:
    """float64[n] population variance of R over the finished members of each step's level-K
    group (0 with fewer than two finished members)."""
    out = np.zeros(level.shape[0])
    use = finished & (level >= 0)
    if not use.any():
        return out
    n_groups = int(level.max()) + 1
    cnt = np.bincount(level[use], minlength=n_groups).astype(np.float64)
    s1 = np.bincount(level[use], R[use], minlength=n_groups)
    s2 = np.bincount(level[use], R[use] ** 2, minlength=n_groups)
    with np.errstate(invalid="ignore", divide="ignore"):
        var = np.where(cnt >= 2, s2 / cnt - (s1 / np.maximum(cnt, 1)) ** 2, 0.0)
    member = level >= 0
    out[member] = np.maximum(var[level[member]], 0.0)
    return out


def choose(
    scheme: Scheme, cands: Candidates, trajs: list[Traj], rng: np.random.Generator
) -> int | None:
    """Index into ``cands.rows`` of the next branch point by ``scheme``'s rule; None when no
    step has t >= 1. A chosen singleton's group counts one more member from then on (the
    branch's first step joins it), so one launch round does not pick it twice; likewise a
    chosen step's observation has one rollout less left (3spo)."""
    ok = (cands.step >= 1) & cands.usable
    if not ok.any():
        return None
    if scheme.rule == "branch:singleton":
        eligible = ok & (cands.size == 1)
    elif scheme.rule == "branch:hard":
        best = float(cands.spread[ok].max())
        eligible = ok & (cands.spread >= best - _TIE) if best > _TIE else ok & False
    elif scheme.rule == "branch:3spo":  # rollouts left at its observation; the highest S(o)
        eligible = ok & (cands.left >= 1)
        if eligible.any():
            eligible &= cands.score == cands.score[eligible].max()
    elif scheme.rule == "tree":
        eligible = ok & np.isin(cands.step, scheme.depths)
        if eligible.any():  # fewest branches first, then the earliest step
            kids = np.array([trajs[k].children[j] for k, j in cands.rows])
            pick = np.flatnonzero(eligible)
            return int(pick[np.argmin(kids[pick])])
    else:
        eligible = ok
    if not eligible.any():
        eligible = ok
    r = int(rng.choice(np.flatnonzero(eligible)))
    if cands.level[r] >= 0:
        cands.size[cands.level == cands.level[r]] += 1
    if cands.left is not None:  # (3spo) the coming branch takes one of o's rollouts
        cands.left[cands.key == cands.key[r]] -= 1
    return r
