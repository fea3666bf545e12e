"""``python -m hgpo.train.plot`` on bad metrics and on an ``--out`` folder: one-line errors
(exit 2) before anything is drawn, and a folder is a folder."""

from __future__ import annotations

import json

import pytest

from hgpo.train.plot import main, plot


def _write(folder, rows):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(folder)


def _error(capsys, argv):
    """The one stderr line of ``main(argv)``, which must exit with status 2."""
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


def test_a_row_without_iteration_is_named(tmp_path, capsys):
    run = _write(tmp_path / "run", [{"iteration": 1, "success_rate": 0.5}, {"success_rate": 1}])
    err = _error(capsys, [run])
    assert err.startswith("python -m hgpo.train.plot: error: ")
    assert f"{run}/metrics.jsonl: row 2 has no iteration" in err
    run = _write(tmp_path / "run2", [{"iteration": "1", "kl": 0.0}])
    assert "row 1 has iteration '1'" in _error(capsys, [run])
    assert not list(tmp_path.rglob("*.png"))


def test_a_non_numeric_metric_is_named(tmp_path, capsys):
    rows = [{"iteration": 1, "success_rate": 0.5}, {"iteration": 2, "success_rate": "abc"}]
    run = _write(tmp_path / "run", rows)
    err = _error(capsys, [run])
    assert "row 2 (iteration 2): success_rate must be a number, got 'abc'" in err
    run = _write(tmp_path / "run2", [{"iteration": 1, "kl": None}])
    assert "kl must be a number, got None" in _error(capsys, [run, "--panels", "kl"])
    # a metric that is not drawn may be anything
    rows = [{"iteration": 1, "success_rate": 0.5, "note": "text"}]
    assert plot([_write(tmp_path / "run3", rows)]).name == "curve.png"


def test_an_empty_metrics_file_is_an_error_not_an_empty_plot(tmp_path, capsys):
    run = _write(tmp_path / "run", [])
    err = _error(capsys, [run])
    assert err == (
        f"python -m hgpo.train.plot: error: {run}/metrics.jsonl: no rows (the run logged no "
        "iteration yet); nothing to plot"
    )  # (bad data, not a bad flag: no pointer to --help)
    assert not (tmp_path / "run" / "curve.png").exists()


@pytest.mark.parametrize("existing", [False, True])
def test_out_as_a_folder_gets_curve_png_inside(tmp_path, capsys, existing):
    run = _write(tmp_path / "run", [{"iteration": i, "success_rate": i / 2} for i in (1, 2)])
    folder = tmp_path / "newdir"
    if existing:
        folder.mkdir()
    out = str(folder) if existing else str(folder) + "/"
    assert main([run, "--out", out]) == 0
    assert (folder / "curve.png").stat().st_size > 0
    assert capsys.readouterr().out.strip() == str(folder / "curve.png")
    assert main([run, "--out", str(tmp_path / "c.png")]) == 0  # a file name stays a file
    assert (tmp_path / "c.png").is_file()
