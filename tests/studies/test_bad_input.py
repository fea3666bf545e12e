"""The studies fail fast: one bad-input table per entry point, every error named, before work.

"Before any work" is checked by replacing each study's ``run_study`` with one that fails the
test if it is ever reached; the command-line tables then expect argparse's exit status 2 and
the message on stderr.
"""

from __future__ import annotations

import math
import os
import re
from pathlib import Path

import pytest

from studies import bias_variance as bv
from studies import train_toy as tt
from studies.cli import check_out_dir


@pytest.fixture
def no_work(monkeypatch: pytest.MonkeyPatch) -> list:
    """Replace both studies' run_study: record the config it got and return a stub summary."""
    seen: list = []

    def fake(cfg, progress=True, fresh=False):
        seen.append(cfg)
        return {"table": "", "prop41_text": "", "orderings_text_auc": "", "schemes_text": "",
                "terminal": ""}  # fmt: skip

    monkeypatch.setattr(bv, "run_study", fake)
    monkeypatch.setattr(tt, "run_study", fake)
    return seen


def _file(tmp_path: Path) -> str:
    f = tmp_path / "a_file"
    f.write_text("x")
    return str(f)


def _read_only(tmp_path: Path) -> str:
    if os.geteuid() == 0:
        pytest.skip("root writes into read-only folders; /proc/x and a file cover the check")
    d = tmp_path / "ro"
    d.mkdir()
    d.chmod(0o555)
    return str(d)


OUT_CASES = [
    (
        lambda tmp: "/proc/x",
        r"--out: cannot write to '/proc/x' \(No such file or directory\); give a writable --out",
    ),
    (_file, r"--out: '.*a_file' exists and is not a folder; give a writable --out"),
    (lambda tmp: _file(tmp) + "/sub", r"--out: cannot write to '.*a_file/sub' \(Not a directory\)"),
    (_read_only, r"--out: cannot write to '.*ro' \(Permission denied\)"),
]


@pytest.mark.parametrize(("make", "match"), OUT_CASES)
def test_check_out_dir_table(tmp_path, make, match):
    with pytest.raises(ValueError, match=match):
        check_out_dir(make(tmp_path))


def test_check_out_dir_creates_a_writable_folder(tmp_path):
    assert check_out_dir(tmp_path / "a" / "b").is_dir()
    assert list((tmp_path / "a" / "b").iterdir()) == []  # the write check leaves nothing


# ---------------------------------------------------------------------------- bias_variance


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        (dict(estimators=("ppo",)), r"--estimators: must be one of .*got 'ppo'"),
        (dict(envs=("keydoor:size=2",)), r"--envs 'keydoor:size=2': size: must be an integer in 4\.\.64, got 2$"),
        (dict(envs=("nowhere",)), r"--envs 'nowhere': unknown family 'nowhere'"),
        (dict(envs=("keydoor:size",)), r"--envs 'keydoor:size': must be name=value items"),
        (dict(envs=("keydoor:size=x",)), r"--envs 'keydoor:size=x': size: must be an integer in 4\.\.64, got 'x'$"),
        (dict(stages=("1.5",)), r"--stages: success target: must be a finite number in \(0\.0, 1\.0\)"),
        (dict(stages=("nan",)), r"--stages: success target: must be a finite number"),
        (dict(stages=("half",)), r"neither 'untrained'"),
        (dict(n_batches=3), r"^--batches: must be an integer >= 10, got 3$"),
        (dict(norms=("zscore",)), r"^--norms: must be one of 'mean', 'mean_std', got 'zscore'$"),
        (dict(Ks=(9,)), r"^--K: must be an integer in 0\.\.8, got 9$"),
        (dict(Ks=()), r"each need a value"),
        (dict(seed=-1), r"^--seed: must be an integer >= 0, got -1$"),
        (dict(workers=0), r"^--workers: must be an integer >= 1, got 0$"),
        (dict(fit_steps=0), r"^--fit-steps: must be an integer >= 1, got 0$"),
        (dict(net_dtype="half"), r"^--net-dtype: must be one of 'float32', 'float64', got 'half'$"),
        (dict(alpha=math.inf), r"^--alpha: must be a finite number >= 0\.0, got inf$"),
        (dict(alpha=-1.0), r"^--alpha: must be a finite number >= 0\.0, got -1\.0$"),
        (dict(alpha=1e6), r"^--alpha: EstimatorConfig: the level weights"),
        (dict(gamma=math.nan), r"^--gamma: must be a finite number in \[0\.0, 1\.0\], got nan$"),
        (dict(estimator_options="leave_one_out=2"), r"^--estimator-options: EstimatorConfig\.leave_one_out: must be true or false, got 2$"),
        (dict(estimator_options="omega=inf"), r"^--estimator-options: EstimatorConfig\.omega: must be a finite number"),
        (dict(estimator_options="alpah=1"), r"^--estimator-options: unknown estimator option 'alpah'"),
        (dict(estimator_options="K=3"), r"^--estimator-options: K is set by the study's own flags$"),
        (dict(estimator_options="weight_offset=1e100"), r"^--estimator-options: EstimatorConfig: the level weights .* alpha=4\.0"),  # the alpha sweep
        (dict(estimator_options="x"), r"^--estimator-options: must be name=value items"),
    ],
)  # fmt: skip
def test_bias_variance_config_table(kw, match):
    with pytest.raises(ValueError, match=match):
        bv.StudyConfig(**kw)


