"""studies.compare end to end on tiny settings: the folder, a user's estimator as one more row
(registered in this process, or an entry point of an installed package), resume, the refusal
of another run's folder, bad input before any work, and the pooling arithmetic."""

from __future__ import annotations

import csv
import json
import math
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import hgpo
from studies import bias_variance as BV
from studies import compare_report as R
from studies import compare_study as C
from studies import train_toy as TT
from studies.compare_report import cell_diff, cell_figure, llm_diff

ROOT = Path(__file__).resolve().parents[2]
TINY_CELLS = dict(envs=["tmaze:length=1"], Ks=[1], stages=["untrained"], n_batches=10, groups=4)
"""The bias/variance cells of these tests (in place of the study's --quick cells)."""
TINY = ["--quick", "--train-envs", "tmaze:length=1", "--seeds", "2", "--iterations", "2",
        "--workers", "1", "--no-progress"]  # fmt: skip


@pytest.fixture
def tiny(monkeypatch):
    monkeypatch.setattr(BV, "QUICK", TINY_CELLS)


@pytest.fixture
def mine():
    """A user's estimator registered in this process; it reads entropy and observations."""

    def fn(batch, config, values=None, entropy=None, observations=None):
        assert len(observations) == batch.n_steps and isinstance(observations[0], str)
        R = hgpo.step_returns(batch, config)
        return R - R.mean() + 0.01 * (entropy - entropy.mean())

    hgpo.register_estimator("mine", fn, reads=("entropy", "observations"))
    yield "mine"
    hgpo.unregister_estimator("mine")


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open() as f:
        return list(csv.DictReader(f))


def test_a_users_estimator_is_one_more_row_and_a_rerun_resumes(tmp_path, tiny, mine, monkeypatch,
                                                                capsys):  # fmt: skip
    out = tmp_path / "cmp"
    args = [*TINY, "--estimators", "grpo", "hgpo", "gae", "mine", "--out", str(out)]
    assert C.main(args) == 0
    printed = capsys.readouterr().out
    assert "Summary" in printed and "wrote" in printed and "mine" in printed
    for f in ("table.csv", "table.md", "diffs.csv", "tests.csv", "results.json", "report.md",
              "metrics.png", "diffs.png", "settings.json"):  # fmt: skip
        assert (out / f).stat().st_size > 0, f
    table = _rows(out / "table.csv")
    assert [(r["policy"], r["estimator"]) for r in table] == [
        ("tabular", e) for e in ("grpo", "hgpo", "gae", "mine")]  # fmt: skip
    row = table[3]
    assert row["origin"] == "register_estimator" and row["reads"] == "entropy observations"
    for col in ("bias2", "variance", "mse", "sign", "grad_cos", "auc"):
        assert math.isfinite(float(row[col])), col
    assert math.isfinite(float(row["auc_p_holm"]))  # Welch + Holm against hgpo
    # the user's estimator is a row of both sub-studies too
    bv = _rows(out / "bias_variance" / "tabular" / "results.csv")
    assert any(r["estimator"] == "mine" for r in bv)
    assert {r["setting"] for r in _rows(out / "train_toy" / "tabular" / "final.csv")} == {
        "grpo", "hgpo", "gae", "mine"}  # fmt: skip
    report = (out / "report.md").read_text()
    assert report.startswith("# Every estimator compared") and "## Summary" in report
    assert "mine reads entropy" in report and "gae reads values" in report
    settings = json.loads((out / "settings.json").read_text())
    assert settings["study"] == "compare"
    assert settings["settings"]["estimators"] == ["grpo", "hgpo", "gae", "mine"]
    # the same command again: every cell and run is read back, nothing runs, same table
    ran: list = []
    monkeypatch.setattr(BV, "run_cell", lambda *a: ran.append(a) or pytest.fail("a cell ran"))
    monkeypatch.setattr(TT, "run_one", lambda *a: ran.append(a) or pytest.fail("a run ran"))
    before = (out / "table.csv").read_bytes()
    assert C.main(args) == 0 and ran == []
    assert (out / "table.csv").read_bytes() == before
    # other settings in this folder are refused before any work; --fresh would replace it
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        C.main([*args, "--seeds", "3"])
    assert e.value.code == 2 and ran == []
    err = capsys.readouterr().err
    assert "holds the results of another run (settings that differ: seeds)" in err
    assert "give another --out, or --fresh to replace them" in err
    kw = dict(estimators=("grpo", "hgpo", "gae", "mine"), quick=True, policies=("tabular",),
              seeds=3, iterations=2, train_envs=("tmaze:length=1",), workers=1, out=str(out))  # fmt: skip
    C.check_config(C.CompareConfig(**kw), fresh=True)
    # the user's estimator edited (issue 38): its cell and runs are recomputed, not read back
    hgpo.unregister_estimator("mine")
    hgpo.register_estimator("mine", _mine_edited, reads=("entropy", "observations"))
    calls: list = []
    monkeypatch.setattr(BV, "run_cell", lambda *a: calls.append("cell") or BV_RUN_CELL(*a))
    monkeypatch.setattr(TT, "run_one", lambda *a: calls.append(a[1]["setting"]) or TT_RUN_ONE(*a))
    assert C.main(args) == 0
    assert sorted(calls) == ["cell", "mine", "mine"]  # 1 cell, 2 seeds x 1 env of mine
    err = capsys.readouterr().err
    assert "were made by other code of estimator(s) mine" in err and "recomputing them" in err
    assert (out / "table.csv").read_bytes() != before


