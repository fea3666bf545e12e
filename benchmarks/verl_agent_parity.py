"""Parity of hgpo.integrations.verl_agent with the authors' code on the frozen golden cases.

    python -m benchmarks.verl_agent_parity

Reads ``tests/hgpo/data/verl_agent_golden.json`` (the authors' public advantage code run on
random batches, as published in float32 and with float32 replaced by float64; see
benchmarks/make_verl_agent_golden.py), replays the authors' trainer glue on each case
(benchmarks/verl_agent_glue.py) in float64 and in float32 and feeds it through OUR functions
with the authors' signatures. Prints per estimator the rows, the rows within 1e-7 x max(1, |A|)
of the authors' float64 run (and the hgpo rows whose "A_k == 0" test rounding decides, which
may follow either run), the largest relative difference on the other rows, and the rows within
1e-6 and 2e-6 of the float32 run, with the rows on which our exact path agrees with both runs.
tests/integrations/test_verl_agent.py asserts the same criteria.
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np

from hgpo.options import ArgumentParser


def _parser() -> argparse.ArgumentParser:
    return ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)


def figures(case: dict) -> dict[str, float]:
    """The counts of one case (see the module docstring)."""
    from benchmarks.make_verl_agent_golden import classify, ours, rounding_decided
    from benchmarks.verl_agent_glue import authors_inputs, call_ours
    from hgpo.integrations import verl_agent

    f32, f64 = np.asarray(case["reference_f32"]), np.asarray(case["reference_f64"])
    a32, a64 = (call_ours(verl_agent, case, authors_inputs(case, f))[0][:, 0].double().numpy()
                for f in (False, True))  # fmt: skip
    rd = rounding_decided(case)
    rel64 = np.abs(a64 - f64) / np.maximum(1.0, np.abs(a64))
    rel32 = np.abs(a32 - f32) / np.maximum(1.0, np.abs(a32))
    both = (classify(ours(case), f32, f64) == 0) & ~rd
    return {"rows": len(f32), "f64 1e-7": int((rel64 <= 1e-7).sum()), "rounding": int(rd.sum()),
            "max rel f64": float(rel64[~rd].max(initial=0.0)),
            "f32 1e-6": int((rel32 <= 1e-6).sum()), "f32 2e-6": int((rel32 <= 2e-6).sum()),
            "exact agrees": int(both.sum()),
            "of those f32 2e-6": int((both & (rel32 <= 2e-6)).sum())}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    _parser().parse_args(argv)
    from benchmarks.make_verl_agent_golden import GOLDEN

    cases = json.loads(GOLDEN.read_text())["cases"]
    cols = ["rows", "f64 1e-7", "rounding", "max rel f64", "f32 1e-6", "f32 2e-6",
            "exact agrees", "of those f32 2e-6"]  # fmt: skip
    print(f"{'estimator':<9}" + "".join(f"{c:>18}" for c in cols))
    for est in ("hgpo", "gigpo", "grpo", "rloo"):
        tot = dict.fromkeys(cols, 0.0)
        for case in (c for c in cases if c["estimator"] == est):
            for k, v in figures(case).items():
                tot[k] = max(tot[k], v) if k == "max rel f64" else tot[k] + v
        cells = [f"{tot[c]:>18.2g}" if c == "max rel f64" else f"{int(tot[c]):>18d}" for c in cols]
        print(f"{est:<9}" + "".join(cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
