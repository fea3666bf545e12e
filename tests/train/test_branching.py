"""Branched training rollouts (``--rollout-scheme``, hgpo/train/branched_play.py) on a toy text env.

The tiny model plays keydoor in score mode (every action admissible, so the rollouts are
cheap and valid). The batch is checked against what branching promises: a branch restarts from
its parent's snapshot with its parent's memory (the same prompt, so the same level-K context
group), carries its own rows only, and the group spends its env-step budget within one
episode's overshoot.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from agentenvs.toytext import parse_toy_spec, render
from hgpo.keys import hierarchy
from hgpo.options import OptionError
from hgpo.train.branched_play import BranchPlan, Candidates, Traj, choose, play_branched
from hgpo.train.episodes import Play
from hgpo.train.run_metrics import read_metrics
from hgpo.train.train_config import TrainConfig
from tests.train.conftest import run_cli
from tests.train.tiny_engine import tiny_engine

ENV = "toy:keydoor:size=4,horizon=8"
N, GROUPS = 4, 2


def _cfg(**kw) -> TrainConfig:
    base = dict(env=ENV, action_mode="score", history_length=2, max_steps=8, env_workers=1,
                group_size=N, max_prompt_tokens=1024, rollout_scheme="branch:singleton",
                branch_budget=0.5)  # fmt: skip
    return TrainConfig(**{**base, **kw})


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(tokenizer, engine) of a tiny random Qwen2 trained on the toy env's texts."""
    from hgpo.train.trainer import tiny_corpus

    return tiny_engine(tmp_path_factory.mktemp("m"), tiny_corpus(ENV), 1024, seed=0)


def _play(tiny, cfg: TrainConfig, seed: int = 0):
    from hgpo.train.envs import EnvSet

    tok, engine = tiny
    envs = EnvSet(cfg, "train", GROUPS * N)
    try:
        torch.manual_seed(seed)
        plan = BranchPlan.from_config(cfg)
        rng = np.random.default_rng([seed, 1])
        return play_branched(envs, engine, tok, [0, 1], Play.training(cfg), plan, rng)
    finally:
        envs.close()


@pytest.fixture(scope="module")
def branched(tiny):
    return _play(tiny, _cfg())


def test_branches_continue_their_parents_prefix(branched):
    _check_prefixes(branched)


@pytest.mark.parametrize("scheme", ["branch:uniform", "branch:hard", "branch:3spo", "tree:2,4"])
def test_every_scheme_plays_a_valid_branched_batch(tiny, scheme):
    roll = _play(tiny, _cfg(rollout_scheme=scheme))
    _check_prefixes(roll)
    if scheme.startswith("tree"):
        starts = {roll.step[roll.traj.index(i)] for i, p in enumerate(roll.parent) if p >= 0}
        assert starts <= {2, 4}


def _check_prefixes(roll) -> None:
    batch = roll.step_batch()  # the core validates parents, branch steps and first states
    assert batch.branches is not None and roll.n_branches > 0
    # next_state: validated against the next row within a trajectory; after a trajectory's
    # last step, the observation of one of the env's successors of its hidden state
    assert batch.next_state is not None
    env = parse_toy_spec(ENV).build()
    text = render(env)
    for i in (batch.traj_start + batch.traj_len - 1).tolist():
        h = roll.hidden[i]
        after = {text.obs_text[int(env.obs_of_state[s])] for s in env.next_state[h].ravel()}
        assert roll.next_key[i] in after | {text.obs_text[int(env.obs_of_state[h])]}
    rows_of = {}
    for r, (tr, t) in enumerate(zip(roll.traj, roll.step, strict=True)):
        rows_of.setdefault(tr, {})[t] = r
    for i, p in enumerate(roll.parent):
        own = rows_of.get(i, {})
        if p < 0:
            assert min(own) == 0
            continue
        b = min(own)
        assert 0 <= p < i and b >= 1 and sorted(own) == list(range(b, b + len(own)))
        # the parent's step b (its own row, or an ancestor's when b lies in its prefix)
        q = p
        while b not in rows_of.get(q, {}):
            q = roll.parent[q]
        first, at_b = own[b], rows_of[q][b]
        assert roll.group[first] == roll.group[at_b]
        # restored state and memory: the same prompt, hence the same context at every level
        assert roll.prompt_ids[first] == roll.prompt_ids[at_b]
        assert roll.hidden[first] == roll.hidden[at_b]
        assert roll.length[i] == b + len(own)


