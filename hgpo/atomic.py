"""Atomic files: a reader (or the next run, after a kill or a full disk) finds the old version
of a file or the new one, never half of one.

:func:`atomic_open` writes a temporary file in the same folder (``<name>.<random>.tmp``),
flushes and fsyncs it, renames it over the path (``os.replace``) and fsyncs the folder; if
anything fails before the rename, the temporary file is removed and the old file is left as it
was. Every result file of the project (the trainer's checkpoints and logs, the studies' tables,
reports and figures) is written through it.

A write that fails for want of room or rights (:data:`FILE_ERRNOS`: a full disk, a folder
turned read-only) is an OSError naming the file; :func:`file_error_line` makes the one line
a command line prints for it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

__all__ = [
    "FILE_ERRNOS",
    "TMP_SUFFIX",
    "atomic_open",
    "atomic_write_bytes",
    "atomic_write_text",
    "file_error_line",
    "fsync_dir",
]

FILE_ERRNOS = frozenset(
    {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EIO}
)
"""The errors of a write the user must fix on the machine (room, rights, the disk), not in the
code."""

TMP_SUFFIX = ".tmp"
"""The suffix of a write in progress (a kill leaves ``<name>.<random>.tmp``)."""


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """Flush a folder's entries (a rename in it) to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike[str], mode: str = "w", **kwargs: Any) -> Iterator[IO[Any]]:
    """Open a temporary file next to ``path`` for writing (``mode`` "w" or "wb", ``kwargs`` as
    :func:`open`'s); when the block ends without an exception, fsync it and rename it over
    ``path``. On an exception the temporary file is removed and ``path`` is untouched."""
    if mode not in ("w", "wb"):
        raise ValueError(f"atomic_open: mode must be 'w' or 'wb', got {mode!r}")
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f"{path.name}.", suffix=TMP_SUFFIX)
    try:
        with os.fdopen(fd, mode, **kwargs) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        Path(tmp).unlink(missing_ok=True)
        if e.filename is None:  # a write or flush that failed (a full disk): name the file
            raise OSError(e.errno, e.strerror, str(path)) from e
        raise
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    """Write ``text`` to ``path`` atomically (:func:`atomic_open`)."""
    with atomic_open(path, "w") as f:
        f.write(text)


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (:func:`atomic_open`)."""
    with atomic_open(path, "wb") as f:
        f.write(data)


def file_error_line(e: OSError, where: str | os.PathLike[str]) -> str:
    """One line for a write that failed with ``e`` (one of :data:`FILE_ERRNOS`): what went
    wrong and the file (``e.filename``, else ``where``), without "error: " and what was kept."""
    name = errno.errorcode.get(e.errno or 0, "")
    what = (e.strerror or str(e)).lower() + (f" ({name})" if name else "")
    return f"{what} writing {e.filename or where}"
