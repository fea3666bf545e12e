"""Small file helpers shared by the studies: CSV tables, JSON, text and figures written
atomically (:mod:`hgpo.atomic`: a kill or a full disk leaves the old file or the new one,
never half of one), result keys, and the settings file that keeps one study's results folder
from being written by another.

Every result file of a study goes through :func:`write_csv`, :func:`atomic_write_json`,
:func:`atomic_write_text` or :func:`save_figure` (tests/studies/test_io_atomic.py checks the
sources for direct writes)."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

from hgpo.atomic import atomic_open, atomic_write_text

__all__ = [
    "SETTINGS_FILE",
    "atomic_open",
    "atomic_write_json",
    "atomic_write_text",
    "check_results_dir",
    "claim_results_dir",
    "finished_dir",
    "plain",
    "result_key",
    "save_figure",
    "write_csv",
]


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
    """Rows of dicts as CSV, written atomically; the columns are the union of the keys, in
    first-seen order, and list values are written as JSON."""
    cols: list[str] = []
    for r in rows:
        cols += [c for c in r if c not in cols]
    with atomic_open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols)
        w.writeheader()
        for r in rows:
            w.writerow({k: json.dumps(v) if isinstance(v, list) else v for k, v in r.items()})


def atomic_write_json(path: Path, obj: Any, indent: int | None = None) -> None:
    """Write JSON to a temporary file in the same folder, fsync, then rename over ``path``: a
    kill leaves either the old file or the new one, never half of one. NaN and infinities are
    written as JSON's ``NaN``/``Infinity``; numpy values as plain ones (:func:`plain`)."""
    with atomic_open(path, "w") as f:
        json.dump(obj, f, allow_nan=True, default=plain, indent=indent)


def save_figure(fig: Any, path: Path, **kwargs: Any) -> None:
    """``fig.savefig`` to ``path`` atomically (the format from the suffix; ``kwargs`` as
    savefig's)."""
    path = Path(path)
    with atomic_open(path, "wb") as f:
        fig.savefig(f, format=path.suffix.lstrip(".") or None, **kwargs)


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


SETTINGS_FILE = "settings.json"
"""The settings of the study whose results a folder holds (written before its first piece)."""


def _as_json(settings: Any) -> Any:
    return json.loads(json.dumps(settings, sort_keys=True, default=plain))


def check_results_dir(
    path: Path, study: str, settings: dict[str, Any], fresh: bool, results: tuple[str, ...],
    flag: str = "--out",
) -> None:  # fmt: skip
    """A ValueError naming ``flag`` and ``--fresh`` when folder ``path`` holds the results of a
    ``study`` run made with other ``settings`` (its :data:`SETTINGS_FILE` differs), or results
    without a settings file (any of the files ``results``; a folder made before the file was
    written). Nothing is written; ``fresh`` (the results are to be replaced) passes always."""
    path = Path(path)
    if fresh or not path.is_dir():
        return
    saved_file = path / SETTINGS_FILE
    if not saved_file.exists():
        held = [name for name in results if (path / name).exists()]
        if held:
            raise ValueError(
                f"{flag}: {str(path)!r} holds results ({held[0]}) of a run whose settings were "
                f"not recorded; give another {flag}, or --fresh to replace them"
            )
        return
    try:
        saved = json.loads(saved_file.read_text())
    except (OSError, json.JSONDecodeError):
        saved = {}
    want = {"study": study, "settings": _as_json(settings)}
    if saved != want:
        old = saved.get("settings", {}) if saved.get("study") == study else {}
        diff = sorted(k for k in {*old, *want["settings"]} if old.get(k) != want["settings"].get(k))
        what = f"settings that differ: {', '.join(diff)}" if old else f"not a {study} run"
        raise ValueError(
            f"{flag}: {str(path)!r} holds the results of another run ({what}); give another "
            f"{flag}, or --fresh to replace them"
        )


def claim_results_dir(
    path: Path, study: str, settings: dict[str, Any], fresh: bool, results: tuple[str, ...],
    flag: str = "--out",
) -> None:  # fmt: skip
    """:func:`check_results_dir`, then write the folder's :data:`SETTINGS_FILE` (before any
    piece of the run, so that a killed run's folder is resumed only with its own settings)."""
    check_results_dir(path, study, settings, fresh, results, flag)
    Path(path).mkdir(parents=True, exist_ok=True)
    atomic_write_json(Path(path) / SETTINGS_FILE, {"study": study, "settings": _as_json(settings)})
