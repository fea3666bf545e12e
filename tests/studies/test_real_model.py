"""studies.real_model (learning with a real model, with intervals): bad flags are one line
before any run, the results folder is claimed by its settings, a finished run is read back and
never run again, a run's failure is one line, and the report's tests and intervals.

The pipeline tests put a stand-in trainer in place of ``python -m hgpo.train`` (a script that
writes the metrics a run with ``--truth-every`` writes) and skip the trainer's own checks of
the runs' settings, so they take seconds; one slow test runs the real trainer on the tiny
model."""

from __future__ import annotations

import json
import math
import sys
import textwrap
import time
import zlib
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from studies import real_model, real_model_run
from studies.real_model_report import paired_truth, truth_batches, welch_tests
from studies.real_model_settings import Study, train_argv

FAKE = textwrap.dedent(
    """
    import json, os, sys
    a = sys.argv[1:]
    val = lambda flag: a[a.index(flag) + 1]
    if os.environ.get("FAKE_FAIL"):
        print("error: TrainConfig.lr: must be a finite number > 0, got nan", file=sys.stderr)
        sys.exit(2)
    out, est = val("--out-dir"), val("--estimator")
    seed = int(out.rsplit("-s", 1)[1])  # (the seed's index: the folder is <estimator>-s<i>)
    os.makedirs(out, exist_ok=True)
    base = {"hgpo": 0.8, "gigpo": 0.5, "grpo": 0.2}[est] + 0.01 * seed
    truth = int(val("--truth-every")) > 0
    with open(os.path.join(out, "metrics.jsonl"), "a") as f:
        for it in range(1, int(val("--iterations")) + 1):
            row = {"iteration": it, "success_rate": base, "time/rollout": 1.0, "time/score": 0.5,
                   "time/update": 2.0, "time/truth": 3.0, "kl": 1e-4,
                   "invalid_rate": 0.5 - 0.1 * seed}
            for e, v in (("hgpo", 1.0), ("gigpo", 4.0), ("grpo", 2.0)) if truth else ():
                row.update({f"truth/{e}/bias2": 0.1 * v + 0.01 * it, f"truth/{e}/variance": v
                            + 0.1 * seed, f"truth/{e}/mse": 1.1 * v + 0.1 * seed,
                            f"truth/{e}/sign": 0.6, f"truth/{e}/grad_cos": 0.3,
                            f"truth/{e}/coverage": 0.4, "truth/J": base * it})
            f.write(json.dumps(row) + "\\n")
    """
)


@pytest.fixture
def fake_trainer(tmp_path, monkeypatch):
    """The stand-in trainer, and the runs' settings taken as they are (no trainer checks)."""
    script = tmp_path / "fake_train.py"
    script.write_text(FAKE)
    monkeypatch.setattr(real_model_run, "TRAIN", [sys.executable, str(script)])
    monkeypatch.setattr(real_model_run, "POLL_S", 0.05)

    def resolved(s, estimator):
        return {"model": "tiny", "estimator": estimator, "seed": 0, "lr": 1e-3, "lora_rank": 0,
                "groups_per_iter": s.groups_per_iter, "group_size": s.group_size,
                "iterations": s.iterations, "history_length": s.history_length,
                "max_steps": s.max_steps}  # fmt: skip

    monkeypatch.setattr(real_model, "_resolved", resolved)
    return script