@pytest.mark.parametrize(
    ("argv", "match"),
    [
        (["--out", "/proc/x"], r"--out: cannot write to '/proc/x' \(No such file or directory\); give a writable --out"),
        (["--seed", "-1"], r"--seed: must be an integer >= 0, got -1"),
        (["--alpha", "inf"], r"--alpha: must be a finite number >= 0\.0, got inf"),
        (["--quick", "--K", "99"], r"--K: must be an integer in 0\.\.8, got 99"),
        (["--quick", "--envs", "keydoor:size=99"], r"--envs 'keydoor:size=99': size: must be an integer in 4\.\.64, got 99"),
        (["--alph", "1"], r"unrecognized arguments: --alph 1"),  # no abbreviations
        (["--bat", "12"], r"unrecognized arguments: --bat 12"),
        (["--estimator-options", "leave_one_out=maybe"], r"leave_one_out: must be true or false, got 'maybe'"),
        # flags that only a --scheme study reads: an error without one (they would do nothing)
        (["--budgets", "nan"], r"--budgets: must be given with --scheme \(it does nothing without one\), got \[nan\]"),
        (["--branch-budget", "0.3"], r"--branch-budget: must be given with --scheme \(it does nothing without one\), got 0\.3"),
    ],
)  # fmt: skip
def test_bias_variance_cli_table(tmp_path, no_work, capsys, argv, match):
    if "--out" not in argv:
        argv = [*argv, "--out", str(tmp_path / "out")]
    with pytest.raises(SystemExit) as e:
        bv.main(argv)
    assert e.value.code == 2
    assert re.search(match, capsys.readouterr().err)
    assert no_work == []


@pytest.mark.parametrize(("make", "match"), OUT_CASES)
def test_bias_variance_cli_out_table(tmp_path, no_work, capsys, make, match):
    with pytest.raises(SystemExit):
        bv.main(["--quick", "--out", make(tmp_path)])
    assert re.search(match, capsys.readouterr().err)
    assert no_work == []


def test_bias_variance_quick_keeps_the_flags_given(tmp_path, no_work):
    out = str(tmp_path / "out")
    assert bv.main(["--quick", "--out", out]) == 0
    assert (no_work[-1].Ks, no_work[-1].envs, no_work[-1].n_batches, no_work[-1].fit_steps) == (
        (2,),
        ("keydoor:size=4",),
        12,
        50,
    )
    assert bv.main(["--quick", "--K", "3", "--batches=20", "--fit-steps=150", "--out", out]) == 0
    cfg = no_work[-1]
    assert (cfg.Ks, cfg.n_batches, cfg.envs, cfg.fit_steps) == ((3,), 20, ("keydoor:size=4",), 150)