BV_RUN_CELL, TT_RUN_ONE = BV.run_cell, TT.run_one


def _mine_edited(batch, config, values=None, entropy=None, observations=None):
    R = hgpo.step_returns(batch, config)
    return 2.0 * (R - R.mean()) + 0.01 * (entropy - entropy.mean())


def test_cached_cells_are_keyed_by_the_estimators_code(tmp_path, capsys):
    """Issue 38: a cell made by other code of an estimator (or by unrecorded code) is deleted
    and recomputed; a cell without it is kept; the LLM runs are refused."""
    from studies import compare_cache as K

    def v1(batch, config, values=None):
        return hgpo.step_returns(batch, config)

    def v2(batch, config, values=None):
        return -hgpo.step_returns(batch, config)

    cells = tmp_path / "bv" / "cells"
    cells.mkdir(parents=True)
    for name, ests in (("a", ["grpo", "edited"]), ("b", ["grpo"])):
        (cells / f"{name}.json").write_text(json.dumps({"rows": [{"estimator": e} for e in ests]}))
    hgpo.register_estimator("edited", v1)
    try:
        code1 = K.estimator_code("edited")
        # no record of the code that made them: every cell with a compared estimator goes
        assert K.drop_stale(tmp_path / "bv", "cells", ("grpo", "edited"), K.cell_estimators) == 2
        assert (
            "by unrecorded code (a folder from before the record) of estimator(s) edited, "
            "grpo: recomputing them" in capsys.readouterr().err
        )
        for name, ests in (("a", ["grpo", "edited"]), ("b", ["grpo"])):
            (cells / f"{name}.json").write_text(json.dumps({"rows": [{"estimator": e}
                                                                     for e in ests]}))  # fmt: skip
        assert K.drop_stale(tmp_path / "bv", "cells", ("grpo", "edited"), K.cell_estimators) == 0
        hgpo.unregister_estimator("edited")
        hgpo.register_estimator("edited", v2)
        assert K.estimator_code("edited") != code1
        assert K.drop_stale(tmp_path / "bv", "cells", ("grpo", "edited"), K.cell_estimators) == 1
        assert sorted(p.name for p in cells.iterdir()) == ["b.json"]
        assert "other code of estimator(s) edited" in capsys.readouterr().err
        saved = json.loads((tmp_path / "bv" / K.MANIFEST).read_text())
        assert saved["edited"] == K.estimator_code("edited")
        # LLM runs made by unrecorded code are refused before any work
        (tmp_path / "llm" / "hgpo-s0").mkdir(parents=True)
        (tmp_path / "llm" / "hgpo-s0" / "metrics.jsonl").write_text("")
        with pytest.raises(ValueError, match=r"--llm: the LLM runs in .* were made by other "
                           r"\(or unrecorded\) code of estimator\(s\) edited; give --fresh"):  # fmt: skip
            K.check_llm_code(tmp_path / "llm", ("edited",), fresh=False)
        K.record_llm_code(tmp_path / "llm", ("edited",))
        K.check_llm_code(tmp_path / "llm", ("edited",), fresh=False)
    finally:
        hgpo.unregister_estimator("edited")


