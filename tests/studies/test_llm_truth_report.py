"""studies.llm_truth_report: runs grouped by trained estimator, truth figures pooled."""

from __future__ import annotations

import json

import pytest

from studies.llm_truth_report import learning_table, load, main, truth_table


def _run(folder, success, bias2):
    folder.mkdir(parents=True)
    rows = []
    for it, (s, b) in enumerate(zip(success, bias2, strict=True), 1):
        row = {"iteration": it, "success_rate": s}
        if b is not None:
            row.update({"truth/J": it, **{f"truth/grpo/{m}": b for m in
                        ("bias2", "variance", "mse", "mse_all", "sign", "grad_cos")}})  # fmt: skip
        rows.append(json.dumps(row))
    (folder / "metrics.jsonl").write_text("\n".join(rows) + "\n")
    return str(folder)


def test_tables_pool_every_truth_row_and_group_by_trained_estimator(tmp_path):
    runs = [
        _run(tmp_path / "hgpo-s0", [0.0, 1.0], [None, 2.0]),
        _run(tmp_path / "hgpo-s1", [1.0, 1.0], [None, 4.0]),
        _run(tmp_path / "grpo-s0", [0.0, 0.0], [None, 6.0]),
    ]
    data = load(runs)
    assert sorted(data) == ["grpo", "hgpo"] and len(data["hgpo"]) == 2
    table = learning_table(data, last=1)
    # seed-mean success 0.5 at iteration 1 and 1.0 at 2: 0.75 first reached at 2; final J 2
    assert "| hgpo | 2 | 1.00 [1.00, 1.00] | 2 | 2.00 |" in table
    text, stats = truth_table(data)
    assert stats["grpo"]["bias2"][0] == pytest.approx(4.0)  # (2 + 4 + 6) / 3 batches
    assert text.startswith("3 batches pooled")
    assert main([*runs, "--out", str(tmp_path / "fig")]) == 0
    assert (tmp_path / "fig_truth.png").exists() and (tmp_path / "fig_success.png").exists()


def test_a_folder_not_named_estimator_seed_is_an_error(tmp_path):
    with pytest.raises(ValueError, match="not named <estimator>-s<seed>"):
        load([_run(tmp_path / "whatever", [0.0], [None])])


@pytest.mark.parametrize(
    ("make", "needle"),
    [
        (lambda p: str(p / "hgpo-s0"), "'{p}/hgpo-s0' has no readable metrics.jsonl"),
        (lambda p: _run(p / "hgpo-s0", [0.0], [None]), "logged no truth/ metrics; train it with"),
    ],
)
def test_bad_runs_are_one_line_exit_2_before_any_figure(tmp_path, capsys, make, needle):
    run = make(tmp_path)
    with pytest.raises(SystemExit) as e:
        main([run, "--out", str(tmp_path / "fig")])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert needle.format(p=tmp_path) in err and "Traceback" not in err
    assert not list(tmp_path.glob("fig*"))


def test_an_unwritable_out_is_named_before_any_figure(tmp_path, capsys):
    run = _run(tmp_path / "hgpo-s0", [0.0], [1.0])
    (tmp_path / "a_file").write_text("")
    with pytest.raises(SystemExit):
        main([run, "--out", str(tmp_path / "a_file" / "fig")])
    assert "a_file' exists and is not a folder; give a writable --out" in capsys.readouterr().err
