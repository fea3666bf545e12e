"""Small file helpers shared by the studies: CSV tables and atomic JSON writes."""

from __future__ import annotations

import csv
import json
import os
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["atomic_write_json", "finished_dir", "plain", "result_key", "write_csv"]


def plain(x: Any) -> Any:
    """A numpy scalar or array as the Python value JSON writes (``json.dump``'s ``default``):
    int, float, bool or a list; a TypeError for anything else."""
    import numpy as np

    if isinstance(x, np.ndarray):
        return x.tolist()
    if isinstance(x, np.generic):
        return x.item()
    raise TypeError(f"{type(x).__name__} is not JSON serializable")


def write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    """Rows of dicts as CSV; the columns are the union of the keys, in first-seen order, and
    list values are written as JSON."""
    cols: list[str] = []
    for r in rows:
        cols += [c for c in r if c not in cols]
    with Path(path).open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols)
        w.writeheader()
        for r in rows:
            w.writerow({k: json.dumps(v) if isinstance(v, list) else v for k, v in r.items()})


def atomic_write_json(path: Path, obj: Any) -> None:
    """Write JSON to a temporary file in the same folder, fsync, then rename over ``path``: a
    kill leaves either the old file or the new one, never half of one."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(obj, f, allow_nan=True, default=plain)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def result_key(slug: str, settings: Any) -> str:
    """The file name of one finished piece of a study: ``slug`` with every character but
    letters, digits and ``-_.=`` made ``_``, then the first 10 hex digits of the SHA-1 of
    ``settings`` as sorted JSON (what changes the piece's result)."""
    import hashlib

    safe = "".join(ch if ch.isalnum() or ch in "-_.=" else "_" for ch in slug)
    blob = json.dumps(settings, sort_keys=True)
    return f"{safe}_{hashlib.sha1(blob.encode()).hexdigest()[:10]}"


def finished_dir(path: Path, fresh: bool) -> Path:
    """The folder where a study keeps its finished pieces (one JSON each, written by
    :func:`atomic_write_json`), so a killed study resumes: created if needed, its JSON files
    deleted when ``fresh``, and the temporary files of writes cut short by a kill removed."""
    path = Path(path)
    if fresh and path.exists():
        for p in path.glob("*.json"):
            p.unlink()
    path.mkdir(parents=True, exist_ok=True)
    for p in path.glob("*.tmp"):
        p.unlink()
    return path
