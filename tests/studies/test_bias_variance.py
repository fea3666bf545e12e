"""The bias/variance study end to end on a tiny setting, and its option checks."""

import json

from studies.bias_variance import main


def test_quick_study_writes_results_and_is_reproducible(tmp_path, capsys):
    args = ["--envs", "keydoor:size=4", "--K", "2", "--stages", "untrained", "0.5",
            "--batches", "10", "--groups", "4", "--workers", "1", "--no-progress"]  # fmt: skip
    assert main([*args, "--out", str(tmp_path / "a")]) == 0
    out = capsys.readouterr().out
    assert "hgpo" in out and "Proposition 4.1" in out
    for f in ("results.csv", "results.json", "levels.csv", "report.md", "bias_variance_vs_k.png",
              "mse_and_gradient.png", "group_sizes.png", "mse_vs_alpha_and_K.png"):  # fmt: skip
        assert (tmp_path / "a" / f).stat().st_size > 0
    main([*args, "--out", str(tmp_path / "b")])
    a = json.loads((tmp_path / "a" / "results.json").read_text())["rows"]
    b = json.loads((tmp_path / "b" / "results.json").read_text())["rows"]
    strip = lambda rows: [{k: v for k, v in r.items() if k != "gt_seconds"} for r in rows]  # noqa: E731
    assert strip(a) == strip(b)
    gae = next(r for r in a if r["estimator"] == "gae" and r["stage"] == "0.5")
    # GAE(lambda=1) with the exact V is unbiased: its bias^2 is 0 within its interval.
    assert gae["bias2_lo"] <= 0.0 <= gae["bias2_hi"] + 1e-9


# The bad-input table of StudyConfig and of the command line: tests/studies/test_bad_input.py.
