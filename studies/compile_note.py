"""The one line a study prints before its first cell when toyenvs' numba kernels must be compiled.

toyenvs compiles its kernels with ``numba.njit(cache=True)``: the first process on a machine
(a fresh clone, a new install, another Python) compiles them (15 s on 2 cores at load 3, up
to about 80 s under a heavy load; docs/bias_variance.md), and writes the machine code next to the sources
(``toyenvs/__pycache__``) or, where that folder cannot be written (a read-only install), in
numba's user-wide cache; every later process loads it in a fraction of a second. A study whose
first progress line would otherwise sit at 0% for that minute says why first
(:func:`toyenvs.kernel_cache.cached_kernels` reads numba's cache; re-exported here).
"""

from __future__ import annotations

import sys

from toyenvs.kernel_cache import cached_kernels

__all__ = ["COMPILE_SECONDS", "cached_kernels", "note_numba_compile"]

COMPILE_SECONDS = "15-80"
"""How long the first compile takes on 2 shared cores (docs/bias_variance.md: 15 s at load 3;
77 s was seen at load 4-8)."""


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
