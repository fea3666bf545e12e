"""TrainConfig: presets, CLI overrides, validation messages, saved config."""

from __future__ import annotations

import dataclasses
import json
import os

import pytest

from hgpo.train.train_config import (
    PRESETS,
    SECTIONS,
    TrainConfig,
    build_parser,
    field_docs,
    parse_args,
    resolve,
)


def test_every_field_is_in_one_section_in_class_order():
    names = [f.name for f in dataclasses.fields(TrainConfig)]
    assert [n for section in SECTIONS.values() for n in section] == names


def test_help_shows_each_section_once_with_its_flags():
    """Issue 28: --help printed a section header before almost every flag (a group per field)."""
    text = build_parser().format_help()
    for title, names in SECTIONS.items():
        assert text.count(f"\n{title}:\n") == 1, title
        body = text.split(f"\n{title}:\n", 1)[1].split("\n\n", 1)[0]
        for name in names:
            assert "--" + name.replace("_", "-") in body, (title, name)


def test_every_numeric_field_refuses_nan_and_infinity():
    base = resolve(preset="tiny")
    for f in dataclasses.fields(TrainConfig):
        if f.type not in ("int", "float", int, float):
            continue
        for value in (float("nan"), float("inf"), -float("inf")):
            with pytest.raises(ValueError, match=f"TrainConfig.{f.name}: must be"):
                dataclasses.replace(base, **{f.name: value})


def test_every_field_has_a_docstring_and_a_flag():
    docs = field_docs()
    names = [f.name for f in dataclasses.fields(TrainConfig)]
    assert set(docs) == set(names)
    helptext = build_parser().format_help()
    for name in names:
        assert "--" + name.replace("_", "-") in helptext


def test_paper_presets_carry_the_paper_settings():
    assert {
        f"{e}-{s}-k{k}" for e in ("alfworld", "webshop") for s in ("1.5b", "7b") for k in (2, 4)
    } < set(PRESETS)
    c = resolve(preset="alfworld-1.5b-k4")
    assert (c.env, c.model, c.history_length) == ("alfworld", "Qwen/Qwen2.5-1.5B-Instruct", 4)
    assert (c.max_steps, c.max_prompt_tokens, c.max_response_tokens, c.mini_batch_size) == (
        50,
        2048,
        512,
        256,
    )
    assert (c.groups_per_iter, c.group_size, c.iterations, c.val_tasks) == (16, 8, 160, 128)
    assert (c.lr, c.critic_lr, c.kl_coef, c.gamma, c.clip_ratio, c.dual_clip) == (
        1e-6,
        1e-5,
        0.01,
        0.95,
        0.2,
        3.0,
    )
    assert (c.entropy_coef, c.grad_clip, c.ppo_epochs, c.temperature, c.val_temperature) == (
        0.001,
        1.0,
        1,
        1.0,
        0.4,
    )
    w = resolve(preset="webshop-7b-k2")
    assert (w.env, w.model, w.max_steps, w.max_prompt_tokens, w.mini_batch_size, w.val_tasks) == (
        "webshop",
        "Qwen/Qwen2.5-7B-Instruct",
        15,
        4096,
        64,
        256,
    )
    assert resolve(env="webshop").max_steps == 15  # env defaults without a preset
    assert w.estimator_config().K == 2


def test_the_tiny_preset_keeps_a_toy_envs_horizon():
    """Issue 30: the tiny preset's max_steps = 3 cut keydoor episodes (8+ steps to the goal)
    silently; a toy env now keeps its horizon (the toy default 100 caps nothing), --max-steps
    still cuts it, and ALFWorld and WebShop keep the preset's 3."""
    toy = "toy:keydoor:size=4"
    assert resolve(env=toy, preset="tiny").max_steps == 100
    assert resolve(env=toy, preset="tiny", overrides={"max_steps": 5}).max_steps == 5
    assert parse_args(["--preset", "tiny", "--env", toy, "--max-steps", "7"])[0].max_steps == 7
    assert resolve(env="alfworld", preset="tiny").max_steps == 3
    assert resolve(env="webshop", preset="tiny").max_steps == 3


