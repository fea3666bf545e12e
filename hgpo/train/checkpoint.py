"""Atomic files and checkpoints: a reader sees the old version or the new one, never half.

A checkpoint is a folder ``checkpoints/iter_{n:06d}`` written under a temporary name, every
file fsynced, then renamed into place; ``checkpoints/latest`` (a one-line file, itself replaced
atomically) names the newest complete one. A run killed at any moment leaves at worst a
``.tmp-*`` folder, which the next save removes.

The last file written into a checkpoint before it is published is :data:`MANIFEST`: the size
of every file in it, and the SHA-256 of each file up to :data:`HASH_MAX_BYTES` (the trainer's
state, the configs, the tokenizer, LoRA adapters; a truncated weight file shows in its size).
:func:`latest_good` checks it on ``--resume`` and passes over a damaged checkpoint (a file
cut short by a full disk, emptied, or missing) to the newest intact one.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
from pathlib import Path

from hgpo import atomic
from hgpo.atomic import fsync_dir

__all__ = [
    "HASH_MAX_BYTES",
    "LATEST",
    "MANIFEST",
    "atomic_write_text",
    "commit",
    "damage",
    "fsync_dir",
    "latest",
    "latest_good",
    "tmp_dir",
    "write_error",
    "write_manifest",
]

LATEST = "latest"
MANIFEST = "manifest.json"
"""A checkpoint's list of its files: ``{"files": {relative path: [bytes, sha256 or null]}}``."""
HASH_MAX_BYTES = 64 * 2**20
"""Files up to this size get a SHA-256 in the manifest; larger ones (weights, optimizer
states) are checked by their size only (hashing tens of GB would slow every save)."""


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file, fsync and rename (its folder is
    created if needed)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic.atomic_write_text(path, text)


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
    write_manifest(tmp)
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
    """The newest complete checkpoint folder (what ``latest`` names), or None."""
    marker = ckpt_root / LATEST
    if not marker.exists():
        return None
    try:
        name = marker.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None
    path = ckpt_root / name
    return path if name.startswith("iter_") and path.is_dir() else None


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(2**20):
            h.update(chunk)
    return h.hexdigest()


def write_manifest(folder: Path) -> None:
    """Record the size (and, up to :data:`HASH_MAX_BYTES`, the SHA-256) of every file in
    checkpoint ``folder`` in its :data:`MANIFEST`; called last, before the folder is
    published."""
    files = {}
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and p != folder / MANIFEST):
        size = path.stat().st_size
        files[path.relative_to(folder).as_posix()] = [
            size,
            _sha256(path) if size <= HASH_MAX_BYTES else None,
        ]
    atomic.atomic_write_text(folder / MANIFEST, json.dumps({"files": files}, indent=0) + "\n")


def damage(folder: Path) -> str | None:
    """What is wrong with checkpoint ``folder`` (a file missing, of another size or content
    than its :data:`MANIFEST` records, or an unreadable manifest), or None when it is intact.
    A checkpoint written before manifests were recorded is checked for a readable
    trainer_state.json only."""
    manifest = folder / MANIFEST
    if not manifest.exists():
        try:
            json.loads((folder / "trainer_state.json").read_text())["iteration"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            return f"trainer_state.json cannot be read ({type(e).__name__}: {e})"
        return None
    try:
        files = json.loads(manifest.read_text())["files"]
        entries = [(str(k), int(v[0]), v[1]) for k, v in files.items()]
    except (OSError, ValueError, KeyError, TypeError, IndexError, AttributeError) as e:
        return f"{MANIFEST} cannot be read ({type(e).__name__})"
    for rel, size, digest in entries:
        path = folder / rel
        if not path.is_file():
            return f"{rel} is missing"
        got = path.stat().st_size
        if got != size:
            return f"{rel} is {got} bytes, {size} were written"
        if digest is not None and _sha256(path) != digest:
            return f"{rel} differs from what was written (SHA-256)"
    return None


def latest_good(ckpt_root: Path) -> tuple[Path | None, list[tuple[Path, str]]]:
    """The newest intact checkpoint (None when there is none) and the damaged ones newer than
    it, each with what is wrong (:func:`damage`). ``latest`` is tried first, then the older
    ``iter_*`` folders, newest first (all of them when ``latest`` is missing or unreadable)."""
    marker = latest(ckpt_root)
    found = sorted(ckpt_root.glob("iter_*"), reverse=True) if ckpt_root.is_dir() else []
    if marker is not None:
        found = [marker] + [p for p in found if p.name < marker.name]
    damaged = []
    for path in found:
        if not path.is_dir():
            continue
        why = damage(path)
        if why is None:
            return path, damaged
        damaged.append((path, why))
    return None, damaged


TORCH_WRITE_FAILURES = ("unexpected pos", "file write failed", "PytorchStreamWriter failed")
"""What torch.save's RuntimeError says when the file could not be written (a full disk)."""

LOW_ROOM = 2**30
"""Free bytes under which a failed checkpoint write is put down to a full disk."""


def write_error(e: RuntimeError, folder: Path) -> OSError | None:
    """An OSError naming ``folder`` for torch's RuntimeError of a checkpoint file it could not
    write (``unexpected pos ...``: ENOSPC when the disk has under :data:`LOW_ROOM` free, EIO
    otherwise); None for any other RuntimeError."""
    text = str(e)
    if not any(s in text for s in TORCH_WRITE_FAILURES):
        return None
    try:
        full = shutil.disk_usage(folder if folder.exists() else folder.parent).free < LOW_ROOM
    except OSError:
        full = False
    code = errno.ENOSPC if full else errno.EIO
    first = text.strip().splitlines()[0] if text.strip() else type(e).__name__
    return OSError(code, f"{os.strerror(code)} (torch: {first[:120]})", str(folder))
