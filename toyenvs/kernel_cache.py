"""Whether toyenvs' numba kernels are already compiled in numba's cache (nothing is compiled).

toyenvs compiles its kernels with ``numba.njit(cache=True)``: the first process on a machine
compiles them and writes the machine code next to the sources (``toyenvs/__pycache__``) or, where
that folder cannot be written, in numba's user-wide cache. ``studies.compile_note`` reads
:func:`cached_kernels` to say so before a study's first cell.
"""

from __future__ import annotations

import contextlib

from toyenvs import _kernels

try:  # numba's internals: without them the cache is not read (0, 0)
    from numba.core.registry import CPUDispatcher
except ImportError:  # pragma: no cover
    CPUDispatcher = None

__all__ = ["cached_kernels"]


def cached_kernels() -> tuple[int, int]:
    """(kernels of ``toyenvs._kernels`` whose numba cache holds compiled code for this Python
    and these sources, kernels in all); (0, 0) when numba's cache cannot be read this way.

    Reads each kernel's cache index only (a few small files; nothing is compiled).
    """
    if CPUDispatcher is None:  # pragma: no cover
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