def test_a_folder_of_another_study_is_refused(tmp_path, capsys):
    (tmp_path / "bv").mkdir()
    (tmp_path / "bv" / "settings.json").write_text('{"study": "bias_variance", "settings": {}}')
    with pytest.raises(SystemExit):
        C.main([*TINY, "--out", str(tmp_path / "bv")])
    assert "holds the results of another run (not a compare run)" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--estimators", "grpo", "nope"], "--estimators: unknown estimator 'nope'; registered "
         "estimators: grpo, rloo, stepwise, gigpo, oracle, hgpo"),
        (["--baseline", "nope"], "--baseline: unknown estimator 'nope'; registered estimators: "),
        (["--estimators", "grpo", "rloo"], "--baseline: must be one of the estimators compared "
         "(grpo, rloo), got 'hgpo'"),
        (["--estimators", "hgpo"], "--estimators: must be at least two estimators"),
        (["--estimators", "hgpo", "grpo", "hgpo"], "--estimators: must be distinct names"),
        (["--seeds", "1"], "--seeds: must be an integer in 2..64, got 1"),
        (["--iterations", "0"], "--iterations: must be"),
        (["--llm-seeds", "0"], "--llm-seeds: must be"),
        (["--workers", "0"], "--workers: must be"),
        (["--cell-timeout", "0"], "--cell-timeout: must be"),
        (["--cell-timeout", "inf"], "--cell-timeout: must be"),
        (["--policies", "cnn"], "--policies: must be tabular, mlp or transformer, got 'cnn'"),
        (["--policies", "mlp", "mlp"], "--policies: must be distinct policy kinds"),
        (["--train-envs", "maze"], "--train-envs 'maze': "),
        (["--llm", "--llm-env", "alfworld"], "--llm-env: must be 'toy:FAMILY:param=value,...'"),
    ],
)  # fmt: skip
def test_bad_input_is_a_named_error_before_any_work(tmp_path, monkeypatch, capsys, argv, needle):
    monkeypatch.setattr(C, "run_compare", lambda *a, **k: pytest.fail("work started"))
    out = tmp_path / "never"
    with pytest.raises(SystemExit) as e:
        C.main([*argv, "--out", str(out)])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert needle in err, err
    assert not (out / "settings.json").exists()


