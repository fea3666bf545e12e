"""Warm start on expert trajectories, and the curve plot."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from tests.train.conftest import ROOT, run_env


def test_warmstart_fits_expert_responses(tmp_path):
    out = tmp_path / "warm"
    cmd = [
        sys.executable,
        "-m",
        "hgpo.train.warmstart",
        "--env",
        "webshop",
        "--tasks",
        "2",
        "--epochs",
        "3",
        "--out",
        str(out),
        "--override",
        "max_steps=15,max_prompt_tokens=1024",
    ]
    r = subprocess.run(cmd, cwd=ROOT, env=run_env(), capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    rep = json.loads((out / "warmstart.json").read_text())
    assert rep["expert_success"] == 1.0  # the replayed expert wins every task
    assert rep["samples"] >= 6
    assert rep["epoch_losses"][-1] < rep["epoch_losses"][0]
    assert (out / "model" / "config.json").exists() and (out / "model" / "tokenizer.json").exists()


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--lr", "nan"], "--lr: must be a finite number > 0.0, got nan"),
        (["--epochs", "0"], "--epochs: must be an integer >= 1, got 0"),
        (["--batch", "0"], "--batch: must be an integer >= 1, got 0"),
        (["--micro-batch", "9"], "--micro-batch: must be an integer in 0..8, got 9"),
        (
            ["--save-epochs", "2,x"],
            "--save-epochs: must be comma-separated epochs in 1..3, got 'x'",
        ),
        (["--tasks", "100000"], "--tasks: must be an integer in 1..60 (the training tasks), got"),
        (["--out", "/proc/hgpo/warm"], "--out: cannot write to '/proc/hgpo/warm'"),
        (["--model", "/no/model"], "--model: '/no/model' is not a model folder (no config.json"),
    ],
)
def test_bad_flags_stop_before_any_work(tmp_path, flags, message, capsys):
    from hgpo.train.warmstart import main

    with pytest.raises(SystemExit) as exc:
        main(["--epochs", "3", "--out", str(tmp_path / "w"), *flags])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("python -m hgpo.train.warmstart: error: ") and message in err
    assert not (tmp_path / "w" / "model").exists()


def test_micro_batches_sum_to_the_whole_batch_gradient(tmp_path):
    """--micro-batch: one-sample forwards, gradients summed, give the whole batch's loss and
    gradient (to float32 rounding), so the optimiser takes the same step with less memory."""
    import torch
    from transformers import AutoModelForCausalLM

    from hgpo.train.warmstart import _backward, main

    out = tmp_path / "w"
    argv = ["--env", "toy:tmaze:length=1", "--tasks", "2", "--epochs", "1", "--batch", "4",
            "--micro-batch", "1", "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    rep = json.loads((out / "warmstart.json").read_text())
    assert rep["samples"] == 6 and len(rep["epoch_losses"]) == 1
    model = AutoModelForCausalLM.from_pretrained(str(out / "init"), dtype=torch.float32)
    rng = torch.Generator().manual_seed(0)
    chunk = [(torch.randint(3, 60, (n,), generator=rng).tolist(),
              torch.randint(3, 60, (r,), generator=rng).tolist()) for n, r in ((9, 2), (5, 6), (12, 3))]  # fmt: skip
    grads, losses = [], []
    for micro in (3, 1, 2):
        model.zero_grad()
        losses.append(_backward(model, chunk, 0, micro))
        grads.append(
            torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
        )
    for g, loss in zip(grads[1:], losses[1:], strict=True):
        assert loss == pytest.approx(losses[0], rel=1e-5)
        assert torch.allclose(g, grads[0], rtol=1e-4, atol=1e-6)
    assert grads[0].abs().max() > 1e-3
    model.zero_grad()  # a wrong normalisation (each micro-batch's own mean) is caught
    half = _backward(model, chunk[:1], 0, 1) + _backward(model, chunk[1:], 0, 2)
    assert half != pytest.approx(losses[0], rel=1e-3)


def test_a_non_finite_loss_saves_nothing(tmp_path):
    """lr = 1e30 blows the tiny model up in the first steps: exit 1, no model folder."""
    out = tmp_path / "warm"
    cmd = [sys.executable, "-m", "hgpo.train.warmstart", "--env", "webshop", "--tasks", "2",
           "--epochs", "3", "--lr", "1e30", "--save-epochs", "1,2,3", "--out", str(out),
           "--override", "max_steps=15,max_prompt_tokens=1024"]  # fmt: skip
    r = subprocess.run(cmd, cwd=ROOT, env=run_env(), capture_output=True, text=True, timeout=600)
    assert r.returncode == 1, r.stderr[-3000:]
    assert "the loss is" in r.stderr.strip().splitlines()[-1]
    assert not (out / "model").exists() and not list(out.glob("model_e*"))


def test_plot_writes_a_png(tmp_path):
    from hgpo.train.plot import plot

    (tmp_path / "metrics.jsonl").write_text(
        "".join(
            json.dumps({"iteration": i, "success_rate": i / 4, "kl": 0.0}) + "\n" for i in (1, 2)
        )
    )
    assert plot([str(tmp_path)]).stat().st_size > 0


def test_plot_panels_include_validation_metrics(tmp_path):
    from hgpo.train.plot import plot

    rows = [{"iteration": i, "success_rate": i / 4} for i in (1, 2, 3, 4)]
    rows[1]["val/valid_seen/success"] = 0.5  # validation logged at iterations 2 and 4 only
    rows[3]["val/valid_seen/success"] = 0.25
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "v.png"
    assert plot([str(tmp_path)], str(out), ["success_rate", "val/valid_seen/success"]) == out
    assert out.stat().st_size > 0
    with pytest.raises(ValueError, match="'val/valid_unseen/success'"):
        plot([str(tmp_path)], str(out), ["val/valid_unseen/success"])
    with pytest.raises(ValueError, match="at least one metric"):
        plot([str(tmp_path)], str(out), [])


def test_plot_names_a_folder_without_metrics_and_creates_nothing(tmp_path, capsys):
    from hgpo.train.plot import main

    with pytest.raises(SystemExit) as e:
        main([str(tmp_path / "no_run")])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"error: '{tmp_path / 'no_run'}' has no readable metrics.jsonl" in err
    assert not (tmp_path / "no_run").exists()


def test_read_metrics_drops_a_line_cut_by_a_kill_and_names_a_bad_one(tmp_path):
    from hgpo.train.run_metrics import read_metrics

    good = json.dumps({"iteration": 1, "success_rate": 0.5})
    (tmp_path / "metrics.jsonl").write_text(good + "\n" + '{"iteration": 2, "succ')
    assert read_metrics(tmp_path) == [{"iteration": 1, "success_rate": 0.5}]
    (tmp_path / "metrics.jsonl").write_text(good + "\n" + good)  # whole, but no newline: kept
    assert len(read_metrics(tmp_path)) == 2
    (tmp_path / "metrics.jsonl").write_text("[1, 2]\n" + good + "\n")
    with pytest.raises(ValueError, match=r"metrics.jsonl: line 1 is not a JSON object: '\[1, 2\]'"):
        read_metrics(tmp_path)


def test_toy_expert_is_the_shortest_plan():
    from agentenvs.adapters.toy_bench import expert_plans
    from hgpo.train.train_config import resolve

    cfg = resolve("toy:tmaze:length=1", "tiny")
    assert expert_plans(cfg, [0, 1]) == [
        ["forward", "forward", "up"],
        ["forward", "forward", "down"],
    ]
    cfg = resolve("toy:keydoor:size=4", "tiny")
    import toyenvs

    env = toyenvs.make("keydoor", size=4)
    for t, plan in enumerate(expert_plans(cfg, [0, 1, 2])):
        r, c, _ = (int(x) for x in re.findall(r"\d+", env.state_names[env.train_tasks[t]]))
        assert plan.count("pickup") == 1 and len(plan) == (3 - r) + c + 1 + 2 * 3


def test_eval_counts_before_and_after_a_tiny_warm_start(tmp_path, capsys):
    """--eval-tasks: the tiny model never writes the format before, mostly does after; the
    table's counts are the report's, with 95% Wilson intervals."""
    from hgpo.train.warmstart import main

    out = tmp_path / "w"
    argv = ["--env", "toy:tmaze:length=1", "--tasks", "2", "--epochs", "60", "--lr", "5e-3",
            "--batch", "6", "--out", str(out), "--eval-tasks", "2", "--eval-repeats", "4",
            "--override", "max_steps=4,max_response_tokens=48"]  # fmt: skip
    assert main(argv) == 0
    rep = json.loads((out / "warmstart.json").read_text())
    before, after = rep["eval"]["before"], rep["eval"]["after"]
    assert before["episodes"] == after["episodes"] == 8 and before["split"] == "train"
    assert before["steps"] == 32 and before["valid_steps"] == 0 and before["won"] == 0
    assert after["valid_steps"] / after["steps"] > 0.5 and after["won"] >= 4
    assert before["formatted_steps"] == 0 and after["steps"] >= after["formatted_steps"]
    assert after["formatted_steps"] >= after["valid_steps"]  # valid: formatted and possible
    z2 = 1.959964**2  # Wilson's upper bound of 0 of n: z^2 / (n + z^2)
    assert before["success_ci95"][1] == pytest.approx(z2 / (8 + z2), abs=1e-5)
    assert (
        f"| before | 8 | 0/8 = 0.00 [0.00, {z2 / (8 + z2):.2f}] | 0/32 = 0.00" in rep["eval_table"]
    )
    assert rep["eval_table"] in capsys.readouterr().out
    assert rep["machine_end"]["peak_rss_gib"] > 0
    for counts in (before, after):  # each task's first episode, step by step, as played
        shown = counts["transcripts"]
        assert sorted({t["task"] for t in shown}) == [0, 1]
        for task in (0, 1):
            steps = [t for t in shown if t["task"] == task]
            assert [t["step"] for t in steps] == list(range(len(steps))) and 1 <= len(steps) <= 4
            assert len({t["won"] for t in steps}) == 1
    assert not any(t["valid"] for t in before["transcripts"])
    valid = [t for t in after["transcripts"] if t["valid"]]
    assert valid and all(f"<action>{t['action']}</action>" in t["response"] for t in valid)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--env", "toy:tmaze:length=1,slip=0.1"], "--env: must be a toy spec without slip"),
        (["--env", "nope"], "--env: must be one of 'alfworld'"),
        (["--env", "toy:tmaze:length=1", "--eval-tasks", "3"], "--eval-tasks: must be an integer in 0..2 (the train tasks), got 3"),
        (["--env", "toy:tmaze:length=1", "--eval-split", "x"], "--eval-split: must be one of heldout, train, got 'x'"),
        (["--eval-repeats", "0"], "--eval-repeats: must be an integer in 1..1024, got 0"),
    ],
)  # fmt: skip
def test_bad_eval_and_toy_flags_stop_before_any_work(tmp_path, flags, message, capsys):
    from hgpo.train.warmstart import main

    with pytest.raises(SystemExit) as exc:
        main(["--tasks", "1", "--out", str(tmp_path / "w"), *flags])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert message in err, err
    assert not (tmp_path / "w" / "model").exists()


def test_the_table_without_a_before_row_has_the_after_counts():
    from hgpo.train.warm_eval import EvalCounts, table, wilson

    after = EvalCounts("train", 2, 8, 6, 24, 20, 0, 3.0, formatted_steps=24)
    lines = table("toy:tmaze:length=1", None, after).splitlines()
    lo, hi = wilson(20, 24)
    assert len(lines) == 3 and "| after | 8 | 6/8 = 0.75 " in lines[2]
    assert f"20/24 = 0.83 [{lo:.2f}, {hi:.2f}] | 24/24 = 1.00 [0.86, 1.00] | 3 |" in lines[2]
    assert 0.6 < lo < 0.83 < hi < 1 and lines[0].count("|") == lines[2].count("|")
    assert "| - | 3 |" in table("x", None, EvalCounts("train", 2, 8, 6, 24, 20, 0, 3.0))
