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
``<prog>: error: <message> (see --help)`` (exit status 2), not the usage first. A package that
an optional extra installs is asked for with :func:`require_extras`, whose error names the
missing modules and the one ``pip install -e ".[extra,...]"`` that installs them.

Declarative configs: a dataclass field made with :func:`setting` carries its bounds, choices,
section and help in its metadata; :func:`check_fields` checks every field of an instance with
the helpers above, and :func:`add_flags` builds one ``--field-name`` flag per field, one
argument group per section.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import functools
import importlib.util
import inspect
import itertools
import math
import numbers
import os
import sys
import tempfile
import typing
from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType
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
    ``python -m pkg.mod`` (not ``mod.py``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if not args and kwargs.get("prog") is None:
            spec = getattr(sys.modules.get("__main__"), "__spec__", None)
            name = getattr(spec, "name", "").removesuffix(".__main__")
            if name and name != "__main__":
                kwargs["prog"] = f"python -m {name}"
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        """Print ``<prog>: error: <message> (see --help)`` and exit with status 2."""
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


EXTRAS: dict[str, tuple[str, ...]] = {
    "llm": ("torch", "transformers", "deepspeed"),
    "webshop": ("bm25s", "rapidfuzz"),
    "alfworld": ("alfworld", "textworld", "fast_downward"),
    "ray": ("ray",),
    "gpu": ("vllm",),
    "verl": ("verl", "fastapi", "uvicorn"),
}
"""Per optional extra of pyproject.toml: the top-level modules the project imports from it."""


class MissingExtraError(OptionError, ImportError):
    """An optional extra is not installed; the message names the modules and the pip command.
    An ``ImportError`` (code that tolerates a missing package keeps doing so) and a
    ``ValueError`` (a CLI prints it as its one-line error)."""


def installed(module: str) -> bool:
    """Whether top-level ``module`` can be imported (looked up, not imported)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a finder that refuses the name; a broken __spec__
        return False


def require_extras(what: str, *extras: str) -> None:
    """Raise :class:`MissingExtraError` when a module of one of ``extras`` is missing:
    ``"<what> needs torch (the [llm] extra) and bm25s (the [webshop] extra); install them with
    pip install -e \".[llm,webshop]\""``. Only the extras that miss something are named."""
    missing = {}
    for extra in extras:
        if extra not in EXTRAS:
            raise bad("require_extras: extra", "one of " + ", ".join(EXTRAS), extra)
        gone = [m for m in EXTRAS[extra] if not installed(m)]
        if gone:
            missing[extra] = gone
    if missing:
        parts = [f"{', '.join(mods)} (the [{extra}] extra)" for extra, mods in missing.items()]
        them = "it" if len(missing) == 1 else "them"
        raise MissingExtraError(
            f"{what} needs {' and '.join(parts)}; install {them} with "
            f'pip install -e ".[{",".join(missing)}]"'
        )


def exit_on_missing_extras(what: str, *extras: str) -> None:
    """:func:`require_extras` for a command line: its error is printed as ``error: ...`` on
    stderr and the process exits with status 2 (no traceback)."""
    try:
        require_extras(what, *extras)
    except MissingExtraError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None


# --- declarative configs ------------------------------------------------------------------------
SETTING = "hgpo.setting"
"""Key of a :class:`Setting` in a dataclass field's metadata."""


@dataclasses.dataclass(frozen=True)
class Setting:
    """What :func:`setting` stores in a field's metadata."""

    bounds: Mapping[str, Any]
    """Keywords of :func:`check_int` (``lo``, ``hi``) or :func:`check_number` (and
    ``lo_open``, ``hi_open``); only the ones given."""
    choices: tuple[Any, ...] | None
    """The values a field may take (:func:`check_choice`), None for any."""
    section: str | None
    """The ``--help`` group of the field's flag (None: the parser's own options)."""
    help: str | None
    """The flag's help; None takes the field's docstring (:func:`field_docs`)."""


def setting(
    default: Any,
    *,
    lo: float | None = None,
    hi: float | None = None,
    lo_open: bool = False,
    hi_open: bool = False,
    choices: Iterable[Any] | None = None,
    section: str | None = None,
    help: str | None = None,
) -> Any:
    """A dataclass field with ``default`` whose metadata declares how it is checked
    (:func:`check_fields`) and shown on the command line (:func:`add_flags`).

    Example::

        @dataclass(frozen=True)
        class RunConfig:
            steps: int = setting(100, lo=1, hi=10_000, section="run")
            \"\"\"Steps of the run.\"\"\"
            lr: float = setting(1e-3, lo=0, lo_open=True, section="optimizer")
            \"\"\"Learning rate.\"\"\"
            device: str = setting("cpu", choices=("cpu", "cuda"), section="run")
            \"\"\"Where to run.\"\"\"

            def __post_init__(self) -> None:
                check_fields(self, "RunConfig")  # RunConfig(steps=0): "RunConfig.steps:
                # must be an integer in 1..10000, got 0"

    ``add_flags(parser, RunConfig)`` then adds ``--steps INT`` and ``--device STR`` under a
    "run" header and ``--lr FLOAT`` under "optimizer".
    """
    bounds: dict[str, Any] = {}
    if lo is not None:
        bounds["lo"] = lo
    if hi is not None:
        bounds["hi"] = hi
    if lo_open:
        bounds["lo_open"] = True
    if hi_open:
        bounds["hi_open"] = True
    meta = Setting(
        bounds=MappingProxyType(bounds),
        choices=None if choices is None else tuple(choices),
        section=section,
        help=help,
    )
    return dataclasses.field(default=default, metadata={SETTING: meta})


def in_section(title: str) -> Callable[..., Any]:
    """:func:`setting` with ``section=title``: ``_rollout = in_section("rollout")``, then
    ``group_size: int = _rollout(8, lo=1)``."""
    return functools.partial(setting, section=title)


def _setting_of(f: dataclasses.Field[Any]) -> Setting:
    return f.metadata.get(SETTING) or Setting(MappingProxyType({}), None, None, None)


@functools.cache
def field_types(cls: type) -> dict[str, Any]:
    """``{field: type}`` of dataclass ``cls``, its annotations resolved (cached)."""
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def check_field(where: str, kind: Any, meta: Setting, value: Any) -> Any:
    """One field's check by its type: a bool (:func:`check_bool`), an int in its bounds
    (:func:`check_int`), a finite float in its bounds (:func:`check_number`), one of its
    choices (:func:`check_choice`), else a string. Returns the value as stored (an int given
    for a float field becomes a float)."""
    if kind is bool:
        return check_bool(where, value)
    if kind is int:
        return check_int(where, value, **meta.bounds)
    if kind is float:
        return check_number(where, value, **meta.bounds)
    if meta.choices is not None:
        return check_choice(where, value, meta.choices)
    if kind is not str:
        raise TypeError(f"{where}: check_fields knows bool, int, float and str fields, not {kind}")
    if not isinstance(value, str):
        raise bad(where, "a string", value)
    return value


def check_fields(config: Any, where_prefix: str) -> None:
    """Check every field of dataclass instance ``config`` by its type and :func:`setting`
    metadata (:func:`check_field`, errors named ``"<where_prefix>.<field>"``), in declaration
    order, and store each converted value (frozen dataclasses included)."""
    kinds = field_types(type(config))
    for f in dataclasses.fields(config):
        where = f"{where_prefix}.{f.name}"
        value = check_field(where, kinds[f.name], _setting_of(f), getattr(config, f.name))
        object.__setattr__(config, f.name, value)


def sections(config_cls: type) -> Mapping[str, tuple[str, ...]]:
    """Read-only ``{section: field names}`` of a dataclass, sections and fields in declaration
    order (fields without a section are left out)."""
    out: dict[str, tuple[str, ...]] = {}
    for f in dataclasses.fields(config_cls):
        title = _setting_of(f).section
        if title is not None:
            out[title] = (*out.get(title, ()), f.name)
    return MappingProxyType(out)


def field_bounds(config_cls: type) -> Mapping[str, Mapping[str, Any]]:
    """Read-only ``{field: bounds}`` of the fields of a dataclass that declare bounds."""
    return MappingProxyType(
        {
            f.name: _setting_of(f).bounds
            for f in dataclasses.fields(config_cls)
            if _setting_of(f).bounds
        }
    )


def field_choices(config_cls: type) -> Mapping[str, tuple[Any, ...]]:
    """Read-only ``{field: choices}`` of the fields of a dataclass that declare choices."""
    return MappingProxyType(
        {
            f.name: choices
            for f in dataclasses.fields(config_cls)
            if (choices := _setting_of(f).choices) is not None
        }
    )


def field_docs(cls: type) -> dict[str, str]:
    """Each field's docstring of dataclass ``cls`` (the string literal under the field in the
    class body, whitespace collapsed), e.g. for ``--help`` texts."""
    body = ast.parse(inspect.getsource(cls)).body[0].body  # type: ignore[attr-defined]
    docs: dict[str, str] = {}
    for node, nxt in itertools.pairwise(body):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(nxt, ast.Expr)
            and isinstance(nxt.value, ast.Constant)
            and isinstance(nxt.value.value, str)
        ):
            docs[node.target.id] = " ".join(nxt.value.value.split())
    return docs


