"""studies.compare's cached cells and runs know which code of each estimator made them.

The sub-studies key a finished cell or run by its settings, in which an estimator is its
name; after a user edits a registered estimator, the same name would read back the old code's
cells. So each sub-study folder of a comparison (bias_variance/<policy>/, train_toy/<policy>/,
llm/) holds :data:`MANIFEST`, ``{estimator: code}`` for the cells and runs in it, the code
being :func:`estimator_code`: a hash of the estimator function's source (``inspect.getsource``;
where there is none, its code object's bytecode and constants) and, for an ``hgpo.estimators``
entry point, of its distribution's name and version. Before a sub-study runs,
:func:`drop_stale` deletes the cells and runs that hold an estimator whose code differs from
the one recorded, or was not recorded (a folder made before this file), and says so on
stderr: they are recomputed. The LLM runs are not deleted: a comparison whose ``llm/`` runs
were made by other code is refused before any work (:func:`check_llm_code`; --fresh or another
--out).

Only the estimator's own function is hashed: a helper it calls that changes is not seen
(edit the function, or run with --fresh).
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import sys
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

from hgpo.estimator_registry import ENTRY_POINT_GROUP, get_spec
from studies.io import atomic_write_json

__all__ = ["MANIFEST", "check_llm_code", "drop_stale", "estimator_code"]

MANIFEST = "estimator_code.json"


def _source(fn: Any) -> str:
    """The function's source, or its bytecode and constants (a partial: its function's and
    arguments)."""
    if isinstance(fn, functools.partial):
        return f"{_source(fn.func)} {fn.args!r} {sorted(fn.keywords.items())!r}"
    try:
        return inspect.getsource(fn)
    except (OSError, TypeError):
        code = getattr(fn, "__code__", None) or getattr(type(fn).__call__, "__code__", None)
        if code is None:
            return repr(fn)
        return f"{code.co_code.hex()} {code.co_consts!r}"


def _distribution(name: str) -> str:
    """``dist==version`` of the package whose entry point registered ``name`` (or "")."""
    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP, name=name):
        dist = getattr(ep, "dist", None)
        if dist is not None:
            return f"{dist.metadata['Name']}=={dist.version}"
    return ""


def estimator_code(name: str) -> str:
    """A short hash of registered estimator ``name``'s code (module docstring)."""
    spec = get_spec(name)
    blob = _source(spec.fn)
    if spec.origin.startswith("entry point"):
        blob += "\n" + spec.origin + "\n" + _distribution(name)
    return hashlib.sha1(blob.encode()).hexdigest()[:16]


def _read(path: Path) -> dict[str, str]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def drop_stale(
    folder: Path, pieces: str, estimators: tuple[str, ...], holds: Callable[[dict], set[str]]
) -> int:
    """Delete every ``folder/pieces/*.json`` that ``holds`` an estimator whose code is not
    the one :data:`MANIFEST` records (or is not recorded), then record the current code of
    ``estimators``; returns how many were deleted (said on stderr, with or without
    --no-progress)."""
    folder = Path(folder)
    recorded = _read(folder / MANIFEST)
    code = {e: estimator_code(e) for e in estimators}
    stale = {e for e in estimators if recorded.get(e) != code[e]}
    dropped = 0
    files = sorted((folder / pieces).glob("*.json")) if stale else []
    for path in files:
        held = holds(_read(path)) & stale
        if held:
            path.unlink()
            dropped += 1
    if dropped:
        changed = sorted(e for e in stale if e in recorded)
        unknown = sorted(e for e in stale if e not in recorded)
        why = [f"other code of estimator(s) {', '.join(changed)}"] if changed else []
        why += [f"unrecorded code (a folder from before the record) of estimator(s) "
                f"{', '.join(unknown)}"] if unknown else []  # fmt: skip
        print(f"studies.compare: {dropped} cached {pieces} in {folder / pieces} were made by "
              f"{' or by '.join(why)}: recomputing them", file=sys.stderr)  # fmt: skip
    if stale or not (folder / MANIFEST).exists():
        folder.mkdir(parents=True, exist_ok=True)
        atomic_write_json(folder / MANIFEST, {**recorded, **code})
    return dropped


def cell_estimators(cell: dict[str, Any]) -> set[str]:
    """The estimators of a bias/variance cell (its rows' labels)."""
    return {r.get("estimator") for r in cell.get("rows", ())}


def run_estimators(run: dict[str, Any]) -> set[str]:
    """The estimator of a training run."""
    return {run.get("estimator")}


def check_llm_code(folder: Path, estimators: tuple[str, ...], fresh: bool) -> None:
    """A ValueError when ``folder`` (llm/) holds runs and its :data:`MANIFEST` does not record
    the current code of every estimator compared (their truth figures came from other code)."""
    folder = Path(folder)
    if fresh or not any(folder.glob("*/metrics.jsonl")):
        return
    recorded = _read(folder / MANIFEST)
    stale = sorted(e for e in estimators if recorded.get(e) != estimator_code(e))
    if stale:
        raise ValueError(
            f"--llm: the LLM runs in {str(folder)!r} were made by other (or unrecorded) code of "
            f"estimator(s) {', '.join(stale)}; give --fresh to rerun them, or another --out"
        )


def record_llm_code(folder: Path, estimators: tuple[str, ...]) -> None:
    """Record the code of ``estimators`` for the LLM runs about to be made in ``folder``."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    code = {e: estimator_code(e) for e in estimators}
    atomic_write_json(folder / MANIFEST, {**_read(folder / MANIFEST), **code})