def test_cli_overrides_every_kind_of_field(tmp_path):
    cfg, _ = parse_args(
        [
            "--preset",
            "tiny",
            "--env",
            "webshop",
            "--lr",
            "3e-4",
            "--history-length",
            "4",
            "--estimator",
            "gigpo",
            "--wandb",
            "--tensorboard",
            "false",
            "--out-dir",
            str(tmp_path),
        ]
    )
    assert (cfg.env, cfg.lr, cfg.history_length, cfg.estimator, cfg.wandb, cfg.tensorboard) == (
        "webshop",
        3e-4,
        4,
        "gigpo",
        True,
        False,
    )
    assert cfg.model == "tiny" and cfg.out_dir == str(tmp_path)


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--estimator", "ppo"], "unknown estimator 'ppo'; known estimators: grpo"),
        (["--lr", "-1"], "TrainConfig.lr: must be a finite number > 0, got -1.0"),
        (["--lr", "inf"], "TrainConfig.lr: must be a finite number > 0, got inf"),
        (["--kl-coef", "inf"], "TrainConfig.kl_coef: must be a finite number >= 0, got inf"),
        (["--dual-clip", "nan"], "TrainConfig.dual_clip: must be a finite number >= 0, got nan"),
        (["--gamma", "nan"], "TrainConfig.gamma: must be a finite number in [0, 1], got nan"),
        (["--temperature=-inf"], "TrainConfig.temperature: must be a finite number > 0"),
        (
            ["--env-timeout-s", "inf"],
            "TrainConfig.env_timeout_s: must be a finite number in (0, 86400]",
        ),
        (["--seed", "-1"], "TrainConfig.seed: must be an integer in 0..4294967295, got -1"),
        (["--env", "minecraft"], "TrainConfig.env: must be one of 'alfworld', 'webshop'"),
        (["--device", "tpu"], "TrainConfig.device: must be one of 'auto', 'cpu', 'cuda'"),
        (["--estimator-options", "nrm=mean"], "unknown estimator option 'nrm'"),
        (["--estimator-options", "norm=median"], "EstimatorConfig.norm: must be one of"),
        (["--estimator-options", "alpha=inf"], "EstimatorConfig.alpha: must be a finite number"),
        (["--zero-stage", "4"], "TrainConfig.zero_stage: must be an integer in 0..3, got 4"),
        (["--dual-clip", "0.5"], "TrainConfig.dual_clip: must be 0 (off) or > 1, got 0.5"),
        (["--clip-ratio", "1"], "TrainConfig.clip_ratio: must be a finite number in (0, 1)"),
        (["--config", "/missing.json"], "--config: cannot read '/missing.json' (No such file"),
        (["--no-such-field", "1"], "unrecognized arguments: --no-such-field"),
    ],
)
def test_bad_values_are_named(argv, needle, capsys):
    with pytest.raises(SystemExit):
        parse_args(["--preset", "tiny", *argv])
    assert needle in capsys.readouterr().err


def test_unknown_field_in_overrides_and_saved_config(tmp_path):
    with pytest.raises(ValueError, match="unknown TrainConfig field 'lrr'"):
        resolve(preset="tiny", overrides={"lrr": 1.0})
    bad = tmp_path / "c.json"
    bad.write_text(json.dumps({"lr": 1e-3, "bogus": 1}))
    with pytest.raises(ValueError, match="unknown TrainConfig field 'bogus'"):
        TrainConfig.load(bad)


def test_missing_model_fails_before_heavy_work(tmp_path):
    from hgpo.train.trainer import validate_config

    with pytest.raises(ValueError, match=r"TrainConfig\.model: .* is not a model folder"):
        validate_config(resolve(preset="tiny", overrides={"model": str(tmp_path / "nothing")}))
    with pytest.raises(ValueError, match=r"TrainConfig\.model: cannot load 'no-org/no-model'"):
        validate_config(resolve(preset="tiny", overrides={"model": "no-org/no-model"}))
    with pytest.raises(ValueError, match="alfworld_games_dir"):
        validate_config(resolve(preset="tiny", overrides={"alfworld_games_dir": str(tmp_path)}))


