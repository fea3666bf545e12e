"""studies.closed_forms: the exact pieces against the exact solver, the --quick run, and bad
input stopped before any work."""

from __future__ import annotations

import json

import numpy as np
import pytest

import toyenvs
from studies import closed_forms as cfs
from studies.closed_forms_exact import expected_gradient, task_chain, weighted_q


def test_expected_gradient_of_the_exact_advantage_is_the_exact_gradient():
    env = toyenvs.make("tmaze", length=1)
    pol = toyenvs.TabularPolicy(env, K=2, init="random", seed=3)
    chains = [task_chain(env, pol, int(t)) for t in env.train_tasks]
    n = pol.n_contexts
    g = sum(
        expected_gradient(c, weighted_q(c, np.ones(len(c.rows)), np.zeros(len(c.rows))), n)
        for c in chains
    ) / len(chains)
    gt = toyenvs.exact_ground_truth(env, pol, gamma=1.0, tasks=env.train_tasks)
    np.testing.assert_allclose(g, gt.policy_gradient[:n], atol=1e-13)
    assert np.abs(g).max() > 0.01  # not a vacuous zero
    # success probability and the turns' survival from the same chain
    assert 0.0 < chains[0].success < 1.0
    assert chains[0].alive[0] == 1.0 and (np.diff(chains[0].alive) <= 1e-15).all()


def test_quick_run_writes_rows_with_verdicts(tmp_path, capsys):
    out = tmp_path / "cf"
    assert cfs.main(["--quick", "--out", str(out), "--no-progress", "--batches", "20"]) == 0
    rows = json.loads((out / "results.json").read_text())["rows"]
    assert {r["G"] for r in rows} == {2, 4}
    assert len(rows) == 2 * 8
    assert {r["holds"] for r in rows} <= {"holds", "does NOT hold", "too few events"}
    fix = [r for r in rows if r["quantity"].startswith("mtgrpo all_turns")]
    assert all(r["predicted"] == 0.0 for r in fix)
    own = [
        r
        for r in rows
        if "own_turns loo minus" in r["quantity"] and "predicted bias" in r["quantity"]
    ]
    assert all(r["predicted"] > 0 for r in own)  # the hidden per-turn reward's direction
    assert (out / "report.md").read_text().count("\n| tmaze |") == len(rows)
    assert "measured rows hold" in capsys.readouterr().out
    # the same settings again: refused without --fresh only when they differ
    assert cfs.main(["--quick", "--out", str(out), "--no-progress", "--batches", "20"]) == 0


@pytest.mark.parametrize(
    ("args", "msg"),
    [(["--batches", "5"], "--batches: must be an integer in 10..1000000, got 5"),
     (["--K", "9"], "--K: must be an integer in 0..6, got 9"),
     (["--group-sizes", "1"], "--group-sizes: must be integers in 2..256, got 1"),
     (["--stages", "1.5"], "--stages: must be 'untrained' or a number in (0, 1), got '1.5'"),
     (["--envs", "keydoor:size=99"], "--envs 'keydoor:size=99': size: must be an integer in 4..64, got 99")],
)  # fmt: skip
def test_bad_input_stops_before_any_work(tmp_path, monkeypatch, capsys, args, msg):
    monkeypatch.setattr(cfs, "run_study", lambda *a, **k: pytest.fail("ran"))
    with pytest.raises(SystemExit) as exc:
        cfs.main(["--out", str(tmp_path), *args])
    assert exc.value.code == 2
    assert msg in capsys.readouterr().err


def test_other_settings_in_the_folder_are_refused(tmp_path, capsys):
    out = str(tmp_path / "cf")
    assert cfs.main(["--quick", "--out", out, "--no-progress", "--batches", "10"]) == 0
    with pytest.raises(SystemExit):
        cfs.main(["--quick", "--out", out, "--no-progress", "--batches", "11"])
    assert "settings that differ: batches" in capsys.readouterr().err
