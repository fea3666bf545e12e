"""python -m hgpo.integrations.verl_tasks: every argument checked before a file is written,
both parquet files or neither, and a folder holding another dataset refused unless --fresh."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

pd = pytest.importorskip("pandas")

from hgpo.integrations import verl_tasks  # noqa: E402

TOY = "toy:keydoor:size=4"
"""5 training tasks, 2 held-out ones."""
NO_HELDOUT = "toy:tmaze:length=1"


def run(capsys, *argv: str) -> tuple[int, str]:
    """(exit status, stdout + stderr) of the command line ``argv``."""
    try:
        verl_tasks.main(list(argv))
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    out = capsys.readouterr()
    return code, out.out + out.err


def files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


@pytest.mark.parametrize(
    ("argv", "match"),
    [
        (["--env", TOY, "--val", "3"], r"--val: must be .*2.*got 3"),
        (["--env", TOY, "--train", "6"], r"--train: must be .*5.*got 6"),
        (["--env", NO_HELDOUT], r"--val: 'toy:tmaze:length=1' has no 'heldout' tasks"),
    ],
)
def test_a_bad_count_is_one_line_naming_the_flag_and_writes_nothing(tmp_path, capsys, argv, match):
    out = tmp_path / "data"
    code, text = run(capsys, *argv, "--out-dir", str(out))
    assert code == 2 and len(text.strip().splitlines()) == 1
    assert "Traceback" not in text and "'n'" not in text
    assert re.search(match, text), text
    assert files(out) == []


def test_same_settings_again_leave_the_dataset_other_settings_need_fresh(tmp_path, capsys):
    out = tmp_path / "data"
    argv = ["--env", TOY, "--out-dir", str(out), "--train", "3", "--val", "2"]
    assert run(capsys, *argv)[0] == 0
    assert files(out) == ["hgpo_verl_tasks.json", "test.parquet", "train.parquet"]
    record = json.loads((out / "hgpo_verl_tasks.json").read_text())
    assert record["env"] == TOY and record["files"]["train.parquet"] == {
        "split": "train",
        "rows": 3,
    }
    before = {f: (out / f).stat().st_mtime_ns for f in files(out)}
    code, text = run(capsys, *argv)
    assert code == 0 and "already holds this dataset" in text
    assert {f: (out / f).stat().st_mtime_ns for f in files(out)} == before

    other = ["--env", TOY, "--out-dir", str(out), "--train", "4", "--val", "2"]
    code, text = run(capsys, *other)
    assert code == 2 and len(text.strip().splitlines()) == 1
    assert f"{str(out)!r} holds another dataset" in text and "--fresh" in text
    assert len(pd.read_parquet(out / "train.parquet")) == 3

    assert run(capsys, *other, "--fresh")[0] == 0
    assert len(pd.read_parquet(out / "train.parquet")) == 4
    assert (
        json.loads((out / "hgpo_verl_tasks.json").read_text())["files"]["train.parquet"]["rows"]
        == 4
    )


def test_parquet_files_without_a_settings_record_are_another_dataset(tmp_path, capsys):
    out = tmp_path / "data"
    out.mkdir()
    pd.DataFrame({"x": [1]}).to_parquet(out / "train.parquet")
    code, text = run(capsys, "--env", TOY, "--out-dir", str(out))
    assert code == 2 and "holds another dataset (train.parquet" in text
    assert files(out) == ["train.parquet"]


def test_a_failed_write_leaves_neither_file(tmp_path, capsys, monkeypatch):
    """The second parquet write fails: neither file appears, no temporary is left."""
    out = tmp_path / "data"
    real = pd.DataFrame.to_parquet
    calls = []

    def to_parquet(self, path, *args, **kwargs):
        calls.append(path)
        if len(calls) == 2:
            raise OSError("disk full")
        return real(self, path, *args, **kwargs)

    monkeypatch.setattr(pd.DataFrame, "to_parquet", to_parquet)
    with pytest.raises(OSError, match="disk full"):
        verl_tasks.main(["--env", TOY, "--out-dir", str(out), "--train", "2", "--val", "1"])
    assert len(calls) == 2 and files(out) == []


def test_a_missing_file_of_the_same_dataset_is_written_again(tmp_path, capsys):
    out = tmp_path / "data"
    argv = ["--env", TOY, "--out-dir", str(out), "--train", "2", "--val", "1"]
    assert run(capsys, *argv)[0] == 0
    (out / "test.parquet").unlink()
    assert run(capsys, *argv)[0] == 0
    assert len(pd.read_parquet(out / "test.parquet")) == 1