def test_saved_config_round_trips_and_resume_reads_it(tmp_path):
    cfg = resolve(preset="tiny", env="webshop", overrides={"out_dir": str(tmp_path), "lr": 5e-5})
    cfg.save(tmp_path / "config.json")
    assert TrainConfig.load(tmp_path / "config.json") == cfg
    # --resume: the saved config is the base, the given flags change it
    again, _ = parse_args(["--out-dir", str(tmp_path), "--resume", "--iterations", "7"])
    assert again == dataclasses.replace(cfg, resume=True, iterations=7)


def test_import_hgpo_does_not_import_torch():
    import subprocess
    import sys

    code = "import sys, hgpo, hgpo.train.train_config; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_cli_error_exit_for_missing_model(tmp_path):
    from tests.train.conftest import run_cli

    r = run_cli(
        ["--preset", "tiny", "--model", str(tmp_path / "missing"), "--out-dir", str(tmp_path)]
    )
    assert r.returncode == 2
    assert "is not a model folder" in r.stderr
    assert not (tmp_path / "checkpoints").exists()


@pytest.mark.parametrize("flag", ["--local_rank=1", "--local-rank=1"])
def test_deepspeed_launcher_local_rank_is_accepted(flag, monkeypatch):
    # `deepspeed --num_gpus N --module hgpo.train ...` appends --local_rank=<n> to every rank's
    # command line; it used to stop the run with "unrecognized arguments"
    monkeypatch.setenv("LOCAL_RANK", "")  # recorded, so the teardown restores the original
    monkeypatch.delenv("LOCAL_RANK")
    cfg, _ = parse_args([flag, "--preset", "tiny"])
    assert cfg.model == "tiny"
    assert os.environ["LOCAL_RANK"] == "1"


@pytest.mark.parametrize("env", ["alfworld", "webshop"])
@pytest.mark.parametrize(
    "estimator",
    ["grpo", "rloo", "stepwise", "gigpo", "oracle", "hgpo", "hgpo-nohog2", "hgpo-uniform"],
)
def test_reference_options_use_each_estimators_own_preset(estimator, env):
    from hgpo.config import reference_config

    cfg = resolve(
        preset="tiny",
        env=env,
        overrides={"estimator": estimator, "reference_options": True, "history_length": 3},
    )
    want = reference_config(estimator, env=env).replace(K=3, gamma=cfg.gamma)
    assert cfg.estimator_config() == want


def test_reference_options_rloo_is_not_hgpos_preset():
    # the bug this guards against: every estimator but gigpo got reference_config("hgpo"),
    # so rloo trained with population std and mean_std normalisation on ALFWorld
    est = resolve(
        preset="tiny", overrides={"estimator": "rloo", "reference_options": True}
    ).estimator_config()
    assert (est.norm, est.std) == ("mean", "sample")


def test_reference_options_without_a_preset_is_an_error(capsys):
    with pytest.raises(SystemExit):
        parse_args(["--preset", "tiny", "--estimator", "gae", "--reference-options"])
    err = capsys.readouterr().err
    assert "TrainConfig.reference_options: estimator 'gae' has no reference preset" in err


def test_reference_options_follow_the_benchmarks_reference_profile(capsys):
    from agentenvs.registry import benchmark
    from hgpo.config import REFERENCE_PROFILES

    for env in ("alfworld", "webshop"):  # each adapter names the verl-agent recipe it follows
        profile = benchmark(env).reference_profile
        assert profile in REFERENCE_PROFILES
        cfg = resolve(preset="tiny", env=env, overrides={"reference_options": True})
        assert cfg.estimator_config().norm == REFERENCE_PROFILES[profile]["norm"]
    assert benchmark("toy:keydoor:size=4").reference_profile is None
    with pytest.raises(SystemExit):
        parse_args(["--preset", "tiny", "--env", "toy:keydoor:size=4", "--reference-options"])
    err = capsys.readouterr().err
    assert "TrainConfig.reference_options: --env 'toy:keydoor:size=4' has no verl-agent" in err
