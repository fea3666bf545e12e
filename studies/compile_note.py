"""The one line a study prints before its first cell when toyenvs' numba kernels must be compiled.

toyenvs compiles its kernels with ``numba.njit(cache=True)``: the first process on a machine
(a fresh clone, a new install, another Python) compiles them (15 s on 2 cores at load 3, up
to about 80 s under a heavy load; docs/bias_variance.md), and writes the machine code next to the sources
(``toyenvs/__pycache__``) or, where that folder cannot be written (a read-only install), in
numba's user-wide cache; every later process loads it in a fraction of a second. A study whose
first progress line would otherwise sit at 0% for that minute says why first.
"""

from __future__ import annotations

import contextlib
import sys

__all__ = ["COMPILE_SECONDS", "cached_kernels", "note_numba_compile"]

COMPILE_SECONDS = "15-80"
"""How long the first compile takes on 2 shared cores (docs/bias_variance.md: 15 s at load 3;
77 s was seen at load 4-8)."""


def cached_kernels() -> tuple[int, int]:
    """(kernels of ``toyenvs._kernels`` whose numba cache holds compiled code for this Python
    and these sources, kernels in all); (0, 0) when numba's cache cannot be read this way.

    Reads each kernel's cache index only (a few small files; nothing is compiled).
    """
    try:
        from numba.core.registry import CPUDispatcher

        from toyenvs import _kernels
    except ImportError:
        return 0, 0
    warm = total = 0
    for obj in vars(_kernels).values():
        cache = getattr(obj, "_cache", None) if isinstance(obj, CPUDispatcher) else None
        load = getattr(getattr(cache, "_cache_file", None), "_load_index", None)
        if load is None:
            continue
        total += 1
        with contextlib.suppress(Exception):  # an unreadable index is a cold one
            warm += bool(load())
    return warm, total


def note_numba_compile(local: bool = True) -> bool:
    """Print (stderr) that the kernels compile first when fewer than half of them are in
    numba's cache (none: a first run on this machine); True if printed. ``local``: the study
    runs here (Ray nodes keep caches of their own and are not checked)."""
    if not local:
        return False
    warm, total = cached_kernels()
    if total and 2 * warm >= total:
        return False
    print(
        f"compiling the numba kernels ({total - warm} of {total} not cached; on a first run on "
        f"this machine that takes {COMPILE_SECONDS} s on 2 cores, by the load, before the first "
        "cell moves; cached afterwards)",
        file=sys.stderr,
        flush=True,
    )
    return True