def test_an_unwritable_out_is_refused_before_any_work(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(C, "run_compare", lambda *a, **k: pytest.fail("work started"))
    (tmp_path / "file").write_text("")
    with pytest.raises(SystemExit):
        C.main(["--out", str(tmp_path / "file" / "sub")])
    assert "--out" in capsys.readouterr().err


def test_pooling_over_cells_hand_worked():
    # two cells: a = 1 +- 0.3 and 3 +- 0.4 -> mean 2, half-width sqrt(0.09 + 0.16) / 2 = 0.25;
    # b = 0.5 +- 0.4 and 1 +- 0.3 -> a - b per cell 0.5 and 2 (mean 1.25), each half-width
    # hypot(0.3, 0.4) = 0.5 -> sqrt(0.25 + 0.25) / 2 = 0.35355
    def row(est, stage, v, h):
        return {"estimator": est, "norm": "mean", "env": "e", "K": 1, "stage": stage,
                "mse": v, "mse_lo": v - h, "mse_hi": v + h}  # fmt: skip

    rows = [row("a", "s1", 1.0, 0.3), row("a", "s2", 3.0, 0.4),
            row("b", "s1", 0.5, 0.4), row("b", "s2", 1.0, 0.3)]  # fmt: skip
    f = cell_figure(rows, "a", "mse")
    assert (f.value, f.lo, f.hi, f.n) == pytest.approx((2.0, 1.75, 2.25, 2))
    d = cell_diff(rows, "a", "b", "mse")
    assert (d.value, d.hi - d.value) == pytest.approx((1.25, math.sqrt(0.5) / 2))
    assert d.significant
    # LLM: paired per batch; a batch with NaN (no coverage) is left out
    batches = [{"truth/a/mse": x, "truth/b/mse": y} for x, y in ((1, 0), (2, 1), (np.nan, 0))]
    p = llm_diff(batches, "a", "b", "mse")
    assert (p.value, p.n, p.lo, p.hi) == (1.0, 2, 1.0, 1.0)  # the same difference twice


def test_estimators_not_in_reward_units_are_not_ranked_on_reward_unit_figures():
    """graphgpo's returns are 10 gamma^d, 3spo's a shaped reward and rewardflow's a difference
    of propagated values: not the env's step returns, so their bias^2 / variance / MSE are not
    ranked (nor compared with the baseline's); the scale-free figures are. Every estimator in
    reward units is."""
    assert not R.in_reward_units("graphgpo") and not R.in_reward_units("3spo")
    assert not R.in_reward_units("rewardflow")
    for name in ("grpo", "gigpo", "hgpo", "gae", "empg", "gigpo_dynamic", "gigpo_similarity"):
        assert R.in_reward_units(name), name
    rows = [{"policy": "tabular", "estimator": e, "mse": v, "mse_lo": v - 0.1, "mse_hi": v + 0.1,
             "sign": v, "sign_lo": v - 0.1, "sign_hi": v + 0.1, "reward_units": u}
            for e, v, u in (("own", 0.1, False), ("hgpo", 3.0, True), ("grpo", 9.0, True))]  # fmt: skip
    bv = {"tabular": [_cell(r["estimator"], "s", mse=r["mse"], sign=r["sign"]) for r in rows]}
    line = R._winner_line("tabular", rows, bv, [], "mse", "MSE", True, ())
    assert line.startswith("MSE: lowest **hgpo** 3") and "own" not in line
    line = R._winner_line("tabular", rows, bv, [], "sign", "sign", False, ())
    assert line.startswith("sign: highest **grpo**")
    diffs = [{"policy": "tabular", "estimator": e, "metric": "mse", "diff": d, "lo": d - 1,
              "hi": d + 1, "n": 2} for e, d in (("own", -2.9), ("grpo", 6.0))]  # fmt: skip
    line = R._vs_base_line("tabular", rows, diffs, "mse", "MSE", True, "hgpo")
    assert "higher (worse): grpo" in line and line.endswith("not in reward units: own.")
    md = R.table_md(rows, "hgpo")
    assert "| tabular | own † |" in md and "† not in reward units" in md


def test_the_llm_rows_come_from_finished_runs_without_running_them(tmp_path, tiny):
    """Finished LLM runs (their metrics.jsonl logged the last iteration) are read back, not
    run again; their truth figures become the table's llm rows, differences paired."""
    from studies.compare_report import write_report

    llm_out = tmp_path / "cmp" / "llm"
    for seed in range(2):
        run = llm_out / f"hgpo-s{seed}"
        run.mkdir(parents=True)
        rows = []
        for it in (1, 2):
            r = {"iteration": it, "success_rate": 0.5}
            if it == 2:
                r["truth/J"] = 1.0
                for e, base in (("grpo", 1.0), ("hgpo", 0.5)):
                    r.update({f"truth/{e}/{m}": base + 0.1 * seed for m in
                              ("bias2", "variance", "mse", "mse_all", "sign", "grad_cos")})  # fmt: skip
            rows.append(r)
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = C.CompareConfig(estimators=("grpo", "hgpo"), policies=("tabular",), llm=True,
                          llm_seeds=2, llm_iterations=2, out=str(tmp_path / "cmp"))  # fmt: skip
    llm = C.run_llm(cfg.llm_settings(), progress=False)  # both finished: nothing is run
    res = write_report(cfg, {"tabular": []}, {}, llm)
    rows = [r for r in res["table"] if r["policy"].startswith("llm")]
    assert [r["estimator"] for r in rows] == ["grpo", "hgpo"]
    assert rows[0]["mse"] == pytest.approx(1.05) and rows[1]["mse"] == pytest.approx(0.55)
    d = next(d for d in res["diffs"] if d["policy"].startswith("llm") and d["metric"] == "mse")
    assert d["diff"] == pytest.approx(0.5) and d["evidence"].startswith("paired")


def test_an_entry_point_estimator_appears_in_a_subprocess(tmp_path):
    """A package's estimator (an hgpo.estimators entry point) is a row, with two worker
    processes."""
    pkg = tmp_path / "pkg"
    (pkg / "userest").mkdir(parents=True)
    (pkg / "userest" / "__init__.py").write_text(textwrap.dedent("""
        from hgpo import step_returns

        def halved(batch, cfg, values=None):
            R = step_returns(batch, cfg)
            return 0.5 * (R - R.mean())
    """))  # fmt: skip
    info = pkg / "userest-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: userest\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[hgpo.estimators]\nhalved = userest:halved\n")
    out = tmp_path / "cmp"
    code = f"""
        import studies.bias_variance as BV
        BV.QUICK = {TINY_CELLS!r}
        from studies.compare import main
        raise SystemExit(main({[*TINY[:-3], "--workers", "2", "--no-progress",
                               "--estimators", "hgpo", "halved", "--out", str(out)]!r}))
    """  # fmt: skip
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                       text=True, timeout=300, cwd=ROOT,
                       env={**os.environ, "PYTHONPATH": f"{pkg}:{ROOT}"})  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    table = _rows(out / "table.csv")
    assert [r["estimator"] for r in table] == ["hgpo", "halved"]
    assert table[1]["origin"] == "entry point userest:halved"


