"""The whole loop on a CPU with the tiny model: both benchmarks, the critic, a kill and a
resume, and two ranks under ZeRO-0 and ZeRO-3 (each test a few tens of seconds)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from hgpo.train.run_metrics import read_metrics
from tests.train.conftest import GAMES, ROOT, run_cli, run_env

PAPER_SIX = ("adv_mean", "pg_loss", "kl", "clip_frac", "reward_mean", "success_rate")


def _ok(r: subprocess.CompletedProcess) -> None:
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-5000:]}"


def test_webshop_end_to_end(tmp_path):
    out = tmp_path / "ws"
    r = run_cli(
        ["--preset", "tiny", "--env", "webshop", "--out-dir", str(out), "--tensorboard", "true"]
    )
    _ok(r)
    rows = read_metrics(out)
    assert [row["iteration"] for row in rows] == [1, 2]
    for row in rows:
        for k in (
            *PAPER_SIX,
            "invalid_rate",
            "tokens_per_s",
            "time/rollout",
            "time/advantage",
            "time/update",
            "level0/utilisation",
            "level2/mean_group_size",
            "grad_norm",
        ):
            assert k in row, k
        assert row["n_trajectories"] == 4 and row["n_steps"] >= 4
        assert row["grad_norm"] > 0
    assert {"val/eval/success", "val/eval/score"} <= set(rows[-1])
    saved = json.loads((out / "config.json").read_text())
    assert saved["env"] == "webshop" and saved["model"] == "tiny"
    assert (out / "checkpoints" / "latest").read_text().strip() == "iter_000002"
    assert list((out / "tensorboard").iterdir())


def test_alfworld_end_to_end_with_shipped_games(tmp_path):
    out = tmp_path / "af"
    r = run_cli(
        [
            "--preset",
            "tiny",
            "--env",
            "alfworld",
            "--alfworld-games-dir",
            str(GAMES),
            "--iterations",
            "1",
            "--val-every",
            "1",
            "--val-tasks",
            "1",
            "--history-length",
            "1",
            "--out-dir",
            str(out),
        ]
    )
    _ok(r)
    (row,) = read_metrics(out)
    assert row["n_trajectories"] == 4
    assert {"level0/utilisation", "level1/utilisation"} <= set(row)
    for split in ("valid_seen", "valid_unseen"):  # in and out of distribution, per task type
        assert row[f"val/{split}/tasks"] == 1
        assert any(k.startswith(f"val/{split}/type/") for k in row)


def test_gae_trains_a_critic_under_zero2(tmp_path):
    out = tmp_path / "gae"
    r = run_cli(
        [
            "--preset",
            "tiny",
            "--env",
            "webshop",
            "--estimator",
            "gae",
            "--zero-stage",
            "2",
            "--iterations",
            "1",
            "--val-every",
            "0",
            "--out-dir",
            str(out),
        ]
    )
    _ok(r)
    (row,) = read_metrics(out)
    assert row["vf_loss"] > 0
    assert (out / "checkpoints" / "iter_000001" / "critic").is_dir()


def _weights(ckpt_dir):
    import torch

    state = torch.load(
        ckpt_dir / "actor" / "mp_rank_00_model_states.pt", map_location="cpu", weights_only=False
    )
    return state["module"]


def test_sigkill_mid_update_and_mid_save_then_resume(tmp_path):
    """Killed mid-update (iteration 2) and mid-checkpoint (iteration 3), the run resumes each
    time from its last complete checkpoint (the last time passing over checkpoint 2, cut short)
    and ends exactly where an uninterrupted run ends."""
    import torch

    args = [
        "--preset",
        "tiny",
        "--env",
        "webshop",
        "--iterations",
        "3",
        "--val-every",
        "0",
        "--save-every",
        "1",
        "--keep-checkpoints",
        "3",
    ]
    out = tmp_path / "killed"
    r = run_cli([*args, "--out-dir", str(out)], {"HGPO_TRAIN_KILL_AT": "update:2"})
    assert r.returncode == -9, r.stderr[-3000:]
    assert (out / "checkpoints" / "latest").read_text().strip() == "iter_000001"
    assert [x["iteration"] for x in read_metrics(out)] == [1]

    r = run_cli([*args, "--out-dir", str(out), "--resume"], {"HGPO_TRAIN_KILL_AT": "save:3"})
    assert r.returncode == -9, r.stderr[-3000:]
    assert (out / "checkpoints" / "latest").read_text().strip() == "iter_000002"
    assert (out / "checkpoints" / ".tmp-iter_000003").is_dir()  # the half-written one
    assert [x["iteration"] for x in read_metrics(out)] == [1, 2, 3]

    # checkpoint 2 cut short (a full disk): the resume passes over it to checkpoint 1
    two = out / "checkpoints" / "iter_000002"
    weights = two / "actor" / "mp_rank_00_model_states.pt"
    weights.write_bytes(weights.read_bytes()[:100])
    r = run_cli([*args, "--out-dir", str(out), "--resume"])
    _ok(r)
    assert (f"note: --resume: checkpoint {two} is damaged (actor/mp_rank_00_model_states.pt is "
            f"100 bytes") in r.stderr and "the run resumes from " in r.stderr  # fmt: skip
    assert [x["iteration"] for x in read_metrics(out)] == [1, 2, 3]
    assert not list((out / "checkpoints").glob(".tmp-*"))

    ref = tmp_path / "straight"
    _ok(run_cli([*args, "--out-dir", str(ref)]))
    a, b = read_metrics(out), read_metrics(ref)
    for x, y in zip(a, b, strict=True):
        for k in ("pg_loss", "kl", "adv_mean", "n_steps", "gen_tokens"):
            assert x[k] == pytest.approx(y[k], rel=1e-6, abs=1e-9), (x["iteration"], k)
    wa, wb = (
        _weights(out / "checkpoints" / "iter_000003"),
        _weights(ref / "checkpoints" / "iter_000003"),
    )
    assert wa.keys() == wb.keys()
    for k in wa:
        assert torch.allclose(wa[k], wb[k], atol=1e-6), k


def test_two_ranks_split_the_rollouts(tmp_path):
    """Two ranks under ZeRO-0 and, started alongside, under ZeRO-3 (every forward of the
    sharded actor, reference and checkpoint gather a collective): the same figures."""
    env = run_env()
    procs = {}
    for stage in ("0", "3"):
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node",
            "2",
            "-m",
            "hgpo.train",
            "--preset",
            "tiny",
            "--env",
            "webshop",
            "--iterations",
            "1",
            "--groups-per-iter",
            "4",
            "--val-every",
            "1",
            "--val-tasks",
            "3",
            "--zero-stage",
            stage,
            "--out-dir",
            str(tmp_path / f"zero{stage}"),
        ]
        procs[stage] = subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
    rows = {}
    for stage, p in procs.items():
        out, err = p.communicate(timeout=600)
        _ok(subprocess.CompletedProcess(p.args, p.returncode, out, err))
        (rows[stage],) = read_metrics(tmp_path / f"zero{stage}")
        ck = tmp_path / f"zero{stage}" / "checkpoints" / "iter_000001"
        assert os.listdir(ck / "actor")
        assert (ck / "hf_model" / "config.json").is_file()
    row = rows["0"]
    assert row["n_trajectories"] == 8  # 4 groups x 2 rollouts, 2 groups per rank
    assert row["val/eval/tasks"] == 3  # 2 on rank 0, 1 on rank 1
    for k in ("pg_loss", "kl", "entropy", "grad_norm", "adv_mean", "n_steps", "gen_tokens"):
        assert rows["3"][k] == pytest.approx(row[k], rel=1e-6, abs=1e-8), k
    assert rows["3"]["val/eval/success"] == row["val/eval/success"]
