"""The run folder (issue 27, item 3): default folders depend on what is run, a folder holding
another run's results is refused before anything is written, ``--fresh`` removes that run's
files (and nothing else), and a resumed run keeps its checkpoint's settings (item 9, end to
end)."""

from __future__ import annotations

import json

import pytest

from hgpo.train import checkpoint as ckpt
from hgpo.train.__main__ import main
from hgpo.train.run_metrics import read_metrics
from hgpo.train.rundir import clear_run
from hgpo.train.train_config import parse_args, resolve
from tests.train.conftest import run_cli


@pytest.mark.parametrize(
    ("preset", "env", "want"),
    [
        ("tiny", "webshop", "runs/tiny-webshop"),
        ("tiny", "alfworld", "runs/tiny-alfworld"),
        ("tiny", "toy:keydoor:size=4", "runs/tiny-toy-keydoor-size4"),
        ("tiny", "toy:keydoor:size=4,horizon=20", "runs/tiny-toy-keydoor-size4-horizon20"),
        ("alfworld-1.5b-k2", None, "runs/alfworld-1.5b-k2"),
        ("alfworld-1.5b-k2", "webshop", "runs/alfworld-1.5b-k2-webshop"),
        ("webshop-qwen3-4b-k4", None, "runs/webshop-qwen3-4b-k4"),
        (None, None, "runs/hgpo-alfworld"),
        (None, "webshop", "runs/hgpo-webshop"),
    ],
)
def test_default_out_dir_depends_on_preset_and_env(preset, env, want):
    assert resolve(env=env, preset=preset).out_dir == want
    argv = (["--preset", preset] if preset else []) + (["--env", env] if env else [])
    assert parse_args(argv)[0].out_dir == want
    # a given --out-dir wins
    assert parse_args([*argv, "--out-dir", "elsewhere"])[0].out_dir == "elsewhere"


def _webshop_run(out):
    """A folder as a finished 1-iteration tiny WebShop run leaves it (without training)."""
    cfg = resolve(preset="tiny", env="webshop", overrides={"out_dir": str(out)})
    cfg.save(out / "config.json")
    (out / "metrics.jsonl").write_text('{"iteration": 1, "success_rate": 0.5}\n')
    root = out / "checkpoints"
    tmp = ckpt.tmp_dir(root, 1)
    cfg.save(tmp / "config.json")
    ckpt.commit(root, tmp, 1, keep=2)
    (out / "tiny_model").mkdir()
    (out / "notes.txt").write_text("mine")
    return cfg


def _snapshot(out):
    return {p.relative_to(out).as_posix(): p.read_bytes() for p in out.rglob("*") if p.is_file()}


@pytest.mark.parametrize(
    ("argv", "found"),
    [
        (["--env", "alfworld"], "a config.json with env='webshop' where this run has 'alfworld'"),
        (["--env", "webshop", "--lr", "0.001"], "a config.json with lr=0.0001 where this run"),
        (["--env", "webshop"], "metrics.jsonl, checkpoints/"),  # same settings: results stay
    ],
)
def test_a_folder_with_another_runs_results_is_refused(argv, found, tmp_path, capsys, monkeypatch):
    import hgpo.train.trainer as trainer

    monkeypatch.setattr(trainer, "train", lambda cfg: [])
    out = tmp_path / "run"
    out.mkdir()
    _webshop_run(out)
    before = _snapshot(out)
    assert main(["--preset", "tiny", *argv, "--out-dir", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(
        f"error: TrainConfig.out_dir: {str(out)!r} holds another run's results ("
    ), err
    assert found in err
    assert (
        "give another --out-dir, continue that run with --resume, or start anew there with "
        "--fresh (removes its config.json, metrics.jsonl, resumes.jsonl, checkpoints/, "
        "tensorboard/, tiny_model/, tiny_model.tmp/)"
    ) in err
    assert err.count("\n") == 1
    assert _snapshot(out) == before


def test_a_folder_without_results_or_with_the_same_config_is_used(tmp_path, monkeypatch):
    import hgpo.train.trainer as trainer

    monkeypatch.setattr(trainer, "train", lambda cfg: [])
    out = tmp_path / "run"
    out.mkdir()
    (out / "notes.txt").write_text("mine")  # not a run's file
    assert main(["--preset", "tiny", "--env", "webshop", "--out-dir", str(out)]) == 0
    # a run killed before its first row left only its config.json: the same command goes on
    resolve(preset="tiny", env="webshop", overrides={"out_dir": str(out)}).save(out / "config.json")
    assert main(["--preset", "tiny", "--env", "webshop", "--out-dir", str(out)]) == 0


def test_clear_run_removes_the_run_files_only(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    _webshop_run(out)
    (out / "resumes.jsonl").write_text("{}\n")
    removed = clear_run(out)
    assert removed == ["config.json", "metrics.jsonl", "resumes.jsonl", "checkpoints/",
                       "tiny_model/"]  # fmt: skip
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]


def test_cli_refuses_then_fresh_resume_checks_and_records(tmp_path):
    """End to end on the tiny WebShop loop: a LoRA run; a resume with another rank refused
    (config.json untouched, and a plain --resume still works); a resume with another lr
    allowed and recorded; an alfworld run into the folder refused; --fresh starts anew."""
    out = tmp_path / "run"
    base = ["--preset", "tiny", "--env", "webshop", "--val-every", "0", "--lora-rank", "4",
            "--out-dir", str(out)]  # fmt: skip
    r = run_cli([*base, "--iterations", "1"])
    assert r.returncode == 0, r.stderr[-2000:]
    assert (out / "checkpoints" / "iter_000001" / "config.json").exists()
    saved = (out / "config.json").read_text()
    r = run_cli([*base, "--iterations", "2", "--lora-rank", "8", "--resume"])
    assert r.returncode == 2, r.stderr[-2000:]
    assert (
        r.stderr.strip()
        .splitlines()[-1]
        .startswith(
            f"error: TrainConfig.lora_rank: --resume with --lora-rank 8, but "
            f"{out / 'checkpoints' / 'iter_000001'} was made with 4"
        )
    )
    assert "Traceback" not in r.stderr and (out / "config.json").read_text() == saved
    r = run_cli([*base, "--iterations", "2", "--lr", "0.001", "--resume"])
    assert r.returncode == 0, r.stderr[-2000:]
    assert "note: --resume changes --iterations 1 -> 2, --lr 0.0001 -> 0.001" in r.stderr
    rows = [json.loads(x) for x in (out / "resumes.jsonl").read_text().splitlines()]
    assert rows == [{"iteration": 2, "changed": {"iterations": [1, 2], "lr": [0.0001, 0.001]}}]
    assert [m["lr"] for m in read_metrics(out)] == [0.0001, 0.001]
    other = ["--preset", "tiny", "--env", "toy:keydoor:size=4", "--val-every", "0",
             "--iterations", "1", "--out-dir", str(out)]  # fmt: skip
    r = run_cli(other)
    assert r.returncode == 2 and "holds another run's results" in r.stderr, r.stderr[-2000:]
    assert read_metrics(out)[-1]["iteration"] == 2
    r = run_cli([*other, "--fresh"])
    assert r.returncode == 0, r.stderr[-2000:]
    assert "--fresh: removed config.json, metrics.jsonl, resumes.jsonl, checkpoints/" in r.stderr
    assert [m["iteration"] for m in read_metrics(out)] == [1]
    assert not (out / "resumes.jsonl").exists()
    assert json.loads((out / "config.json").read_text())["env"] == "toy:keydoor:size=4"
