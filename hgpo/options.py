"""The one ``name=value`` parser and the one validator style for every config in the project.

Every config (``EstimatorConfig``, the trainer's ``TrainConfig``, the studies' configs) checks
its fields with these helpers, and every ``"name=value,name=value"`` string on a command line
(``--estimator-options``, ``--settings hgpo:alpha=2``, ``--envs keydoor:size=5``) goes through
:func:`parse_name_values`. So one value converts the same way everywhere, and every bad value
gives the same one-line error: ``<where>: must be <what>, got <value>``.

Numbers: booleans are refused where a number is asked for (``True`` is an ``int`` in Python);
numpy scalars (``np.int64(2)``, ``np.float32(1.0)``) are accepted and returned as Python
numbers; NaN and infinities are refused unless the caller allows them.

Command lines: every CLI's parser is an :class:`ArgumentParser`, whose errors are the one line
``<prog>: error: <message> (see --help)`` (exit status 2), not the usage first; a boolean
flag's value goes through :func:`parse_bool`.

Neighbours: the declarative field mechanism built on these checks (``setting``,
``check_fields``, ``add_flags``) is :mod:`hgpo.fields`; the guard for optional extras
(``require_extras``) is :mod:`hgpo.extras`.
"""

from __future__ import annotations

import argparse
import math
import numbers
import os
import sys
import tempfile
from collections.abc import Iterable
from typing import Any, NoReturn

import numpy as np


class OptionError(ValueError):
    """A bad option value; the message names the option and the value."""


def bad(where: str, must: str, got: Any) -> OptionError:
    """The project's one error shape: ``"<where>: must be <must>, got <got!r>"``."""
    return OptionError(f"{where}: must be {must}, got {got!r}")


def parse_value(raw: str) -> bool | int | float | str:
    """``"true"``/``"false"`` -> bool, then int, then float, else the string itself (stripped).

    ``"nan"``/``"inf"`` become floats here; the config that receives them refuses them with its
    field's name (a parser cannot know which fields may be infinite).
    """
    text = raw.strip()
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    for conv in (int, float):
        try:
            return conv(text)
        except ValueError:
            pass
    return text


def parse_name_values(text: str, *, where: str = "options") -> dict[str, Any]:
    """``"a=1,b=mean"`` -> ``{"a": 1, "b": "mean"}``, each value through :func:`parse_value`.

    Empty items are skipped; an item without ``=``, an empty name or a name given twice is an
    :class:`OptionError` naming ``where`` and the item.
    """
    if not isinstance(text, str):
        raise bad(where, 'a string "name=value,..."', text)
    out: dict[str, Any] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, eq, raw = part.partition("=")
        key = key.strip()
        if not eq or not key:
            raise bad(where, "name=value items separated by commas", part)
        if key in out:
            raise OptionError(f"{where}: {key!r} is given twice in {text!r}")
        if not raw.strip():
            raise OptionError(f"{where}: {key!r} has no value in {part!r}; give {key}=VALUE")
        out[key] = parse_value(raw)
    return out


def _is_int(value: Any) -> bool:
    # (exact types first: an isinstance against the numbers ABCs costs a microsecond)
    return type(value) is int or (
        isinstance(value, numbers.Integral) and not isinstance(value, bool)
    )


def _is_real(value: Any) -> bool:
    return type(value) in (float, int) or (
        isinstance(value, numbers.Real) and not isinstance(value, bool)
    )


def check_int(where: str, value: Any, *, lo: int | None = None, hi: int | None = None) -> int:
    """``value`` as a Python int in ``[lo, hi]`` (either bound optional); numpy ints accepted."""
    if not _is_int(value) or (lo is not None and value < lo) or (hi is not None and value > hi):
        if lo is not None and hi is not None:
            must = f"an integer in {lo}..{hi}"
        elif lo is not None:
            must = f"an integer >= {lo}"
        elif hi is not None:
            must = f"an integer <= {hi}"
        else:
            must = "an integer"
        raise bad(where, must, value)
    return int(value)


