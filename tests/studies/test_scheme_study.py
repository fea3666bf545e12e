"""``python -m studies.bias_variance --scheme ...`` on a tiny setting, its budget interpolation
and its option checks."""

import json
import math

import pytest

from studies.bias_variance import main
from studies.scheme_study import budget_needed


def test_budget_needed_interpolates_between_the_bracketing_budgets():
    # MSE 4 at m = 0.5, 2 at m = 1, 1 at m = 2; target 1.5 lies halfway between m = 1 and 2
    assert budget_needed([0.5, 1.0, 2.0], [4.0, 2.0, 1.0], 1.5) == pytest.approx(1.5)
    assert budget_needed([0.5, 1.0, 2.0], [4.0, 2.0, 1.0], 5.0) == 0.5  # already there
    assert budget_needed([0.5, 1.0, 2.0], [4.0, 2.0, 1.0], 0.5) == math.inf  # never
    # a cosine: 0.2, 0.4, 0.8 reaches 0.6 halfway between m = 1 and m = 2
    assert budget_needed([0.5, 1.0, 2.0], [0.2, 0.4, 0.8], 0.6, True) == pytest.approx(1.5)


def test_scheme_study_writes_rows_and_is_reproducible(tmp_path, capsys):
    args = ["--envs", "keydoor:size=4", "--K", "2", "--stages", "untrained", "--batches", "10",
            "--groups", "3", "--workers", "1", "--no-progress", "--scheme", "independent",
            "branch:singleton", "tree:2", "--budgets", "0.5", "1"]  # fmt: skip
    assert main([*args, "--out", str(tmp_path / "a")]) == 0
    out = capsys.readouterr().out
    assert "branch:singleton" in out and "budget needed" in out
    assert (tmp_path / "a" / "schemes.png").stat().st_size > 0
    main([*args, "--out", str(tmp_path / "b")])
    a = json.loads((tmp_path / "a" / "schemes.json").read_text())
    b = json.loads((tmp_path / "b" / "schemes.json").read_text())
    assert a == b
    rows = a["rows"]
    # the reference, then 3 schemes x 2 budgets, each for HGPO and GiGPO
    assert len(rows) == 2 * (1 + 3 * 2)
    for r in rows:
        assert 0.0 <= r["util_K"] <= 1.0
        assert r["mse"] == pytest.approx(r["bias2"] + r["variance"])
    half = [r for r in rows if r["budget"] == 0.5]
    full = [r for r in rows if r["budget"] == 1.0 and not r["scheme"].startswith("independent N")]
    assert all(h["steps_per_group"] < f["steps_per_group"] for h, f in zip(half, full, strict=True))


@pytest.mark.parametrize(
    ("extra", "match"),
    [
        (["--scheme", "branch:deep"], "scheme: must be one of"),
        (["--scheme", "tree:40"], "depth: must be an integer in 1..19"),
        (["--scheme", "branch:hard", "--branch-budget", "0"], "--branch-budget: must be"),
        (["--scheme", "branch:hard", "--branch-budget", "1.5"], "--branch-budget: must be"),
        (["--scheme", "branch:hard", "--budgets", "0.5", "2"], "--budgets: must be ascending"),
        (["--scheme", "branch:hard", "--budgets", "-1", "1"], "--budgets: must be"),
    ],
)
def test_bad_scheme_options_fail_before_work(extra, match, tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["--envs", "keydoor:size=4", "--out", str(tmp_path / "x"), *extra])
    assert match in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_scheme_study_shows_progress_and_refuses_a_network_policy(tmp_path, capsys):
    """Issue 27 item 14: a --scheme study counts its cells on stderr (it printed nothing for
    minutes); --policy is refused there (the comparison plays the tabular policy)."""
    args = ["--envs", "keydoor:size=4", "--K", "2", "--stages", "untrained", "--batches", "10",
            "--groups", "2", "--workers", "1", "--scheme", "branch:singleton", "--budgets", "1"]  # fmt: skip
    assert main([*args, "--out", str(tmp_path / "a")]) == 0
    err = capsys.readouterr().err
    assert "cells: 100%" in err and "1/1" in err, err
    with pytest.raises(SystemExit):
        main([*args, "--policy", "mlp", "--out", str(tmp_path / "b")])
    assert "--policy: must be tabular with --scheme" in capsys.readouterr().err