def test_default_out_folders_depend_on_what_runs(tmp_path, no_work, monkeypatch):
    """Issue 27 item 3: --quick, --policy and --scheme no longer write the main job's folder."""
    monkeypatch.chdir(tmp_path)
    for argv, want in (([], "results/bias_variance"),
                       (["--quick"], "results/bias_variance/quick"),
                       (["--quick", "--policy", "mlp"], "results/bias_variance/quick-mlp"),
                       (["--policy", "transformer"], "results/bias_variance/transformer")):  # fmt: skip
        assert bv.main(argv) == 0
        assert no_work[-1].out == want
    assert bv.default_out(True, "tabular", True) == "results/bias_variance/quick-scheme"
    for argv, want in (([], "results/train_toy"),
                       (["--quick"], "results/train_toy_quick"),
                       (["--full"], "results/train_toy_full"),
                       (["--quick", "--policy", "mlp"], "results/train_toy_quick/mlp"),
                       (["--quick", "--scheme", "independent", "branch:hard"],
                        "results/train_toy_quick/scheme"),
                       (["--quick", "--out", "mine"], "mine")):  # fmt: skip
        assert tt.main(argv) == 0
        assert no_work[-1].out == want


def test_a_folder_holding_another_runs_results_is_refused(tmp_path, no_work, capsys):
    """Issue 27 item 3: its settings.json differs (or results without one): a one-line error
    naming --out and --fresh, before any work; the same settings and --fresh go on."""
    from studies.io import claim_results_dir

    out = str(tmp_path / "out")
    assert bv.main(["--quick", "--out", out]) == 0
    claim_results_dir(Path(out), "bias_variance", bv.study_settings(no_work[-1]), False, bv.RESULTS)
    (Path(out) / "results.csv").write_text("x")
    with pytest.raises(SystemExit) as e:
        bv.main(["--quick", "--K", "3", "--policy", "mlp", "--out", out])
    assert e.value.code == 2 and len(no_work) == 1
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.removesuffix(" (see --help)").endswith(f"error: --out: {out!r} holds the results of another run (settings that "
                        "differ: Ks, policy); give another --out, or --fresh to replace them"), err  # fmt: skip
    assert bv.main(["--quick", "--out", out, "--workers", "1"]) == 0  # same settings: resumes
    assert bv.main(["--quick", "--K", "3", "--out", out, "--fresh"]) == 0
    # results of a run that recorded no settings (made before settings.json)
    (Path(out) / "settings.json").unlink()
    with pytest.raises(SystemExit):
        bv.main(["--quick", "--out", out])
    assert "holds results (results.csv) of a run whose settings were not recorded; give " \
        "another --out, or --fresh" in capsys.readouterr().err  # fmt: skip


def test_train_toy_refuses_another_study_in_a_default_folder(
    tmp_path, no_work, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)
    assert tt.main(["--quick"]) == 0
    assert (tmp_path / "results/train_toy_quick/settings.json").is_file()
    (tmp_path / "results/train_toy_quick/final.csv").write_text("x")
    with pytest.raises(SystemExit) as e:
        tt.main(["--quick", "--seeds", "1"])
    assert e.value.code == 2 and len(no_work) == 1
    assert ("--out: 'results/train_toy_quick' holds the results of another run (settings that "
            "differ: seeds); give another --out, or --fresh") in capsys.readouterr().err  # fmt: skip
    assert tt.main(["--quick"]) == 0  # the same study resumes
    # a folder named with --out may hold several studies' runs (keyed), as docs/train_toy.md does
    assert tt.main(["--quick", "--seeds", "1", "--out", "results/train_toy_quick"]) == 0


# ---------------------------------------------------------------------------- train_toy