def _cell(est, stage, **figs):
    """One hand-made bias/variance row (norm = mean) of cell (e, K = 1, stage): each figure
    value v with the interval [v - 0.01, v + 0.01] (a NaN figure: NaN interval)."""
    row = {"estimator": est, "norm": "mean", "env": "e", "K": 1, "stage": stage}
    for m, v in figs.items():
        row.update({m: v, f"{m}_lo": v - 0.01, f"{m}_hi": v + 0.01})
    return row


# gigpo_dynamic's filter drops every group of the untrained cell (all returns tie): all-zero
# advantages, variance exactly 0, no batch gradient (cosine NaN), sign agreement 0. In the cell
# both were measured in, gae's gradient cosine (0.853) is above gigpo_dynamic's (0.765).
ISSUE_38_CELLS = [
    _cell("gae", "untrained", bias2=0.0, variance=0.015, mse=0.015, sign=0.68, grad_cos=0.49),
    _cell("gae", "0.5", bias2=0.0, variance=6.0, mse=6.0, sign=0.66, grad_cos=0.853),
    _cell("gigpo_dynamic", "untrained", bias2=0.003, variance=0.0, mse=0.003, sign=0.0,
          grad_cos=math.nan),
    _cell("gigpo_dynamic", "0.5", bias2=13.5, variance=36.8, mse=50.3, sign=0.56, grad_cos=0.765),
    _cell("hgpo", "untrained", bias2=0.1, variance=0.05, mse=0.15, sign=0.6, grad_cos=0.45),
    _cell("hgpo", "0.5", bias2=0.5, variance=5.0, mse=5.5, sign=0.6, grad_cos=0.75),
]  # fmt: skip


