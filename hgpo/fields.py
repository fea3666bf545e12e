"""Declarative configs: each dataclass field declares its bounds, choices, ``--help`` section
and help in its metadata; one function checks every field, one builds the argparse flags.

A field made with :func:`setting` (or a section's shorthand, :func:`in_section`) carries a
:class:`Setting`; :func:`check_fields` checks every field of an instance with the validators of
:mod:`hgpo.options` (``check_int``, ``check_number``, ``check_choice``, ``check_bool``: the same
one-line ``<where>: must be <what>, got <value>`` errors), and :func:`add_flags` builds one
``--field-name`` flag per field, one argument group per section. :func:`sections`,
:func:`field_bounds` and :func:`field_choices` are read-only views of the declarations, for
code that lists them (docs, the trainer's ``SECTIONS``).
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import functools
import inspect
import itertools
import typing
from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType
from typing import Any

from hgpo.options import bad, check_bool, check_choice, check_int, check_number, parse_bool

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
