"""Bad input to ``python -m hgpo.train``: a one-line error naming the fix, exit 2, before any
model is built; a non-finite loss stops the run before its checkpoint."""

from __future__ import annotations

import pytest

from hgpo.train import preflight
from hgpo.train.__main__ import main
from hgpo.train.run_metrics import read_metrics
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
        (  # the tiny model has 2 decoder layers
            ["--lora-rank", "4", "--lora-top-layers", "3"],
            "TrainConfig.lora_top_layers: must be in [1, 2] (the model's decoder layers) or 0 "
            "(every layer), got 3; lower --lora-top-layers",
        ),
        (  # the embeddings lie below every decoder layer
            ["--lora-rank", "4", "--lora-targets", "embed_tokens", "--lora-top-layers", "1"],
            "TrainConfig.lora_targets: 'embed_tokens' adapts no layer of the model in its last 1 "
            "decoder layers",
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


# --- issue 27 ------------------------------------------------------------------------------------
TRUTH8 = ["--env", "toy:keydoor:size=8", "--action-mode", "score", "--truth-every", "1",
          "--max-steps", "40"]  # fmt: skip


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        # item 10: bounded by the model and the machine, before any model is built
        (
            ["--lora-rank", "100000"],
            "TrainConfig.lora_rank: must be <= 64, the smallest in/out size of the adapted "
            "layers (model.layers.0.self_attn.q_proj: 64 x 64",
        ),
        (
            ["--lora-rank", "200", "--lora-targets", "q_proj,gate_proj", "--tiny-hidden", "128"],
            "TrainConfig.lora_rank: must be <= 128, the smallest in/out size of the adapted "
            "layers (model.layers.0.self_attn.q_proj: 128 x 128",
        ),
        (
            ["--group-size", "100000"],
            "TrainConfig.group_size: groups_per_iter / ranks x group_size = 200000 episodes at "
            "once on one rank, more than the 4096 one rank may hold",
        ),
        (
            ["--tiny-hidden", "1024", "--tiny-layers", "16"],
            "TrainConfig.tiny_hidden: the tiny model's 152,110,080 parameters (weights, "
            "gradients, AdamW state, reference: 20 bytes each in fp32) need about 2.8 GiB, this "
            "machine has 1.0 GiB available",
        ),
        (
            ["--max-prompt-tokens", "9000"],
            "TrainConfig.max_prompt_tokens: max_prompt_tokens + max_response_tokens = 9016 is "
            "more than the model's 8192 positions",
        ),
        (["--env-workers", "1000"], "TrainConfig.env_workers: must be <= 8 (4 processes per CPU"),
        (
            TRUTH8,
            "TrainConfig.truth_max_prompts=10000: a truth pass of 'toy:keydoor:size=8' with "
            "history_length=2 scores 45,341 prompts x 5 actions (a chain of 69,548 nodes), "
            "every 1 iterations; raise --truth-max-prompts",
        ),
        # issue 30: a chain over --truth-max-nodes, refused before the first iteration
        (
            [*TRUTH8, "--truth-max-nodes", "1000"],
            "TrainConfig.truth_max_nodes=1000: the reachable (t, hidden state, context) chain "
            "of 'toy:keydoor:size=8' with history_length=2 is larger (already 1,513 nodes by step 3 "
            "of its horizon 40); raise --truth-max-nodes",
        ),
    ],
)
def test_sizes_beyond_the_model_and_machine_are_refused(
    argv, needle, tmp_path, capsys, monkeypatch
):
    import hgpo.train.trainer as trainer

    monkeypatch.setattr(trainer, "train", lambda cfg: [])  # never train (the old code did)
    # 1 GiB, on any machine
    monkeypatch.setattr(preflight, "available_memory", lambda: 2**30, raising=False)
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    out = tmp_path / "run"
    env = [] if "--env" in argv else ["--env", "webshop"]
    assert main(["--preset", "tiny", *env, *argv, "--out-dir", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: " + needle), err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert not out.exists() or not any(out.iterdir())


def test_every_numeric_field_has_an_upper_bound_or_a_preflight_bound():
    import dataclasses

    from hgpo.train.train_config import _RULES, TrainConfig, _field_types

    unbounded = {  # coefficients: finite is their bound (no machine limit applies)
        "temperature", "lr", "critic_lr", "weight_decay", "dual_clip", "kl_coef",
        "entropy_coef", "grad_clip", "value_clip", "lora_alpha", "val_temperature",
    }  # fmt: skip
    for f in dataclasses.fields(TrainConfig):
        if _field_types()[f.name] in (int, float) and f.name not in unbounded:
            assert "hi" in _RULES.get(f.name, {}), f.name


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        # item 12: a flag the rest of the command makes do nothing
        (
            ["--branch-budget", "0.3"],
            "TrainConfig.branch_budget: --branch-budget 0.3 does nothing with "
            "rollout_scheme='independent'; give a branching --rollout-scheme",
        ),
        (
            ["--lora-targets", "q_proj"],
            "TrainConfig.lora_targets: --lora-targets q_proj does nothing with lora_rank=0 "
            "(LoRA off); give --lora-rank R (R > 0) or leave --lora-targets out",
        ),
        (
            ["--lora-top-layers", "1"],
            "TrainConfig.lora_top_layers: --lora-top-layers 1 does nothing with lora_rank=0 "
            "(LoRA off); give --lora-rank R (R > 0) or leave --lora-top-layers out",
        ),
        (["--fresh", "--resume"], "TrainConfig.fresh: --fresh removes the run that --resume"),
    ],
)
def test_flags_that_would_do_nothing_exit_2(argv, needle, capsys):
    with pytest.raises(SystemExit) as e:
        main(["--preset", "tiny", *argv, "--print-config"])
    assert e.value.code == 2
    assert needle in capsys.readouterr().err


