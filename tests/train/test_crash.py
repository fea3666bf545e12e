"""Crashed env episodes (issue 27 item 2): left out of the batch, counted as rollout/crashed,
and a batch with too many of them stops the run before its update and checkpoint.

Crashes are injected with the trainer's test hook ``HGPO_TRAIN_ENV_CRASH`` ("S1,S2@T": the
training envs of slots S1, S2 raise at the T-th step of every episode; "...:exit" makes their
worker exit there, so every slot of that worker crashes). The tiny model plays keydoor in score
mode, as in test_branching.py.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hgpo import EstimatorConfig, compute_advantages
from hgpo.train.branched_play import BranchPlan, play_branched
from hgpo.train.envs import CRASH_ENV, EnvSet
from hgpo.train.episodes import Play, run_episodes
from hgpo.train.run_metrics import read_metrics
from hgpo.train.train_config import TrainConfig
from tests.train.conftest import run_cli
from tests.train.test_branching import _check_prefixes
from tests.train.tiny_engine import tiny_engine

ENV = "toy:keydoor:size=4,horizon=8"
N, GROUPS = 4, 2


def _cfg(**kw) -> TrainConfig:
    base = dict(env=ENV, action_mode="score", history_length=2, max_steps=8, env_workers=2,
                group_size=N, max_prompt_tokens=1024)  # fmt: skip
    return TrainConfig(**{**base, **kw})


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(tokenizer, engine) of a tiny random Qwen2 trained on the toy env's texts."""
    from hgpo.train.trainer import tiny_corpus

    return tiny_engine(tmp_path_factory.mktemp("m"), tiny_corpus(ENV), 1024, seed=0)


def _play(tiny, monkeypatch, rule: str, cfg: TrainConfig):
    """One training rollout of 2 groups x N with the crash rule (independent or branched)."""
    tok, engine = tiny
    if rule:
        monkeypatch.setenv(CRASH_ENV, rule)
    envs = EnvSet(cfg, "train", GROUPS * N)  # 2 workers: slots 0-3 and 4-7
    try:
        torch.manual_seed(0)
        plan = BranchPlan.from_config(cfg)
        if plan is None:
            return run_episodes(envs, engine, tok, [0, 1], Play.training(cfg))
        rng = np.random.default_rng([0, 1])
        return play_branched(envs, engine, tok, [0, 1], Play.training(cfg), plan, rng)
    finally:
        envs.close()


def _members(roll) -> dict[int, int]:
    """Trajectories per rollout group."""
    out: dict[int, int] = {}
    for g in {g: None for g in roll.group}:
        out[g] = len({t for t, x in zip(roll.traj, roll.group, strict=True) if x == g})
    return out


def test_crashed_episodes_are_left_out_of_the_batch(tiny, monkeypatch):
    # before: the 4 crashed episodes stayed in the batch, 2-step trajectories with return 0
    roll = _play(tiny, monkeypatch, "0,1,2,5@2", _cfg())
    assert roll.crashed == roll.dropped == 4 and roll.played == 8
    assert len(roll.success) == 4 and roll.length == [8, 8, 8, 8]
    assert _members(roll) == {0: 1, 1: 3}  # group 0 is left with one member
    batch = roll.step_batch()
    adv = compute_advantages("grpo", batch, EstimatorConfig()).advantages
    assert np.all(adv[np.asarray(roll.group) == 0] == 0.0)  # a lone member's GRPO advantage
    for name in ("hgpo", "rloo", "gigpo"):
        assert np.isfinite(compute_advantages(name, batch, EstimatorConfig()).advantages).all()


def test_a_dead_worker_loses_its_slots_episodes_only(tiny, monkeypatch):
    roll = _play(tiny, monkeypatch, "1@2:exit", _cfg())
    assert roll.crashed == 4 and _members(roll) == {1: 4}  # group 0 lived in worker 0


def test_no_crash_no_change(tiny, monkeypatch):
    roll = _play(tiny, monkeypatch, "", _cfg())
    assert roll.crashed == roll.dropped == 0 and _members(roll) == {0: 4, 1: 4}


BRANCHED = dict(rollout_scheme="branch:uniform", branch_budget=0.5)


def test_a_crashed_root_goes_with_its_branches(tiny, monkeypatch):
    # slots 0, 1 are group 0's roots (ceil(0.5 x 4) = 2), 2 and 3 play its branches
    clean = _play(tiny, monkeypatch, "", _cfg(**BRANCHED))
    roll = _play(tiny, monkeypatch, "0@3", _cfg(**BRANCHED))
    assert clean.crashed == 0 and roll.crashed >= 1
    assert roll.played == len(roll.success) + roll.dropped and roll.dropped >= roll.crashed
    _check_prefixes(roll)  # every kept branch's parent is in the batch
    roots = {g: sum(1 for i in roll.roots() if roll.group[roll.traj.index(i)] == g)
             for g in range(GROUPS)}  # fmt: skip
    assert roots[1] >= 2  # group 1 is untouched by slot 0's crashes
    # every trajectory in the batch is whole: it ends at the episode's end, not at a crash
    assert all(n == 8 for n in roll.length)


