"""Warm start on expert trajectories, and the curve plot."""

from __future__ import annotations

import json
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