def test_branch_first_step_joins_its_parents_level_K_group(branched):
    batch = branched.step_batch()
    h = hierarchy(batch, 2)
    lay = batch.branches
    br = np.flatnonzero(lay.parent >= 0)
    first = lay.first[br]
    at_b = lay.row_at(lay.parent[br], lay.branch_step[br])
    np.testing.assert_array_equal(h.ids[2][first], h.ids[2][at_b])
    assert (h.size_of_row(2)[first] >= 2).all()


def test_roots_and_budget_per_group(branched):
    roll = branched
    plan = BranchPlan.from_config(_cfg())
    assert plan.n_roots == 2
    traj_group = {t: g for t, g in zip(roll.traj, roll.group, strict=True)}
    for g in range(GROUPS):
        trajs = [i for i in range(len(roll.parent)) if traj_group.get(i) == g]
        roots = [i for i in trajs if roll.parent[i] < 0]
        assert len(roots) >= plan.n_roots
        budget = N * np.mean([roll.length[i] for i in roots[: plan.n_roots]])
        used = sum(1 for x in roll.group if x == g)
        assert budget <= used < budget + plan.max_steps, (g, used, budget)


def test_same_seed_same_batch(tiny, branched):
    again = _play(tiny, _cfg())
    assert again.parent == branched.parent and again.step == branched.step
    assert again.response_ids == branched.response_ids and again.reward == branched.reward
    other = _play(tiny, _cfg(), seed=1)
    assert other.response_ids != branched.response_ids


def _cands(step, level, spread=None) -> tuple[Candidates, list[Traj]]:
    step, level = np.asarray(step), np.asarray(level)
    size = np.bincount(level, minlength=level.max() + 1)[level]
    spread = np.zeros(step.size) if spread is None else np.asarray(spread, dtype=float)
    rows = [(0, j) for j in range(step.size)]
    trajs = [Traj(0, -1, 0, None, children=[0] * step.size)]
    return Candidates(rows, step, size, level, spread, np.ones(step.size, bool)), trajs


def test_rules_pick_what_they_promise():
    from toyenvs.branched_rollout import parse_scheme

    rng = np.random.default_rng(0)
    # steps 0..4; level-K groups: {0}, {1, 2}, {3}, {4}: singletons at t >= 1 are rows 3, 4
    single = parse_scheme("branch:singleton")
    c, trajs = _cands([0, 1, 2, 3, 4], [0, 1, 1, 2, 3])
    picks = {choose(single, c, trajs, rng) for _ in range(2)}
    assert picks == {3, 4}  # a picked singleton counts its coming branch: not picked twice
    assert choose(single, c, trajs, rng) in (1, 2, 3, 4)  # none left: uniform over t >= 1
    # hard: the group with the largest return spread (rows 1, 2)
    c, trajs = _cands([0, 1, 2, 3], [0, 1, 1, 2], spread=[0.0, 4.0, 4.0, 1.0])
    assert {choose(parse_scheme("branch:hard"), c, trajs, rng) for _ in range(20)} == {1, 2}
    # tree:2: the step at depth 2 with the fewest branches, then the earliest
    c, trajs = _cands([0, 1, 2, 2], [0, 1, 2, 3])
    trajs[0].children[2] = 1
    assert choose(parse_scheme("tree:2"), c, trajs, rng) == 3
    # no step with t >= 1: a new root
    c, trajs = _cands([0, 0], [0, 0])
    assert choose(parse_scheme("branch:uniform"), c, trajs, rng) is None


def test_3spo_rule_spends_each_observations_rollouts_highest_score_first():
    from toyenvs.branched_rollout import parse_scheme

    rng = np.random.default_rng(0)
    spo3 = parse_scheme("branch:3spo")
    # steps 0..4 with observations 0, 1, 1, 2, 3: S = 1, 0.5, 0.5, 1, 0.2; rollouts left
    # 7, 3, 3, 0, 1. Row 0 has t = 0; row 3 the highest score but none left: observation 1
    # (rows 1, 2) takes its 3 rollouts, then observation 3 (row 4) its one, then none is
    # left: uniform over t >= 1.
    c, trajs = _cands([0, 1, 2, 3, 4], [0, 1, 1, 2, 3])
    c.key = np.array([0, 1, 1, 2, 3])
    c.score = np.array([1.0, 0.5, 0.5, 1.0, 0.2])
    c.left = np.array([7, 3, 3, 0, 1])
    assert {choose(spo3, c, trajs, rng) for _ in range(3)} <= {1, 2}
    assert c.left.tolist() == [7, 0, 0, 0, 1]
    assert choose(spo3, c, trajs, rng) == 4
    assert {choose(spo3, c, trajs, rng) for _ in range(40)} == {1, 2, 3, 4}


