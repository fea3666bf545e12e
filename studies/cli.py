"""Command-line pieces shared by the studies: which flags the user gave, presets that fill only
the others, the output folder checked before any work, and the one line a study prints when a
full disk, a folder turned read-only or Ctrl-C stops it (:func:`one_line_stops`)."""

from __future__ import annotations

import argparse
import copy
import functools
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from hgpo.atomic import FILE_ERRNOS, file_error_line
from hgpo.options import check_writable_dir

__all__ = ["KEPT", "NET_DTYPES", "apply_preset", "check_out_dir", "given_dests", "one_line_stops"]

KEPT = "the results finished before it are kept; the same command goes on from them"
"""What a study keeps when it stops (each finished piece is written as it finishes)."""

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


def one_line_stops(
    kept: str = KEPT,
) -> Callable[[Callable[..., int]], Callable[..., int]]:
    """Decorate a study's ``main``: a write that fails for want of room or rights (a full disk,
    a folder turned read-only: :data:`hgpo.atomic.FILE_ERRNOS`) prints ``error: <what> writing
    <file>; <kept>`` and returns 1; Ctrl-C prints ``interrupted; <kept>`` and returns 130
    (one line each, no traceback; the worker processes ignore Ctrl-C and are stopped by the
    study, studies.backend)."""

    def wrap(main: Callable[..., int]) -> Callable[..., int]:
        @functools.wraps(main)
        def run(*args: Any, **kwargs: Any) -> int:
            try:
                return main(*args, **kwargs)
            except OSError as e:
                if e.errno not in FILE_ERRNOS:
                    raise
                print(f"error: {file_error_line(e, 'the results folder')}; {kept}", file=sys.stderr)
                return 1
            except KeyboardInterrupt:
                print(f"interrupted; {kept}", file=sys.stderr)
                return 130

        return run

    return wrap