def _argv(out: Path, *extra: str) -> list[str]:
    return ["--preset", "tiny", "--out", str(out), "--estimators", "hgpo", "grpo", "--seeds",
            "3", "--iterations", "2", *extra]  # fmt: skip


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--seeds", "0"], "--seeds: must be an integer in 1..1000, got 0"),
        (["--estimators", "nope"], "--estimators: must be one of"),
        (["--estimators", "hgpo", "hgpo"], "--estimators: must be distinct names"),
        (["--env", "nope"], "--env: must be one of 'alfworld', 'webshop'"),
        (
            ["--env", "alfworld", "--truth-every", "1"],
            "--truth-every: must be 0 (no exact truth: --env alfworld has none), got 1",
        ),
        (
            ["--action-mode", "generate", "--truth-every", "1"],
            "--truth-every: must be 0 with --action-mode generate",
        ),
        (["--action-mode", "free"], "--action-mode: must be one of 'score', 'generate'"),
        (["--env", "alfworld", "--max-steps", "0"], "--max-steps: must be an integer in 1..100000"),
        (["--override", "max_prompt_tokens"], "--override: must be FIELD=VALUE"),
        (["--override", "nope=1"], "--override: must be a TrainConfig field"),
        (
            ["--override", "lr=0.1"],
            "--override: must be a field the study does not set (lr: give --lr)",
        ),
        (["--override", "val_every=1"], "(val_every: fixed by the study)"),
        (
            ["--override", "max_prompt_tokens=9", "--override", "max_prompt_tokens=8"],
            "--override: must be each field once (max_prompt_tokens is given twice)",
        ),
        (
            ["--iterations", "3", "--truth-every", "4"],
            "--truth-every: must be an integer in 0..3, got 4",
        ),
        (["--max-steps", "2"], "--max-steps: must be an integer in 9..100000, got 2"),
        (["--lr", "nan"], "--lr: must be a finite number"),
        (["--mini-batch-size", "0"], "--mini-batch-size: must be an integer in 1..1048576, got 0"),
        (["--ppo-epochs", "101"], "--ppo-epochs: must be an integer in 1..100, got 101"),
        (["--threads", "0"], "--threads"),
        (["--preset", "alfworld-1.5b-k2"], "--preset: must be one of"),
        (["--run-timeout", "inf"], "--run-timeout"),
    ],
)
def test_a_bad_flag_is_one_line_before_anything_is_written(tmp_path, capsys, flags, says):
    out = tmp_path / "out"
    assert real_model.main(["--out", str(out), *flags]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and says in err[0], err
    assert not out.exists()


def test_runs_are_recorded_read_back_and_reported(tmp_path, fake_trainer, capsys):
    out = tmp_path / "out"
    assert real_model.main(_argv(out)) == 0
    err = capsys.readouterr().err
    assert "[1/6] hgpo-s0: iteration 2/2: success 0.80" in err
    rec = json.loads((out / "results" / "grpo-s2.json").read_text())
    # each estimator's runs have seeds of their own: independent runs
    assert rec["config"]["estimator"] == "grpo"
    assert rec["config"]["seed"] == zlib.crc32(b"grpo") % 1_000_000 + 2
    assert len(rec["rows"]) == 2 and rec["peak_rss_bytes"] > 0 and rec["cpu_s"] >= 0
    report = (out / "report.md").read_text()
    # hgpo 0.80-0.82 against grpo 0.20-0.22 over 3 seeds: Welch, Holm over 4 figures
    assert "hgpo > grpo (+0.600, significant, Holm p = " in report
    assert "| hgpo | 3 | 0.81 [" in report
    for name in ("learning.png", "truth.png", "runs.csv", "tests.csv", "truth.csv"):
        assert (out / name).stat().st_size > 0
    # the same command again: every run read back, no trainer started
    real_model_run.TRAIN[:] = [sys.executable, "-c", "raise SystemExit(3)"]
    assert real_model.main(_argv(out)) == 0
    assert capsys.readouterr().err.count("finished earlier, read back") == 6
    # other settings: refused, naming the setting; --fresh replaces
    assert real_model.main(_argv(out, "--group-size", "4")) == 2
    assert "settings that differ: group_size" in capsys.readouterr().err


def test_a_study_without_truth_alfworld_generate(tmp_path, fake_trainer, capsys):
    out = tmp_path / "out"
    flags = [
        "--env",
        "alfworld",
        "--action-mode",
        "generate",
        "--override",
        "max_prompt_tokens=900",
    ]
    assert real_model.main(_argv(out, *flags)) == 0
    argv = train_argv(real_model.parse(_argv(out, *flags)), "hgpo", 0)
    assert "--truth-every" in argv and argv[argv.index("--truth-every") + 1] == "0"  # (default)
    assert "--max-prompt-tokens=900" in argv and "--max-steps" not in argv  # (the preset's)
    report = (out / "report.md").read_text()
    assert "no exact truth: --env alfworld has none" in report
    assert "exact J" not in report and "## The exact truth" not in report
    # the valid-action rate: 1 - invalid_rate = 0.5, 0.6, 0.7 over the 3 seeds
    assert "| hgpo | 3 | 0.81 [0.785, 0.835] | 0.81 [0.785, 0.835] | 0.6 [0.352, 0.848] |" in report
    tests = (out / "tests.csv").read_text().splitlines()
    assert len(tests) == 3 and "Holm over 2 tests" in report  # final and AUC only
    assert not (out / "truth.png").exists() and not (out / "truth.csv").exists()
    assert (out / "learning.png").stat().st_size > 0
    assert "valid_rate" in (out / "curves.csv").read_text().splitlines()[0]
    # other overrides: refused (the overrides are kept in settings.json)
    capsys.readouterr()
    again = [*flags[:-1], "max_prompt_tokens=800"]
    assert real_model.main(_argv(out, *again)) == 2
    assert "settings that differ: overrides" in capsys.readouterr().err


def test_a_failed_run_and_a_record_of_other_settings_are_one_line(tmp_path, fake_trainer, capsys,
                                                                  monkeypatch):  # fmt: skip
    out = tmp_path / "out"
    monkeypatch.setenv("FAKE_FAIL", "1")
    assert real_model.main(_argv(out)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: run hgpo-s0: TrainConfig.lr: must be a finite number")
    monkeypatch.delenv("FAKE_FAIL")
    assert real_model.main(_argv(out)) == 0
    path = out / "results" / "hgpo-s1.json"
    rec = json.loads(path.read_text())
    rec["config"]["lr"] = 0.5  # (a record edited by hand, or made by other code)
    path.write_text(json.dumps(rec))
    capsys.readouterr()
    assert real_model.main(_argv(out)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "hgpo-s1.json was made with other settings (lr); rerun with --fresh" in err[-1]


def _fig(est: str, seed: int, final: float) -> dict:
    return {"estimator": est, "seed": seed, "final": final, "auc": final, "J_last": final,
            "J_change": math.nan}  # fmt: skip


def test_welch_holm_and_what_is_untested():
    figs = [_fig("a", s, 0.8 + 0.01 * s) for s in range(3)]
    figs += [_fig("b", s, 0.2 + 0.02 * s) for s in range(3)]
    figs += [_fig("c", 0, 0.5)]  # one seed: untested against anyone
    tests = {(t["figure"], t["a"], t["b"]): t for t in welch_tests(figs, ["a", "b", "c"])}
    t = tests[("final", "a", "b")]
    from scipy import stats

    p = stats.ttest_ind([0.8, 0.81, 0.82], [0.2, 0.22, 0.24], equal_var=False).pvalue
    tested = 3  # final, auc, J_last of a - b (J_change has no values; c has one seed)
    assert t["p"] == pytest.approx(p) and t["p_holm"] == pytest.approx(min(1, tested * p))
    assert t["text"].startswith("a > b (+0.590, significant, Holm p = ")
    assert math.isnan(tests[("final", "a", "c")]["p_holm"])
    assert tests[("final", "a", "c")]["text"] == "a > c (+0.310, no test)"
    assert math.isnan(tests[("J_change", "a", "b")]["p_holm"])


def test_truth_batches_are_aligned_and_paired():
    rows = [{"iteration": 1, "truth/J": 1.0, "truth/x/mse": 1.0, "truth/y/mse": 3.0},
            {"iteration": 2, "success_rate": 0.5},  # no truth this iteration
            {"iteration": 3, "truth/J": 1.0, "truth/x/mse": 2.0, "truth/y/mse": 5.0},
            {"iteration": 4, "truth/J": 1.0, "truth/x/mse": 2.0}]  # fmt: skip
    b = truth_batches({("x", 0): {"rows": rows}})
    np.testing.assert_array_equal(b["x"]["mse"], [1.0, 2.0, 2.0])
    np.testing.assert_array_equal(b["y"]["mse"], [3.0, 5.0, np.nan])
    (mse,) = [t for t in paired_truth(b, ["x", "y"]) if t["metric"] == "mse"]
    assert mse["n"] == 2 and mse["diff"] == pytest.approx(-2.5)  # pairs (1-3, 2-5) only


@pytest.mark.slow
def test_the_real_trainer_on_the_tiny_model(tmp_path, capsys):
    out = tmp_path / "out"
    argv = ["--preset", "tiny", "--out", str(out), "--estimators", "hgpo", "--seeds", "1",
            "--iterations", "1", "--groups-per-iter", "3", "--group-size", "2"]  # fmt: skip
    assert real_model.main(argv) == 0, capsys.readouterr().err
    rec = json.loads((out / "results" / "hgpo-s0.json").read_text())
    (row,) = rec["rows"]
    for key in ("success_rate", "truth/J", "truth/hgpo/bias2", "truth/gigpo/variance",
                "truth/grpo/coverage", "time/rollout", "time/truth"):  # fmt: skip
        assert key in row, key
    assert 0.2 < rec["peak_rss_bytes"] / 2**30 < 8
    assert "| hgpo * |" in (out / "report.md").read_text()


@pytest.mark.slow
def test_the_real_trainer_on_alfworld_in_generate_mode_without_truth(tmp_path, capsys):
    pytest.importorskip("alfworld", reason="ALFWorld needs the alfworld package (extra [alfworld])")
    pytest.importorskip("textworld", reason="ALFWorld needs textworld (installed with alfworld)")
    games = Path(__file__).resolve().parents[1] / "agentenvs" / "data" / "alfworld_games"
    out = tmp_path / "out"
    argv = ["--preset", "tiny", "--out", str(out), "--env", "alfworld", "--action-mode",
            "generate", "--truth-every", "0", "--estimators", "hgpo", "--seeds", "1",
            "--iterations", "1", "--groups-per-iter", "2", "--group-size", "2",
            "--history-length", "1", "--override", f"alfworld_games_dir={games}"]  # fmt: skip
    assert real_model.main(argv) == 0, capsys.readouterr().err
    rec = json.loads((out / "results" / "hgpo-s0.json").read_text())
    (row,) = rec["rows"]
    assert row["n_trajectories"] == 4 and 0 <= row["invalid_rate"] <= 1
    assert not any(k.startswith("truth/") for k in row)
    assert rec["config"]["action_mode"] == "generate" and rec["config"][
        "alfworld_games_dir"
    ] == str(games)
    assert rec["config"]["max_steps"] == 3  # (the tiny preset's)
    report = (out / "report.md").read_text()
    assert "no exact truth: --env alfworld has none" in report and "valid-action rate" in report
    assert not (out / "truth.png").exists()


def test_a_run_past_its_timeout_is_stopped_in_one_line(tmp_path, fake_trainer, capsys):
    real_model_run.TRAIN[:] = [sys.executable, "-c", "import time; time.sleep(120)"]
    t0 = time.monotonic()
    assert real_model.main([*_argv(tmp_path / "out"), "--run-timeout", "1"]) == 1
    assert time.monotonic() - t0 < 60  # (stopped, not waited for)
    err = capsys.readouterr().err.strip().splitlines()
    assert "error: run hgpo-s0 ran past --run-timeout; stopped after 1 s" in err[-1]


def test_the_runs_arguments(tmp_path):
    s = Study(tmp_path, "smol-cpu", "toy:tmaze:length=0", ("hgpo",), 1, 3, 2, 4, 8, 2, 6, None,
              "runs/warm/model", 1, 60.0, False, {})  # fmt: skip
    argv = train_argv(s, "hgpo", 1)
    flags = dict(zip(argv[::2], argv[1::2], strict=False))
    assert flags["--model"] == "runs/warm/model" and flags["--truth-every"] == "2"
    assert flags["--seed"] == str(zlib.crc32(b"hgpo") % 1_000_000 + 1)
    assert flags["--out-dir"] == str(tmp_path / "runs" / "hgpo-s1") and argv[-1] == "--resume"
    assert "--lr" not in argv  # (the preset's)
    assert "--mini-batch-size" not in argv and "--ppo-epochs" not in argv
    s = replace(s, lr=1e-4, mini_batch_size=8, ppo_epochs=2)
    flags = dict(zip(*[iter(train_argv(s, "hgpo", 1))] * 2, strict=False))
    assert (flags["--lr"], flags["--mini-batch-size"], flags["--ppo-epochs"]) == (
        "0.0001",
        "8",
        "2",
    )