def parse_bool(text: str) -> bool:
    """A boolean flag's value: 1/true/yes/on or 0/false/no/off (any case)."""
    low = text.lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def add_flags(
    parser: argparse.ArgumentParser,
    config_cls: type,
    *,
    help_format: str = "{doc} (default {default!r})",
    default: Any = argparse.SUPPRESS,
    skip: Iterable[str] = (),
    type_metavar: bool = True,
) -> dict[str, Any]:
    """Add one ``--field-name`` flag per field of dataclass ``config_cls`` (``dest`` the field's
    name), one argument group per section in declaration order (a field without a section goes
    to ``parser`` itself). A bool field's flag takes an optional BOOL (:func:`parse_bool`; alone
    it means true); any other field's flag converts with the field's type, named as its
    metavar (INT, FLOAT, STR). The help is ``help_format`` filled with ``doc`` (the setting's
    help, else the field's docstring) and ``default`` (the field's default). A flag not given
    leaves its ``dest`` unset (``default=argparse.SUPPRESS``) unless ``default`` says otherwise;
    ``default=FIELD_DEFAULT`` gives each flag its field's default. Fields named in ``skip`` get
    no flag (their flags are written by hand, e.g. an ``nargs="+"`` list, into the group
    returned); ``type_metavar=False`` leaves argparse's metavar (the dest in capitals).
    Returns ``{section: argument group}``.
    """
    skipped = set(skip)
    docs = field_docs(config_cls)
    groups = {title: parser.add_argument_group(title) for title in sections(config_cls)}
    kinds = field_types(config_cls)
    for f in dataclasses.fields(config_cls):
        if f.name in skipped:
            continue
        meta, kind = _setting_of(f), kinds[f.name]
        doc = meta.help if meta.help is not None else docs.get(f.name, "")
        kw: dict[str, Any] = {
            "dest": f.name,
            "default": f.default if default is FIELD_DEFAULT else default,
            "help": help_format.format(doc=doc, default=f.default),
        }
        target: Any = groups[meta.section] if meta.section is not None else parser
        flag = "--" + f.name.replace("_", "-")
        if kind is bool:
            kw.update(type=parse_bool, nargs="?", const=True, metavar="BOOL")
        else:
            kw.update(type=kind, metavar=kind.__name__.upper())
        if not type_metavar:
            del kw["metavar"]
        target.add_argument(flag, **kw)
    return groups


FIELD_DEFAULT: Any = object()
"""``add_flags(..., default=FIELD_DEFAULT)``: each flag defaults to its field's default."""