def test_named_errors_before_any_work():
    with pytest.raises(OptionError, match=r"TrainConfig.rollout_scheme: must be one of .*'deep'"):
        _cfg(rollout_scheme="deep")
    with pytest.raises(OptionError, match=r"depth: must be an integer in 1\.\.7, got 9"):
        _cfg(rollout_scheme="tree:9")
    for beta in (0.0, 1.5, float("nan")):
        with pytest.raises(OptionError, match=r"TrainConfig.branch_budget: must be a finite"):
            _cfg(branch_budget=beta)
    assert _cfg(rollout_scheme="independent").scheme() is None


def test_cli_branched_run_trains_and_resumes(tmp_path):
    """Two iterations with branch:singleton 0.5; the run resumed from its iteration-1
    checkpoint plays iteration 2 again with the same figures (the branch draws depend on
    (seed, iteration, rank) only)."""
    import shutil

    args = ["--preset", "tiny", "--env", ENV, "--action-mode", "score", "--max-steps", "8"]
    args += ["--group-size", "4", "--rollout-scheme", "branch:singleton", "--branch-budget", "0.5"]
    args += ["--val-every", "0", "--save-every", "1", "--max-prompt-tokens", "1024"]
    a, b = tmp_path / "a", tmp_path / "b"
    r = run_cli([*args, "--out-dir", str(a)])
    assert r.returncode == 0, r.stderr[-3000:]
    rows = read_metrics(a)
    assert len(rows) == 2
    for m in rows:
        assert m["rollout/branches"] > 0 and m["rollout/env_steps"] == m["n_steps"]
        assert m["rollout/roots"] == 2 * 2  # 2 groups x ceil(0.5 x 4) roots
        assert 0.0 <= m["level2/utilisation"] <= 1.0 and np.isfinite(m["pg_loss"])
    shutil.copytree(a, b)
    (b / "checkpoints" / "latest").write_text("iter_000001\n")  # as if killed after it 1
    shutil.rmtree(b / "checkpoints" / "iter_000002")
    r = run_cli([*args, "--out-dir", str(b), "--resume"])
    assert r.returncode == 0, r.stderr[-3000:]
    again = read_metrics(b)
    assert [m["iteration"] for m in again] == [1, 2]
    for k, v in rows[1].items():
        if not k.startswith(("time/", "tokens_per_s")):
            assert again[1][k] == pytest.approx(v, rel=1e-6, abs=1e-9), k


def test_env_without_snapshots_is_one_line_exit_2_before_the_model(tmp_path, capsys, monkeypatch):
    from agentenvs import toytext
    from hgpo.train.__main__ import main

    monkeypatch.setattr(toytext.ToyTextEnv, "supports_snapshot", False)  # the workers fork
    out = tmp_path / "run"
    argv = ["--preset", "tiny", "--env", ENV, "--rollout-scheme", "branch:singleton"]
    assert main([*argv, "--out-dir", str(out)]) == 2
    err = capsys.readouterr().err
    want = "error: TrainConfig.env (rollout_scheme='branch:singleton'): must be an environment "
    assert err.startswith(want + f"with snapshot support, got {ENV!r}"), err
    assert err.count("\n") == 1 and not (out / "tiny_model").exists()


def test_truth_reads_a_branch_context_across_its_branch_point(tiny, branched):
    """--truth-every on a branched batch: every row's chain node renders the prompt the row
    showed (a branch's context reaches into its parent's steps), and every estimator's figures
    come out."""
    from hgpo import ESTIMATORS
    from hgpo.train.model import encode_prompt
    from hgpo.train.truth_monitor import TruthMonitor

    tok, _ = tiny
    cfg = _cfg()
    mon = TruthMonitor(cfg, tok)
    nodes = mon.step_nodes(mon.rollout_steps(branched))
    for i, t in enumerate(branched.step):
        text = mon.prompt(int(t), int(mon.row_code[nodes.row[i]]))
        assert branched.prompt_ids[i] == encode_prompt(tok, text, cfg.max_prompt_tokens), i
    # every estimator against a stand-in truth (scoring the whole chain takes too long here)
    probs = np.full((mon.row_code.size, mon.env.n_actions), 1.0 / mon.env.n_actions)
    m = mon.estimator_metrics(mon.solve(probs), mon.rollout_steps(branched), nodes)
    assert all(np.isfinite(m[f"truth/{e}/mse_all"]) for e in ESTIMATORS)
