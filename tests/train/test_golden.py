"""The tiny run gives the recorded figures (tests/train/tiny_golden.py says how they were made).

The figures were recorded before the training loop's redesign, so this test shows that the
redesign left every metric of the first 3 iterations unchanged (same seed; timings aside).
"""

from __future__ import annotations

import json

import pytest

from tests.train.conftest import ROOT
from tests.train.tiny_golden import DATA, RUNS, run


@pytest.mark.parametrize("name", list(RUNS))
def test_tiny_run_gives_the_recorded_metrics(name, tmp_path):
    want = json.loads(DATA.read_text())[name]
    assert want["args"] == RUNS[name]
    got = run(RUNS[name], ROOT, tmp_path / name)
    assert len(got) == len(want["rows"]) == 3
    for g, w in zip(got, want["rows"], strict=True):
        assert sorted(g) == sorted(w), g["iteration"]
        for k, v in w.items():
            assert g[k] == pytest.approx(v, rel=1e-6, abs=1e-9), (g["iteration"], k)