def test_estimators_are_ranked_over_the_same_cells_and_all_zero_cells_are_named(tmp_path):
    """Issue 38: gigpo_dynamic's all-zero cell was dropped from its gradient cosine silently
    (its mean over 1 cell ranked above gae's over 2: "highest gigpo_dynamic 0.765, next gae
    0.671; the lead -0.0875 [-0.118, -0.0566] is not significant"), table.csv said n = 2, and
    its all-zero cell "won" lowest variance. Now a figure's n is its true count, an all-zero
    cell is named and left out of the figures, and only estimators measured in every cell are
    ranked (paired over the same cells), the lead's word following its interval."""
    cfg = C.CompareConfig(estimators=("gae", "gigpo_dynamic", "hgpo"), policies=("tabular",),
                          out=str(tmp_path))  # fmt: skip
    bv = {"tabular": ISSUE_38_CELLS}
    table, diffs, tests = R.build_table(cfg, bv, {}, None)
    dyn = next(r for r in table if r["estimator"] == "gigpo_dynamic")
    assert (dyn["grad_cos_n"], dyn["variance_n"], dyn["n"], dyn["units"]) == (1, 1, 1, 2)
    assert dyn["zero_cells"] == 1 and dyn["variance"] == pytest.approx(36.8)
    gae = next(r for r in table if r["estimator"] == "gae")
    assert (gae["n"], gae["zero_cells"], gae["grad_cos_n"]) == (2, 0, 2)
    d = next(d for d in diffs if d["estimator"] == "gigpo_dynamic" and d["metric"] == "grad_cos")
    assert d["n"] == 1 and d["diff"] == pytest.approx(0.765 - 0.75)  # paired: the 0.5 cell only
    md = R.summary_lines(cfg, table, diffs, tests, bv, {}, None)
    text = "\n".join(md)
    assert "all-zero advantages" in text and "gigpo_dynamic in 1 of 2" in text
    cos = next(x for x in md if x.startswith("- gradient cosine:"))
    assert cos.startswith("- gradient cosine: highest **gae** 0.671"), cos
    assert "**significant**" in cos and "not ranked" in cos and "gigpo_dynamic (1 of 2 cells" in cos
    var = next(x for x in md if x.startswith("- variance:"))
    assert "lowest **hgpo**" in var and "gigpo_dynamic in" not in var.split("not ranked")[0]
    tmd = R.table_md(table, "hgpo")
    assert "gigpo_dynamic ‡" in tmd and "(n = 1 of 2)" in tmd and "‡ all-zero advantages" in tmd


def test_a_leads_word_follows_its_interval():
    """A lead whose interval is clear of 0 is significant; one without an interval is
    untested, not "not significant"."""
    rows = [{"policy": "tabular", "estimator": e, "sign": v, "sign_lo": v - 0.01,
             "sign_hi": v + 0.01} for e, v in (("a", 0.9), ("b", 0.5))]  # fmt: skip
    cells = [_cell("a", "s", sign=0.9), _cell("b", "s", sign=0.5)]
    line = R._winner_line("tabular", rows, {"tabular": cells}, [], "sign", "sign", False, ())
    assert "highest **a**" in line and "is **significant**" in line
    for c in cells:
        c["sign_lo"] = c["sign_hi"] = math.nan
    line = R._winner_line("tabular", rows, {"tabular": cells}, [], "sign", "sign", False, ())
    assert "is **untested (no interval)**" in line


@pytest.fixture
def faulty():
    """Three user estimators: one raises, one hangs in Python, one hangs where no signal
    reaches it (SIGALRM blocked: as in native code)."""
    import signal
    import time

    def raises(batch, config, values=None):
        raise ZeroDivisionError("division by zero")

    def hangs(batch, config, values=None):
        time.sleep(3600)

    def stuck(batch, config, values=None):
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
        time.sleep(3600)

    for name, fn in (("raises", raises), ("hangs", hangs), ("stuck", stuck)):
        hgpo.register_estimator(name, fn)
    yield
    for name in ("raises", "hangs", "stuck"):
        hgpo.unregister_estimator(name)


def test_an_estimator_that_raises_fails_its_cell_naming_it(tmp_path, tiny, faulty, capsys):
    """Issue 38: the study's error names the estimator; the hooks are restored after."""
    args = [*TINY, "--estimators", "grpo", "hgpo", "raises", "--out", str(tmp_path / "cmp")]
    assert C.main(args) == 1
    err = capsys.readouterr().err
    assert "error: 1 of 1 tasks failed" in err, err
    # named once (hgpo.estimator_registry names a user's estimator; the study does not again)
    assert re.search(
        r"estimator 'raises' (\(register_estimator\) )?raised ZeroDivisionError: "
        r"division by zero",
        err,
    ), err
    assert err.count("estimator 'raises'") == 2, err  # the failed cell and the closing list
    assert BV.run_cell.__module__ == "studies.bias_variance"
    assert BV.compute_advantages is hgpo.compute_advantages


