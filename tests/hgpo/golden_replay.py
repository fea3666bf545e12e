"""What the golden replay tests share: reading a frozen file of ``data/`` and checking our
advantages against the two runs of the authors' code it holds.

A case's ``reference_f32`` is their code as published (float32), ``reference_f64`` the same in
float64, and ``classes`` how many rows equalled both runs, the float64 one only, the float32
one only, neither, when the file was made (``benchmarks/golden_common.py``). The tolerances
are pinned here, not taken from the makers, so that loosening a maker does not loosen a test.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.golden_common import classify

DATA = Path(__file__).parent / "data"
F32_TOL = 1e-6
"""A row equals the float32 run within this x max(1, |A|)."""
F64_TOL = 1e-7
"""A row equals the float64 run within this x max(1, |A|)."""


def load_golden(name: str) -> dict[str, Any]:
    """The frozen file ``data/<name>_golden.json``."""
    return json.loads((DATA / f"{name}_golden.json").read_text())


def cases_of(golden: dict[str, Any], estimator: str) -> list[dict[str, Any]]:
    """The cases of one estimator in a file that holds several."""
    return [c for c in golden["cases"] if c["estimator"] == estimator]


def check_rows(
    a: np.ndarray, case: dict[str, Any], label: str, explained: np.ndarray | None = None
) -> np.ndarray:
    """Assert that every row of ``a`` equals the case's float64 run (or both runs), except the
    ``explained`` rows (where rounding decides the authors' code), and that the rows of each
    class are as many as when the file was made; returns the rows' classes."""
    f32, f64 = np.asarray(case["reference_f32"]), np.asarray(case["reference_f64"])
    cls = classify(a, f32, f64, f32_tol=F32_TOL, f64_tol=F64_TOL)
    off = cls >= 2
    if explained is not None:
        off &= ~explained
    assert not off.any(), (
        f"{label}: rows {np.flatnonzero(off).tolist()} differ from the reference code: "
        f"ours {a[off]}, float32 {f32[off]}, float64 {f64[off]}"
    )
    assert np.bincount(cls, minlength=4).tolist() == case["classes"], label
    return cls
