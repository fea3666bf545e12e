"""A study stopped by a full disk, a folder turned read-only or Ctrl-C says so in one line
(issue 38 item 10): what failed, the file, and what was kept; no traceback from the study or
from its worker processes."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import studies.train_toy as train_toy
from hgpo import atomic
from studies.io import write_csv

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("code", "what"),
    [(errno.ENOSPC, "no space left on device (ENOSPC)"),
     (errno.EROFS, "read-only file system (EROFS)")],
)  # fmt: skip
def test_a_full_disk_or_a_read_only_folder_is_one_line(tmp_path, monkeypatch, capsys, code, what):
    def full(fd):
        raise OSError(code, os.strerror(code))

    def run_study(cfg, progress, fresh):  # the study's tables, written onto a full disk
        monkeypatch.setattr(atomic.os, "fsync", full)
        write_csv(Path(cfg.out) / "curves.csv", [{"it": 1}])

    monkeypatch.setattr(train_toy, "run_study", run_study)
    assert train_toy.main(["--out", str(tmp_path), "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert err.splitlines() == [
        f"error: {what} writing {tmp_path / 'curves.csv'}; the results finished before it are "
        "kept; the same command goes on from them"
    ]
    assert list(tmp_path.iterdir()) == []  # no partial curves.csv, no temporary file


def test_ctrl_c_is_one_line_and_the_workers_print_nothing(tmp_path):
    """A study of 2 worker processes, Ctrl-C'd (SIGINT to its process group, as a terminal
    sends it) while both run a task. The script takes Python's own Ctrl-C handler first: a
    pytest started in the background (`cmd &` without job control) passes SIGINT on ignored,
    and a Python started so never raises KeyboardInterrupt (a background job gets no Ctrl-C)."""
    script = f"""
import signal
signal.signal(signal.SIGINT, signal.default_int_handler)  # a terminal's foreground job
import time
from pathlib import Path
from studies.backend import Task, run_tasks
from studies.cli import one_line_stops

def task(i):
    Path({str(tmp_path)!r}, f"started{{i}}").touch()
    time.sleep(60)

@one_line_stops()
def main():
    run_tasks(task, [Task(str(i), (i,)) for i in range(2)], print, workers=2, progress=False)
    return 0

raise SystemExit(main())
"""
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, env=env, text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while len(list(tmp_path.glob("started*"))) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(list(tmp_path.glob("started*"))) == 2
        os.killpg(p.pid, signal.SIGINT)
        _, err = p.communicate(timeout=30)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(10)
    assert p.returncode == 130, err
    assert err.splitlines() == [
        "interrupted; the results finished before it are kept; the same command goes on from them"
    ]