def _toy_batch():
    import toyenvs

    env = toyenvs.make("tmaze", length=1)
    rb = toyenvs.rollout(env, toyenvs.TabularPolicy(env, K=1), env.tasks[:2], 2, 0)
    return rb.batch, hgpo.EstimatorConfig(K=1)


def test_a_hung_estimator_is_bounded_by_cell_timeout_and_named(faulty):
    """Issue 38: a cell past --cell-timeout fails naming the estimator it was in."""
    from studies import compare_guard as G

    batch, cfg = _toy_batch()
    with G.guarded(0.5):
        with pytest.raises(G.CellTimeout, match=r"cell x ran past --cell-timeout 0.5 s, in "
                           "estimator 'hangs'"):  # fmt: skip
            G.bounded(BV.compute_advantages, "cell x", "hangs", batch, cfg)
        with pytest.raises(G.CellTimeout, match="not in an estimator"):
            G.bounded(__import__("time").sleep, "cell y", 60)
    with pytest.raises(ValueError, match="--cell-timeout: must be a positive number"):
        G.guarded(math.inf).__enter__()


def test_a_cell_stuck_where_no_signal_reaches_has_its_process_killed(monkeypatch, faulty, capfd):
    """Code that never returns to Python (SIGALRM blocked here, as in native code) has its
    process killed GRACE_S after the bound, the estimator named on stderr."""
    import multiprocessing

    from studies import compare_guard as G

    monkeypatch.setattr(G, "GRACE_S", 0.5)
    batch, cfg = _toy_batch()

    def child():
        with G.guarded(0.5):
            G.bounded(BV.compute_advantages, "cell x", "stuck", batch, cfg)

    proc = multiprocessing.get_context("fork").Process(target=child)
    proc.start()
    proc.join(60)
    assert proc.exitcode == -9
    err = capfd.readouterr().err
    assert (
        "cell x ran past --cell-timeout 0.5 s, in estimator 'stuck', and did not stop 0.5 s "
        "later (native code?); killing its worker process" in err
    ), err


def test_differences_to_the_baseline_are_holm_corrected_over_the_policys_family():
    """Issue 38 item 6: a difference whose bare 95% interval is clear of 0 (p about 0.03) is
    not called better or worse once Holm corrects over the policy's family of 3 (before: every
    interval clear of 0 was listed as significant, uncorrected)."""
    from studies import compare_report as R

    def d(e, diff, lo, hi):
        return {"policy": "tabular", "estimator": e, "baseline": "hgpo", "metric": "mse",
                "diff": diff, "lo": lo, "hi": hi, "n": 12, "significant": lo > 0 or hi < 0}  # fmt: skip

    diffs = [d("a", -1.0, -1.9, -0.1), d("b", 5.0, 4.0, 6.0), d("c", 0.1, -0.5, 0.7)]
    assert diffs[0]["significant"]  # clear of 0 alone
    R._holm_by_policy(diffs)
    assert 0.02 < diffs[0]["p"] < 0.04 and diffs[0]["p_holm"] > 0.05
    assert [x["significant"] for x in diffs] == [False, True, False]
    rows = [{"policy": "tabular", "estimator": e, "units": 12} for e in ("a", "b", "c")]
    line = R._vs_base_line("tabular", rows, diffs, "mse", "MSE", True, "hgpo")
    assert "lower (better): none" in line and "within noise: a, c" in line, line
    assert "higher (worse): b (+5 [+4, +6], Holm p = " in line, line


def test_a_full_disk_or_ctrl_c_is_one_line(tmp_path, monkeypatch, capsys):
    """Issue 38 item 10: studies.compare stops on a full disk or Ctrl-C in one line."""
    import errno

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "cmp" / "table.csv"))

    monkeypatch.setattr(C, "run_compare", full)
    assert C.main([*TINY, "--out", str(tmp_path / "cmp")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "table.csv" in err[0], err

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(C, "run_compare", interrupted)
    assert C.main([*TINY, "--out", str(tmp_path / "cmp2")]) == 130
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("interrupted;"), err
