"""Optional extras: which top-level modules each extra of pyproject.toml installs, and the one
guard that asks for them.

A package that an optional extra installs is asked for with :func:`require_extras`, whose error
names the missing modules and the one ``pip install -e ".[extra,...]"`` that installs them
(:func:`missing_extras_message` is that message, for code that raises its own error type);
:func:`exit_on_missing_extras` is the same check for a command line. :func:`installed` looks a
module up without importing it.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Mapping, Sequence

from hgpo.options import OptionError, bad

EXTRAS: dict[str, tuple[str, ...]] = {
    "llm": ("torch", "transformers", "deepspeed"),
    "webshop": ("bm25s",),
    "alfworld": ("alfworld", "textworld", "fast_downward"),
    "ray": ("ray",),
    "gpu": ("vllm",),
    "verl": ("verl", "fastapi", "uvicorn"),
    "smol": ("gguf",),
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
        raise MissingExtraError(missing_extras_message(what, missing))


def missing_extras_message(what: str, missing: Mapping[str, Sequence[str]]) -> str:
    """The one message for missing extras (``{extra: its missing modules}``), used by
    :func:`require_extras` and by any code that finds a module missing another way (an import
    that fails: ``agentenvs.ray_cluster.import_ray``)."""
    parts = [f"{', '.join(mods)} (the [{extra}] extra)" for extra, mods in missing.items()]
    them = "it" if len(missing) == 1 else "them"
    return (
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