def check_number(
    where: str,
    value: Any,
    *,
    lo: float | None = None,
    hi: float | None = None,
    lo_open: bool = False,
    hi_open: bool = False,
    finite: bool = True,
) -> float:
    """``value`` as a finite Python float within the bounds; numpy scalars accepted.

    ``lo_open``/``hi_open`` make a bound strict. ``finite=False`` lets ``+-inf`` through (never
    NaN) for the rare option where infinity means "no limit".
    """
    ok = _is_real(value) and not math.isnan(value) and (not finite or math.isfinite(value))
    if ok and lo is not None:
        ok = value > lo if lo_open else value >= lo
    if ok and hi is not None:
        ok = value < hi if hi_open else value <= hi
    if not ok:
        parts = []
        if lo is not None and hi is not None:
            parts.append(f"in {'(' if lo_open else '['}{lo}, {hi}{')' if hi_open else ']'}")
        elif lo is not None:
            parts.append(f"{'>' if lo_open else '>='} {lo}")
        elif hi is not None:
            parts.append(f"{'<' if hi_open else '<='} {hi}")
        must = ("a finite number" if finite else "a number") + (" " + parts[0] if parts else "")
        raise bad(where, must, value)
    return float(value)


def check_int_array(where: str, value: Any) -> np.ndarray:
    """``value`` as an int64 array of integers as given: a float (even 1.0), a bool, a string
    or None is an OptionError naming ``where``, never truncated."""
    try:
        arr = np.asarray(value)
    except (ValueError, TypeError):  # ragged nesting
        raise bad(where, "an array of integers", value) from None
    if arr.dtype.kind not in "iu":
        shown = arr.tolist() if arr.size <= 8 else f"a {arr.dtype} array"
        raise bad(where, "an array of integers", shown)
    if arr.dtype.kind == "u" and arr.size and arr.max() > np.iinfo(np.int64).max:
        raise bad(where, "integers in the int64 range", int(arr.max()))
    return arr.astype(np.int64, copy=False)


def check_writable_dir(where: str, path: str | os.PathLike[str], flag: str) -> None:
    """Folder ``path`` exists (or can be made) and a file can be written in it, else an
    OptionError naming ``where`` and the flag to change, before any work (a path under /proc,
    a read-only folder, a file). The probe is a temporary file, gone even after a kill."""
    if os.path.exists(path) and not os.path.isdir(path):
        raise OptionError(
            f"{where}: {str(path)!r} exists and is not a folder; give a writable {flag}"
        )
    try:
        os.makedirs(path, exist_ok=True)
        with tempfile.TemporaryFile(dir=path, prefix=".write-check-"):
            pass
    except OSError as e:
        raise OptionError(
            f"{where}: cannot write to {str(path)!r} ({e.strerror or type(e).__name__}); "
            f"give a writable {flag}"
        ) from None


def check_choice(where: str, value: Any, choices: Iterable[Any]) -> Any:
    """The one of ``choices`` that ``value`` equals (a numpy string gives the plain one), else
    an error listing them; a value of another kind (an array, True for 1) never matches."""
    options = tuple(choices)
    for c in options:
        if _same_kind(value, c) and value == c:
            return c
    raise bad(where, "one of " + ", ".join(repr(c) for c in options), value)


def _same_kind(value: Any, choice: Any) -> bool:
    """Whether ``value`` may be compared with ``choice``: both strings, both bools, both
    numbers (numpy scalars included; a bool is not a number here), else the same type."""
    if isinstance(value, bool | np.bool_) or isinstance(choice, bool):
        return isinstance(value, bool | np.bool_) and isinstance(choice, bool)
    if isinstance(choice, str):
        return isinstance(value, str)
    if isinstance(choice, numbers.Number):
        return isinstance(value, numbers.Number)
    return type(value) is type(choice)


def check_bool(where: str, value: Any) -> bool:
    """``value`` if it is a bool (numpy bools accepted)."""
    if type(value).__name__ not in ("bool", "bool_"):
        raise bad(where, "true or false", value)
    return bool(value)


class ArgumentParser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` whose error is one line: the message and a pointer to
    ``--help`` on stderr, exit status 2 (the usage, 19-41 lines for the project's CLIs, is what
    ``--help`` prints). Without a ``prog``, a module run with ``python -m pkg.mod`` is named
    ``python -m pkg.mod`` (not ``mod.py``). Flags are never abbreviated (``allow_abbrev``
    is False unless given): ``--iter 3`` is refused, not read as ``--iterations 3``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        if not args and kwargs.get("prog") is None:
            spec = getattr(sys.modules.get("__main__"), "__spec__", None)
            name = getattr(spec, "name", "").removesuffix(".__main__")
            if name and name != "__main__":
                kwargs["prog"] = f"python -m {name}"
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        """Print ``<prog>: error: <message> (see --help)`` and exit with status 2."""
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def parse_bool(text: str) -> bool:
    """A boolean flag's value: 1/true/yes/on or 0/false/no/off (any case)."""
    low = text.lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")
