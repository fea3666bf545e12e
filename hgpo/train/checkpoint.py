"""Atomic files and checkpoints: a reader sees the old version or the new one, never half.

A checkpoint is a folder ``checkpoints/iter_{n:06d}`` written under a temporary name, every
file fsynced, then renamed into place; ``checkpoints/latest`` (a one-line file, itself replaced
atomically) names the newest complete one. A run killed at any moment leaves at worst a
``.tmp-*`` folder, which the next save removes.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

LATEST = "latest"


def fsync_dir(path: Path) -> None:
    """Flush a directory entry (the rename itself) to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file, fsync and rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def fsync_tree(root: Path) -> None:
    """fsync every file and folder under ``root``."""
    for dirpath, _, files in os.walk(root):
        for name in files:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(Path(dirpath))


def tmp_dir(ckpt_root: Path, iteration: int) -> Path:
    """A fresh temporary folder for checkpoint ``iteration`` (stale ones are removed)."""
    ckpt_root.mkdir(parents=True, exist_ok=True)
    tmp = ckpt_root / f".tmp-iter_{iteration:06d}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    return tmp


def commit(ckpt_root: Path, tmp: Path, iteration: int, keep: int) -> Path:
    """Publish ``tmp`` as checkpoint ``iteration``, point ``latest`` at it, prune old ones."""
    final = ckpt_root / f"iter_{iteration:06d}"
    fsync_tree(tmp)
    if final.exists():  # a re-run of the same iteration after a resume
        shutil.rmtree(final)
    os.replace(tmp, final)
    fsync_dir(ckpt_root)
    atomic_write_text(ckpt_root / LATEST, final.name + "\n")
    for old in sorted(ckpt_root.glob("iter_*"))[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    for stale in ckpt_root.glob(".tmp-*"):
        if stale != tmp:
            shutil.rmtree(stale, ignore_errors=True)
    return final


def latest(ckpt_root: Path) -> Path | None:
    """The newest complete checkpoint folder, or None."""
    marker = ckpt_root / LATEST
    if not marker.exists():
        return None
    path = ckpt_root / marker.read_text().strip()
    return path if path.is_dir() else None
