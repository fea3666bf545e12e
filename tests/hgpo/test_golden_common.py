"""The golden makers' shared loop, summary and options (benchmarks/golden_common.py), on a fake
reference: what CI can check of the makers without torch or the authors' code."""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from benchmarks.golden_common import (
    Tally,
    compare_cases,
    golden_entry,
    golden_parser,
    terminal_next_state,
)


def _reference(case: dict, float64: bool) -> np.ndarray:
    """float64: ours exactly, but row 2 off in case 3; float32: row 1 off by 1e-5."""
    a = np.asarray(case["a"], dtype=np.float64)
    if float64:
        return a + (np.arange(3) == 2) * (case["id"] == 3)
    return a + (np.arange(3) == 1) * 1e-5


def test_compare_cases_counts_flags_and_keeps():
    ids = iter(range(6))

    def random_case(rng: np.random.Generator) -> dict:
        return {"id": next(ids), "a": rng.normal(size=3).tolist()}

    args = argparse.Namespace(cases=6, seed=0, write=True, golden_cases=2, extra_cases=1)
    rep = compare_cases(args, random_case, lambda c: np.asarray(c["a"]), _reference)
    assert rep.counts.tolist() == [11, 6, 1, 0]  # row 0 both, row 1 float64 only, case 3 row 2
    assert [(b["case"], b["rows"], b["row"]) for b in rep.bad] == [(3, 1, 2)]
    assert [g["id"] for g in rep.golden] == [0, 1, 2]  # 2 first cases + 1 extra (cap)
    assert rep.golden[0]["classes"] == [2, 1, 0, 0]
    assert rep.golden[0]["reference_f32"] == [float(np.float32(x)) for x in _reference(
        rep.golden[0], False)]  # fmt: skip
    assert 9e-6 < rep.worst[1] < 1.1e-5 and rep.worst[0] < 1e-6
    assert rep.summary("x", 6) == (
        "x 6 cases, 18 rows; ours equals: both 11, float64 only 6, float32 only 1, neither 0"
    )
    assert rep.worst_text().startswith("max |ours - f32|: ")


def test_golden_entry_keeps_the_file_order():
    cls = np.array([0, 1])
    entry = golden_entry({"x": 1}, np.zeros(2), np.ones(2), cls, reference_shaped=[2.0])
    assert list(entry) == ["x", "reference_f32", "reference_f64", "reference_shaped", "classes"]
    assert entry["classes"] == [1, 1, 0, 0]
    assert Tally().add(np.zeros(2), np.zeros(2), np.zeros(2)).tolist() == [0, 0]


def test_terminal_next_state():
    case = {"state": [5, 6, 7, 8], "traj": [0, 0, 1, 1], "terminal": [9, 4]}
    assert terminal_next_state(case).tolist() == [6, 9, 8, 4]


def test_golden_parser_options():
    p = golden_parser("doc", Path("x_golden.json"), golden_cases=16, golden_help="h",
                      extra_cases=8)  # fmt: skip
    args = p.parse_args(["--ref-dir", "/r"])
    assert (args.cases, args.seed, args.write, args.golden_cases, args.extra_cases) == (
        400,
        0,
        False,
        16,
        8,
    )
    assert "write x_golden.json" in p.format_help()
    p2 = golden_parser("doc", Path("y.json"), golden_cases=8, golden_help="h", estimators={})
    assert not hasattr(p2.parse_args(["--ref-dir", "/r"]), "extra_cases")
    assert p2.parse_args(["--ref-dir", "/r", "--estimators", "a", "b"]).estimators == ["a", "b"]