def test_a_crashed_branch_is_left_out(tiny, monkeypatch):
    # group 0's branch slots 2, 3 crash at every branch's first step (its roots' slots 0, 1
    # play branches too once the roots have ended: those stay)
    roll = _play(tiny, monkeypatch, "2,3@1", _cfg(**BRANCHED))
    assert roll.crashed >= 2 and roll.dropped == roll.crashed and roll.n_branches > 0
    _check_prefixes(roll)
    assert len(roll.roots()) == 4  # no root crashed


def test_a_group_whose_roots_all_crashed_is_left_out(tiny, monkeypatch):
    roll = _play(tiny, monkeypatch, "0,1@1", _cfg(**BRANCHED))
    assert set(roll.group) == {1} and roll.crashed == 2 and roll.dropped == 2


def test_metrics_count_the_crashes():
    from hgpo.train.run_metrics import PhaseTimes, RankFigures, merge_metrics

    def part(crashed: int) -> RankFigures:
        return RankFigures(3, 0.0, 0.0, [0.0], [True], [1.0], [3], 0, 1, 1.0, 1.0, (0.0, 0, 0.0),
                           [], {}, PhaseTimes(), crashed=crashed, dropped=crashed)  # fmt: skip

    m = merge_metrics([part(2), part(1)])
    assert m["rollout/crashed"] == 3 and m["rollout/dropped"] == 3 and m["n_trajectories"] == 2


TINY = ["--preset", "tiny", "--env", ENV, "--action-mode", "score", "--max-steps", "8",
        "--group-size", "4", "--val-every", "0", "--max-prompt-tokens", "1024"]  # fmt: skip


@pytest.mark.parametrize("scheme", ["independent", "branch:uniform"])
def test_too_many_crashes_stop_the_run_before_the_update(tmp_path, scheme):
    out = tmp_path / "run"
    args = [*TINY, "--iterations", "2", "--rollout-scheme", scheme, "--out-dir", str(out)]
    r = run_cli(args, {CRASH_ENV: "0,1,2,4@2"})  # 4 of 8 episodes (roots: of 4), > 0.25
    assert r.returncode == 1, r.stderr[-3000:]
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("error: iteration 1: "), last
    assert "episodes crashed in their environments" in last and "--max-crash-share" in last
    assert not list(out.glob("checkpoints/*"))
    assert read_metrics(out) == []


def test_a_tolerated_crash_is_counted_and_left_out(tmp_path):
    out = tmp_path / "run"
    args = [*TINY, "--iterations", "1", "--out-dir", str(out)]
    r = run_cli(args, {CRASH_ENV: "3@2"})  # 1 of 8 episodes: 0.125 <= 0.25
    assert r.returncode == 0, r.stderr[-3000:]
    (row,) = read_metrics(out)
    assert row["rollout/crashed"] == 1 and row["n_trajectories"] == 7
    assert row["episode_length"] == 8 and row["n_steps"] == 7 * 8
    assert "1 of 8 episodes crashed" in r.stderr


@pytest.mark.parametrize("share", ["-0.1", "1.5", "nan"])
def test_max_crash_share_is_bounded(share, capsys):
    from hgpo.train.__main__ import main

    with pytest.raises(SystemExit) as e:
        main(["--preset", "tiny", "--max-crash-share", share])
    assert e.value.code == 2
    want = "TrainConfig.max_crash_share: must be a finite number in [0, 1]"
    assert want in capsys.readouterr().err


def test_the_crash_bound_is_a_share_of_the_played_episodes():
    from hgpo.train.episodes import Rollout
    from hgpo.train.trainer import EnvCrashError, stop_if_crashed

    two_of_8 = Rollout(success=[False] * 6, crashed=2, dropped=2)
    stop_if_crashed(two_of_8, 0.25, 1)  # 0.25 is not more than 0.25
    with pytest.raises(EnvCrashError, match=r"^iteration 1: 2 of 8 episodes crashed .*share 0\.25 > TrainConfig\.max_crash_share=0\.2\)"):  # fmt: skip
        stop_if_crashed(two_of_8, 0.2, 1)
    stop_if_crashed(Rollout(success=[True] * 4), 0.0, 1)  # no crash passes even at 0
    with pytest.raises(EnvCrashError, match=r"4 of 4 episodes crashed .*\(none is left to train on\)"):  # fmt: skip
        stop_if_crashed(Rollout(crashed=4, dropped=4), 1.0, 2)  # 1: never, unless nothing is left
