"""Command-line pieces shared by the studies: which flags the user gave, presets that fill only
the others, and the output folder checked before any work."""

from __future__ import annotations

import argparse
import copy
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hgpo.options import check_writable_dir

__all__ = ["NET_DTYPES", "apply_preset", "check_out_dir", "given_dests"]

NET_DTYPES = ("float32", "float64")
"""A network policy's precisions (toyenvs.neural.DTYPES), named here without importing torch."""


def given_dests(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> set[str]:
    """The ``dest`` of every option given on ``argv`` (in any spelling argparse accepts:
    ``--flag value``, ``--flag=value``), found by parsing again with every default removed."""
    probe = copy.deepcopy(parser)
    for action in probe._actions:
        action.default = argparse.SUPPRESS
    return set(vars(probe.parse_args(argv)))


def apply_preset(values: dict[str, Any], preset: dict[str, Any], given: set[str]) -> dict[str, Any]:
    """``values`` with ``preset`` applied to the fields the user did not give: a preset
    (``--quick``, ``--full``) never replaces an explicit flag, valid or not."""
    return {**values, **{k: v for k, v in preset.items() if k not in given}}


def check_out_dir(path: str | Path, flag: str = "--out") -> Path:
    """Create folder ``path`` if needed and check a file can be written in it, before any work;
    a ValueError naming ``flag`` otherwise (:func:`hgpo.options.check_writable_dir`)."""
    check_writable_dir(flag, path, flag)
    return Path(path)
