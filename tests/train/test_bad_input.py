"""Bad input to ``python -m hgpo.train``: a one-line error naming the fix, exit 2, before any
model is built; a non-finite loss stops the run before its checkpoint."""

from __future__ import annotations

import pytest

from hgpo.train import preflight
from hgpo.train.__main__ import main
from hgpo.train.metrics import read_metrics
from tests.train.conftest import run_cli

NOT_INSTALLED = ("vllm", "textworld")


@pytest.fixture
def without_extras(monkeypatch):
    """vllm and the [alfworld] extra look uninstalled (whatever this machine has)."""
    real = preflight.installed
    monkeypatch.setattr(preflight, "installed", lambda m: m not in NOT_INSTALLED and real(m))


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (
            ["--out-dir", "{tmp}/a_file/run"],
            "TrainConfig.out_dir: cannot write to '{tmp}/a_file/run'",
        ),
        (["--device", "cuda"], "TrainConfig.device: 'cuda', but torch"),
        (["--rollout-engine", "vllm"], "TrainConfig.rollout_engine: 'vllm' needs the vllm package"),
        (
            ["--env", "alfworld"],
            "TrainConfig.env: 'alfworld' needs textworld (the [alfworld] extra)",
        ),
        (["--model", "{tmp}/missing"], "TrainConfig.model: '{tmp}/missing' is not a model folder"),
        # peft drops a misspelt name silently when another name matches: named here, per name
        (
            ["--lora-rank", "4", "--lora-targets", "q_proj,v_prj"],
            "TrainConfig.lora_targets: 'v_prj' matches no module of the model; the layers LoRA "
            "can wrap are down_proj, embed_tokens, gate_proj, k_proj, lm_head, o_proj, q_proj, "
            "up_proj, v_proj (or give all-linear)",
        ),
        (
            ["--lora-rank", "4", "--lora-targets", "layers"],
            "TrainConfig.lora_targets: 'layers' names a ModuleList, which LoRA cannot wrap",
        ),
    ],
)
def test_setup_errors_are_one_line_exit_2_before_the_model(
    argv, needle, tmp_path, capsys, without_extras
):
    (tmp_path / "a_file").write_text("")
    out = tmp_path / "run"
    argv = [a.format(tmp=tmp_path) for a in argv]
    if "--out-dir" not in argv:
        argv += ["--out-dir", str(out)]
    if "--env" not in argv:
        argv += ["--env", "webshop"]
    if "cuda" in argv and __import__("torch").cuda.is_available():
        pytest.skip("this machine has CUDA")
    assert main(["--preset", "tiny", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: " + needle.format(tmp=tmp_path)), err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert not (out / "tiny_model").exists() and not (out / "config.json").exists()


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--config", "/missing.json"], "--config: cannot read '/missing.json' (No such file"),
        (["--seed", "-1"], "TrainConfig.seed: must be an integer in 0..4294967295, got -1"),
        (["--lr", "inf"], "TrainConfig.lr: must be a finite number > 0, got inf"),
        (["--dual-clip", "nan"], "TrainConfig.dual_clip: must be a finite number >= 0, got nan"),
    ],
)
def test_bad_flags_exit_2(argv, needle, capsys):
    with pytest.raises(SystemExit) as e:
        main(["--preset", "tiny", *argv])
    assert e.value.code == 2
    assert needle in capsys.readouterr().err


def test_resume_without_a_checkpoint_says_so(tmp_path, capsys, monkeypatch):
    import hgpo.train.trainer as trainer

    monkeypatch.setattr(trainer, "train", lambda cfg: [])  # stop before any heavy work
    assert main(["--preset", "tiny", "--out-dir", str(tmp_path), "--resume"]) == 0
    want = f"note: --resume: no checkpoint in {tmp_path / 'checkpoints'}, so this run starts fresh"
    assert want in capsys.readouterr().err


@pytest.mark.parametrize(("nan_at", "latest"), [(1, None), (2, "iter_000001")])
def test_a_nan_loss_stops_the_run_before_its_checkpoint(nan_at, latest, tmp_path):
    out = tmp_path / "nan"
    args = ["--preset", "tiny", "--env", "webshop", "--iterations", "3", "--val-every", "0"]
    r = run_cli([*args, "--out-dir", str(out)], {"HGPO_TRAIN_NAN_AT": str(nan_at)})
    assert r.returncode == 1, r.stderr[-3000:]
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith(
        f"error: iteration {nan_at}: the PPO loss or the gradient norm is not finite"
    )
    ckpts = out / "checkpoints"
    assert sorted(p.name for p in ckpts.glob("iter_*")) == ([latest] if latest else [])
    assert not list(ckpts.glob(".tmp-*"))
    if latest:
        assert (ckpts / "latest").read_text().strip() == latest
    assert [row["iteration"] for row in read_metrics(out)] == list(range(1, nan_at))
