"""The numba compile note (issue 27 item 14): printed only while the cache is mostly cold, and
the cache itself works: a second process loads the kernels instead of compiling them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from studies import compile_note as C


@pytest.mark.parametrize(
    ("cached", "local", "printed"),
    [((0, 35), True, True), ((10, 35), True, True), ((20, 35), True, False),
     ((35, 35), True, False), ((0, 35), False, False), ((0, 0), True, True)],
)  # fmt: skip
def test_the_note_is_printed_only_when_most_kernels_must_compile(
    monkeypatch, capsys, cached, local, printed
):
    monkeypatch.setattr(C, "cached_kernels", lambda: cached)
    assert C.note_numba_compile(local) is printed
    err = capsys.readouterr().err
    assert ("compiling the numba kernels" in err) is printed
    assert err.count("\n") == int(printed)


def test_cached_kernels_reads_numbas_cache_index():
    warm, total = C.cached_kernels()
    assert total >= 20 and 0 <= warm <= total  # (0, 0) would mean numba's cache is not readable


PROBE = """
import json, numpy as np
from toyenvs import _kernels as k
k.mix64(np.uint64(7))
s = k.mix64.stats
print(json.dumps({"hits": sum(s.cache_hits.values()), "misses": sum(s.cache_misses.values()),
                  "path": s.cache_path}))
"""


def test_a_second_process_loads_a_kernel_from_the_cache():
    """Two processes: the second must hit numba's on-disk cache (no compile). A cache that
    does not work (a source stamp that changes, an unwritable cache folder) fails here."""
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root)}

    def probe() -> dict:
        r = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True,
                           text=True, check=True, timeout=300)  # fmt: skip
        return json.loads(r.stdout)

    runs = [probe(), probe()]
    assert runs[1]["hits"] == 1 and runs[1]["misses"] == 0, runs
    assert C.cached_kernels()[0] >= 1
