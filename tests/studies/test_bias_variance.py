"""The bias/variance study end to end on a tiny setting, and its option checks."""

import json

import pytest

from studies.bias_variance import main


def test_quick_study_writes_results_and_is_reproducible(tmp_path, capsys):
    args = ["--envs", "keydoor:size=4", "--K", "2", "--stages", "untrained", "0.5",
            "--batches", "10", "--groups", "4", "--workers", "1", "--no-progress"]  # fmt: skip
    assert main([*args, "--out", str(tmp_path / "a")]) == 0
    out = capsys.readouterr().out
    # the terminal ends with a short summary (issue 38 item 16): HGPO against GRPO and GiGPO
    # with intervals, one line on Proposition 4.1, where the files are; the table and every
    # cell's checks are in report.md only
    lines = out.strip().splitlines()
    assert len(lines) <= 8, out
    assert lines[0].startswith("HGPO against GRPO and GiGPO (2 cells)")
    assert "Holm correction over the family of all 12 such tests" in lines[0]
    assert lines[1].startswith("- MSE per batch (norm = mean, reward^2; lower is better): vs grpo ")
    assert lines[-3].startswith("Proposition 4.1: its variance condition, of 2 cells: ")
    assert lines[-1].startswith(f"wrote {tmp_path / 'a'}/ in ") and "report.md" in lines[-1]
    assert "variance rises with k:" not in out and "keydoor    2 untrained" not in out
    md = (tmp_path / "a" / "report.md").read_text()
    assert md.startswith("# Bias/variance study\n\n## Summary\n\n2 cells. A cell is one ")
    assert md.index("### HGPO against GRPO and GiGPO") < md.index("### Proposition 4.1")
    assert "variance rises with k:" in md and "keydoor    2 untrained" in md
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


def test_a_killed_study_reruns_only_its_missing_cells_with_the_same_numbers(tmp_path, monkeypatch):
    from studies import bias_variance as bv

    out = tmp_path / "study"
    args = ["--envs", "keydoor:size=4", "--K", "2", "--stages", "untrained", "0.5",
            "--batches", "10", "--groups", "4", "--workers", "1", "--no-progress",
            "--out", str(out)]  # fmt: skip
    ran: list = []
    real = bv.run_cell
    monkeypatch.setattr(bv, "run_cell", lambda *a: ran.append(a[1:4]) or real(*a))
    files = ("results.csv", "levels.csv", "results.json", "report.md")
    assert main(args) == 0 and len(ran) == 2
    first = {f: (out / f).read_bytes() for f in files}
    # nothing missing: no cell runs again, and every output is the same, byte for byte
    ran.clear()
    assert main(args) == 0 and ran == []
    assert {f: (out / f).read_bytes() for f in files} == first
    # killed after one cell: the other cell's file is missing, a write was cut short
    cells = sorted((out / "cells").glob("*.json"))
    assert len(cells) == 2
    cells[0].unlink()
    (out / "cells" / "cut.json.tmp").write_text('{"rows": [')
    assert main(args) == 0 and len(ran) == 1
    assert not list((out / "cells").glob("*.tmp"))
    rows = lambda: [{k: v for k, v in r.items() if k != "gt_seconds"}  # noqa: E731
                    for r in json.loads((out / "results.json").read_text())["rows"]]  # fmt: skip
    again = rows()
    (out / "results.json").write_bytes(first["results.json"])
    assert again == rows()  # the rerun cell's numbers are the killed study's (but its timing)
    # --fresh runs every cell; a setting that changes the numbers is refused in this folder
    # (it holds this study's results: settings.json) and makes other cells in another one
    ran.clear()
    assert main([*args, "--fresh"]) == 0 and len(ran) == 2
    ran.clear()
    with pytest.raises(SystemExit) as e:
        main([*args, "--alpha", "2"])
    assert e.value.code == 2 and ran == []
    assert main([*args, "--alpha", "2", "--out", str(tmp_path / "alpha2")]) == 0 and len(ran) == 2
    assert len(list((out / "cells").glob("*.json"))) == 2


def test_study_config_declares_its_checks_per_field():
    """Every StudyConfig field with a flag has a --help section, every number and the --K list
    declare their bounds, the choice fields their choices (hgpo.fields.setting); each section
    is shown once in --help."""
    from hgpo.fields import field_bounds, field_choices, field_types, sections
    from studies import bias_variance as bv

    cls = bv.StudyConfig
    in_a_section = {name for names in sections(cls).values() for name in names}
    assert in_a_section == set(field_types(cls)) - {"max_nodes", "extra"}  # (no flags)
    numbers = {n for n, kind in field_types(cls).items() if kind in (int, float)}
    assert numbers | {"Ks"} == set(field_bounds(cls))
    # (--estimators is checked against hgpo.ESTIMATORS as it is when the study runs, not a
    # tuple frozen at import: an estimator registered later is one of them)
    assert set(field_choices(cls)) == {"norms", "backend", "policy", "net_dtype"}
    import hgpo

    hgpo.register_estimator("late", lambda batch, config, values=None: None)
    try:
        assert cls(estimators=("hgpo", "late")).estimators == ("hgpo", "late")
    finally:
        hgpo.unregister_estimator("late")
    with pytest.raises(ValueError, match=r"--estimators: must be one of .*got 'late'"):
        cls(estimators=("late",))
    help_text = bv._parser().format_help()
    for title in sections(cls):
        assert help_text.count(f"\n{title}:\n") == 1


def test_paired_difference() -> None:
    from studies.bias_variance import paired_difference

    d = paired_difference([1.0, 2.0, 3.0, float("nan")], [0.0, 0.0, 1.0, 5.0])
    assert d["n"] == 3 and d["diff"] == pytest.approx(5 / 3) and d["lo"] < d["diff"] < d["hi"]
    assert 0 < d["p"] < 0.1
    assert paired_difference([1.0, 1.0], [1.0, 1.0])["p"] == 1.0  # no difference at all
    assert paired_difference([2.0, 2.0], [1.0, 1.0])["p"] == 0.0  # the limit of t
    one = paired_difference([1.0], [0.0])
    assert one["diff"] == 1.0 and one["n"] == 1 and one["p"] != one["p"]  # NaN: no test
    with pytest.raises(ValueError, match="equal lengths, got 2 and 1"):
        paired_difference([1.0, 2.0], [1.0])