def _cfg(tmp_path: Path, **kw: object) -> tt.TrainToyConfig:
    base: dict[str, object] = dict(envs=("tmaze:length=2",), settings=("grpo", "hgpo"), seeds=2,
                                   iterations=6, workers=1, out=str(tmp_path / "out"))  # fmt: skip
    return tt.TrainToyConfig(**{**base, **kw})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"settings": ("nope",)}, r"--settings 'nope': estimator: must be one of 'grpo'"),
        ({"settings": ("hgpo:alpah=1",)}, r"--settings 'hgpo:alpah=1': unknown estimator option 'alpah'"),
        ({"settings": ("hgpo:K=9",)}, r"--settings 'hgpo:K=9': K: must be an integer in 0\.\.6, got 9"),
        ({"settings": ("hgpo:K=2.5",)}, r"K: must be an integer in 0\.\.6, got 2\.5"),
        ({"settings": ("hgpo:alpha=inf",)}, r"--settings 'hgpo:alpha=inf': EstimatorConfig\.alpha: must be a finite number"),
        ({"settings": ("hgpo:omega=nan",)}, r"EstimatorConfig\.omega: must be a finite number"),
        ({"settings": ("hgpo:alpha=380",), "Ks": (2, 6)}, r"--settings 'hgpo:alpha=380' at K=6: EstimatorConfig: the level weights"),
        ({"settings": ("hgpo:alpha",)}, r"--settings 'hgpo:alpha': must be name=value items"),
        ({"settings": ("hgpo:alpha=1,alpha=2",)}, r"'alpha' is given twice"),
        ({"envs": ("keydoor:size=2",)}, r"--envs 'keydoor:size=2': size: must be an integer in 4\.\.64, got 2$"),
        ({"envs": ("keydoor:start=2",)}, r"--envs 'keydoor:start=2': start: must be 'uniform' or a success rate"),
        ({"start": "warm"}, r"^--start: must be 'uniform' or a success rate in \(0, 1\), got 'warm'$"),
        ({"seeds": 0}, r"^--seeds: must be an integer >= 1, got 0$"),
        ({"seed": -1}, r"^--seed: must be an integer >= 0, got -1$"),
        ({"lr": -1.0}, r"^--lr: must be a finite number > 0\.0, got -1\.0$"),
        ({"lr": math.inf}, r"^--lr: must be a finite number > 0\.0, got inf$"),
        ({"kl_coef": math.nan}, r"^--kl-coef: must be a finite number >= 0\.0, got nan$"),
        ({"clip": 1.0}, r"^--clip: must be a finite number in \(0\.0, 1\.0\), got 1\.0$"),
        ({"gamma": math.inf}, r"^--gamma: must be a finite number in \[0\.0, 1\.0\]"),
        ({"norm": "std"}, r"^--norm: must be one of 'mean', 'mean_std', got 'std'$"),
        ({"Ks": (7,)}, r"^--K: must be an integer in 0\.\.6, got 7$"),
        ({"Ks": ()}, r"each need at least one value"),
        ({"schemes": ("branch:nope",)}, r"^--scheme \(tmaze:length=2\): scheme: must be one of independent, .*got 'branch:nope'$"),
        ({"schemes": ("tree:99",)}, r"^--scheme \(tmaze:length=2\): scheme 'tree:99': depth: must be an integer in 1\.\."),
        ({"schemes": ("independent", "independent")}, r"^--scheme: must be distinct schemes"),
        ({"branch_budget": 0.0}, r"^--branch-budget: must be a finite number in \(0\.0, 1\.0\], got 0\.0$"),
        ({"branch_budget": 1.5}, r"^--branch-budget: must be a finite number in \(0\.0, 1\.0\], got 1\.5$"),
        ({"branch_budget": math.nan}, r"^--branch-budget: must be a finite number"),
    ],
)  # fmt: skip
def test_train_toy_config_table(tmp_path, kw, match):
    with pytest.raises(ValueError, match=match):
        _cfg(tmp_path, **kw)


