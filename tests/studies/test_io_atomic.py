"""Result files are written atomically (issue 38 item 8): a write cut short (a full disk, a
kill) leaves the old file whole and no partial or temporary file; and no study writes a result
file in place (the sources are checked for direct writes)."""

from __future__ import annotations

import errno
import re
from pathlib import Path

import pytest

from hgpo import atomic
from studies.io import atomic_write_json, atomic_write_text, save_figure, write_csv

ROOT = Path(__file__).resolve().parents[2]


class _DiskFull:
    """A value whose text fails like a full disk, after the rows before it were written."""

    def __str__(self) -> str:
        raise OSError(errno.ENOSPC, "No space left on device")

    __repr__ = __str__


def _old(folder: Path, name: str) -> Path:
    folder.mkdir(exist_ok=True)
    path = folder / name
    path.write_text("old contents\n")
    return path


def _only(path: Path) -> None:
    assert path.read_text() == "old contents\n"
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no partial, no temporary


def test_a_csv_cut_short_mid_row_leaves_the_old_file(tmp_path):
    path = _old(tmp_path, "curves.csv")
    rows = [{"it": i, "x": 0.5} for i in range(2000)] + [{"it": 2000, "x": _DiskFull()}]
    with pytest.raises(OSError, match="No space left"):
        write_csv(path, rows)
    _only(path)
    write_csv(path, rows[:2])
    assert path.read_text().splitlines() == ["it,x", "0,0.5", "1,0.5"]


def test_json_text_and_a_figure_cut_short_leave_the_old_file(tmp_path, monkeypatch):
    path = _old(tmp_path, "results.json")
    with pytest.raises(TypeError):  # the value after 2000 written ones cannot be written
        atomic_write_json(path, {"a": list(range(2000)), "z": object()})
    _only(path)

    path = _old(tmp_path / "b", "report.md")

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    with monkeypatch.context() as m:
        m.setattr(atomic.os, "fsync", full)  # everything written, the flush to disk fails
        with pytest.raises(OSError):
            atomic_write_text(path, "new\n" * 1000)
    _only(path)

    class Fig:
        def savefig(self, f, **kw):
            f.write(b"\x89PNG half")
            raise OSError(errno.ENOSPC, "No space left on device")

    fig = _old(tmp_path / "c", "plot.png")
    with pytest.raises(OSError):
        save_figure(Fig(), fig, dpi=100)
    _only(fig)


WRITES = re.compile(
    r"\.write_text\(|\.write_bytes\(|\.savefig\(|\.to_csv\(|\bjson\.dump\(|\bnp\.save|"
    r"\bopen\([^)]*[\"'][wx]b?\+?[\"']"
)
"""A direct write of a file, what a result file must not be written with (an append, "a",
is a log's: its lines are fsynced one by one)."""

MARKED = re.compile(r"# (not a result|atomic)\b")
"""A line left out of the scan: a probe or a file inside a temporary folder published whole
(``# not a result``), or a write into :func:`hgpo.atomic.atomic_open`'s file (``# atomic``)."""

PENDING: dict[str, int] = {}
"""Direct writes still in files being changed elsewhere (at most this many each; to go)."""


def direct_writes(root: Path = ROOT) -> dict[str, list[str]]:
    """The lines of studies/ and hgpo/train/ sources (studies/io.py aside) that write a file
    directly, by file; a line marked (:data:`MARKED`) is left out."""
    found: dict[str, list[str]] = {}
    for folder in ("studies", "hgpo/train"):
        for path in sorted((root / folder).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            if rel == "studies/io.py":
                continue
            for n, line in enumerate(path.read_text().splitlines(), 1):
                if WRITES.search(line) and not MARKED.search(line):
                    found.setdefault(rel, []).append(f"{rel}:{n}: {line.strip()}")
    return found


def test_no_result_file_is_written_in_place():
    found = direct_writes()
    late = {k: v for k, v in found.items() if len(v) > PENDING.get(k, 0)}
    assert not late, "write these through studies.io / hgpo.atomic:\n" + "\n".join(
        line for v in late.values() for line in v
    )


def test_the_scan_finds_direct_writes(tmp_path):
    (tmp_path / "studies").mkdir()
    (tmp_path / "hgpo" / "train").mkdir(parents=True)
    (tmp_path / "studies" / "a.py").write_text(
        'fig.savefig(p)\nwith open(p, "w") as f:\n    pass\nopen(p, "a")\n'
        'df.to_csv(p)\n(out / "x.md").write_text(s)\np.write_text("")  # not a result\n'
    )
    assert [x.split(":")[1] for x in direct_writes(tmp_path)["studies/a.py"]] == [
        "1", "2", "5", "6"
    ]  # fmt: skip