def test_defaults_and_effective_flags_are_not_refused():
    from hgpo.train.train_config import parse_args, resolve

    resolve(preset="tiny")  # the default branch_budget and lora_targets are not "given"
    cfg, _ = parse_args(["--preset", "tiny", "--rollout-scheme", "branch:uniform",
                         "--branch-budget", "0.3", "--lora-rank", "4", "--lora-targets", "q_proj"])  # fmt: skip
    assert (cfg.branch_budget, cfg.lora_targets) == (0.3, "q_proj")
    lora = ["--lora-rank", "128", "--lora-targets", "q_proj,gate_proj", "--tiny-hidden", "128"]
    preflight.check_model_shapes(parse_args(["--preset", "tiny", *lora])[0])  # 128 = min(in, out)
    with pytest.raises(ValueError, match=r"TrainConfig\.lora_targets: --lora-targets q_proj does"):
        resolve(preset="tiny", overrides={"lora_targets": "q_proj"})


def _fake_run(out, **settings):
    """A run folder as the trainer leaves it after iteration 1 (config.json in the folder and
    in the checkpoint), without training."""
    from hgpo.train import checkpoint as ckpt
    from hgpo.train.train_config import resolve

    cfg = resolve(preset="tiny", env="webshop", overrides={"out_dir": str(out), **settings})
    cfg.save(out / "config.json")
    root = out / "checkpoints"
    tmp = ckpt.tmp_dir(root, 1)
    (tmp / "trainer_state.json").write_text('{"iteration": 1, "world_size": 1}\n')
    cfg.save(tmp / "config.json")
    ckpt.commit(root, tmp, 1, keep=2)
    (out / "metrics.jsonl").write_text('{"iteration": 1}\n')
    return cfg


@pytest.mark.parametrize(
    ("argv", "name", "was", "given"),
    [
        # item 9: the model's or the optimizer state's shapes
        (["--lora-rank", "8"], "lora_rank", "4", "8"),
        (["--lora-rank", "0"], "lora_rank", "4", "0"),
        (["--tiny-hidden", "128"], "tiny_hidden", "64", "128"),
        (["--lora-targets", "q_proj"], "lora_targets", "'all-linear'", "'q_proj'"),
        (["--lora-top-layers", "1"], "lora_top_layers", "0", "1"),
        (["--estimator", "gae"], "estimator", "'hgpo'", "'gae'"),
        (["--zero-stage", "2"], "zero_stage", "0", "2"),
        # what the run is: a resumed run keeps the settings it was made with
        (["--seed", "1"], "seed", "0", "1"),
        (["--group-size", "4"], "group_size", "2", "4"),
        (["--estimator", "grpo"], "estimator", "'hgpo'", "'grpo'"),
        (["--env", "alfworld"], "env", "'webshop'", "'alfworld'"),
    ],
)
def test_resume_refuses_a_changed_setting_before_writing(
    argv, name, was, given, tmp_path, capsys, monkeypatch
):
    import hgpo.train.trainer as trainer

    monkeypatch.setattr(trainer, "train", lambda cfg: [])  # the checks run in main, before it
    out = tmp_path / "run"
    out.mkdir()
    _fake_run(out, lora_rank=4)
    before = (out / "config.json").read_text()
    env = [] if "--env" in argv else ["--env", "webshop"]
    assert main(["--preset", "tiny", *env, "--out-dir", str(out), "--resume", *argv]) == 2
    err = capsys.readouterr().err
    flag = "--" + name.replace("_", "-")
    want = (
        f"error: TrainConfig.{name}: --resume with {flag} {given}, but "
        f"{out / 'checkpoints' / 'iter_000001'} was made with {was} ("
    )
    assert err.startswith(want), err
    assert f"resume without {flag}, or start a new run in another --out-dir" in err
    assert err.count("\n") == 1
    assert (out / "config.json").read_text() == before  # nothing rewritten


def test_resume_allows_and_records_schedule_and_length_changes(tmp_path, capsys, monkeypatch):
    import hgpo.train.trainer as trainer

    monkeypatch.setattr(trainer, "train", lambda cfg: [])
    out = tmp_path / "run"
    out.mkdir()
    _fake_run(out, lora_rank=4)
    args = ["--out-dir", str(out), "--resume", "--iterations", "5", "--lr", "0.001"]
    assert main(args) == 0
    err = capsys.readouterr().err
    assert (
        "note: --resume changes --iterations 2 -> 5, --lr 0.0001 -> 0.001 from the checkpoint's "
        f"settings (recorded in {out / 'resumes.jsonl'})"
    ) in err
    import dataclasses

    from hgpo.train.rundir import RESUME_ALLOWED, RESUME_SHAPES
    from hgpo.train.train_config import TrainConfig

    names = {f.name for f in dataclasses.fields(TrainConfig)}
    assert set(RESUME_ALLOWED) <= names and set(RESUME_SHAPES) <= names
    assert not set(RESUME_ALLOWED) & set(RESUME_SHAPES)