@pytest.mark.parametrize(
    ("argv", "match"),
    [
        (["--out", "/proc/x"], r"--out: cannot write to '/proc/x' \(No such file or directory\); give a writable --out"),
        (["--seed", "-1"], r"--seed: must be an integer >= 0, got -1"),
        (["--settings", "hgpo:alpha=inf"], r"--settings 'hgpo:alpha=inf': EstimatorConfig\.alpha: must be a finite number"),
        (["--settings", "hgpo:alpha=-1"], r"alpha"),
        (["--lr", "inf"], r"--lr: must be a finite number > 0\.0, got inf"),
        (["--quick", "--iter", "3"], r"unrecognized arguments: --iter 3"),  # no abbreviations
        (["--quick", "--K", "99"], r"--K: must be an integer in 0\.\.6, got 99"),
        (["--quick", "--full"], r"argument --full: not allowed with argument --quick"),
        (["--quick", "--scheme", "branch:sometimes"], r"--scheme \(tmaze:length=3\): scheme: must be one of"),
        (["--quick", "--scheme", "branch:uniform", "--branch-budget", "0"], r"--branch-budget: must be a finite number in \(0\.0, 1\.0\], got 0\.0"),        (["--quick", "--branch-budget", "0.3"], r"--branch-budget: must be given with --scheme \(it does nothing without one\), got 0\.3"),
    ],
)  # fmt: skip
def test_train_toy_cli_table(tmp_path, no_work, capsys, argv, match):
    if "--out" not in argv:
        argv = [*argv, "--out", str(tmp_path / "out")]
    with pytest.raises(SystemExit) as e:
        tt.main(argv)
    assert e.value.code == 2
    assert re.search(match, capsys.readouterr().err)
    assert no_work == []


@pytest.mark.parametrize(("make", "match"), OUT_CASES)
def test_train_toy_cli_out_table(tmp_path, no_work, capsys, make, match):
    with pytest.raises(SystemExit):
        tt.main(["--quick", "--out", make(tmp_path)])
    assert re.search(match, capsys.readouterr().err)
    assert no_work == []


def test_train_toy_presets_keep_the_flags_given(tmp_path, no_work):
    out = str(tmp_path / "out")
    assert tt.main(["--quick", "--iterations", "3", "--out", out]) == 0
    assert (no_work[-1].iterations, no_work[-1].seeds) == (3, 2)
    assert tt.main(["--quick", "--iterations=4", "--seeds=1", "--out", out]) == 0
    assert (no_work[-1].iterations, no_work[-1].seeds, no_work[-1].out) == (4, 1, out)
    assert tt.main(["--full", "--K", "2", "--out", out]) == 0
    assert no_work[-1].Ks == (2,) and no_work[-1].iterations == 200


def test_bias_variance_names_an_entry_point_that_failed_to_load(
    tmp_path, no_work, capsys, monkeypatch
):
    """Issue 38 item 11: choosing a broken `hgpo.estimators` entry point says it failed to load
    and why (before: '--estimators: must be one of ...', as for a misspelt name)."""
    from hgpo import estimator_registry as reg

    reg._REGISTRY._load()
    monkeypatch.setitem(
        reg._REGISTRY._broken, "mine", "entry point 'mine' failed to load: ImportError: x"
    )
    with pytest.raises(SystemExit) as e:
        bv.main(["--quick", "--estimators", "grpo", "mine", "--out", str(tmp_path / "out")])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert re.search(
        r"--estimators: estimator 'mine': entry point 'mine' failed to load: ImportError: x", err
    )
    assert no_work == []


def test_bias_variance_full_disk_is_one_line(tmp_path, no_work, capsys, monkeypatch):
    """Issue 38 item 10: a full disk while the study writes is one line naming the file."""
    import errno

    def full(*a, **k):
        raise OSError(
            errno.ENOSPC, "No space left on device", str(tmp_path / "out" / "results.csv")
        )

    monkeypatch.setattr(bv, "run_study", full)
    assert bv.main(["--quick", "--out", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "results.csv" in err[0], err
