"""Run the HiPER authors' public advantage code next to our ``hiper`` estimator and freeze the
result.

    python -m benchmarks.make_hiper_golden --ref-dir /tmp/hiper_ref [--cases 400] [--write]

This is NOT run in CI: it needs torch and a local copy of the authors' function, which this
repository does not ship. On random batches built to hit the edge cases (one-step and longer
trajectories, segments of one step and of several, intermediate, negative and zero rewards,
invalid actions, KEEP penalties in both modes, gamma and both lambdas at 0, 1 and between,
with and without the batch whitening, rows handed over in a shuffled order) it checks that
``compute_advantages("hiper", batch, values=V, <the case's options>)`` gives the authors'
numbers, and with ``--write`` stores the inputs and their outputs in
``tests/hgpo/data/hiper_golden.json`` for ``tests/hgpo/test_hiper_golden.py``.

Reference code (JonP07/HiPER-agent at commit 9d3c118bb38a690d41ec43fee70451af28b3affa, read
with the public-code tools; Apache-2.0; copy into ``--ref-dir`` only, never into this
repository):

- ``hiper_hae/core_hae.py``, whole, as ``<ref-dir>/hiper_hae/core_hae.py``;
- ``<ref-dir>/verl/__init__.py``: a stub defining ``DataProto`` (a class with ``.batch`` and
  ``.non_tensor_batch`` dicts), the only verl name core_hae imports.

What the glue hands ``compute_hae_advantage`` (their trainer builds the same fields from the
responses' tags, ``make_hae_masks_and_switch`` and ``compute_value_mask``):

1. ``non_tensor_batch``: ``traj_uid`` (our traj), ``turn_idx`` (our step), ``rewards`` (the
   environment rewards), ``is_action_valid`` (not invalid), ``dones`` (a trajectory's last
   step), ``switch`` (the segment starts ours derives, :func:`hgpo.hiper.hiper_segments`:
   the mapping is part of what is checked);
2. ``batch``: responses of 2-4 tokens, ``value_low`` = V on every token with
   ``value_mask_low`` on the first; in half the cases also ``value_high`` = V (their two-head
   path with equal heads), else none (their single-head fallback); no ``value_term``;
3. ``action_mask`` every response token (their fallback when the <action> tag is missing),
   ``subgoal_mask`` the first token, so a segment's first turn carries A^low + A^high on
   its first token and A^low on the others;
4. ``HAEConfig(gamma, lam_turn, lam_seg, norm_adv, keep_penalty, keep_penalty_mode,
   invalid_action_penalty_coef, bootstrap_truncated)``; consistency penalty 0.

The rows go to their code in a shuffled order (they sort by ``turn_idx`` within each
``traj_uid``); the outputs are put back in ours. Their code runs twice: as published (float32
tensors) and with "float32" replaced by "float64" in its source. Every row must equal the
float64 run to 1e-9 x max(1, |A|) (A^low, A^high, the sum, the low-level returns) or the
script reports a mismatch and exits 1; the float32 run is reported (max |diff|), as it is off
by float32 rounding, which the whitening amplifies where the advantages nearly tie.
"""

from __future__ import annotations

import argparse
import io
import sys
import types
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.golden_common import (
    case_step_batch,
    exec_source,
    golden_parser,
    golden_path,
    write_golden,
)
from hgpo import EstimatorConfig, StepBatch, compute_advantages, reference_config
from hgpo.hiper import HIPER_SOURCE, hiper_segments

GOLDEN = golden_path("hiper")
F64_TOL = 1e-9
F32_TOL = 1e-4
OUTPUTS = ("low", "high", "sum", "returns")


def load_reference(ref_dir: Path, float64: bool) -> types.ModuleType:
    """``<ref-dir>/hiper_hae/core_hae.py`` as a module (optionally float32 -> float64)."""
    sys.path.insert(0, str(ref_dir))  # for the verl stub
    name = f"ref_core_hae_{'f64' if float64 else 'f32'}"
    # register: its dataclass looks its module up
    return exec_source(ref_dir / "hiper_hae" / "core_hae.py", name, float64, register=True)


def random_case(rng: np.random.Generator) -> dict[str, Any]:
    """Inputs of one case: a batch, its values and the HiPER options."""
    group, traj, step, reward, invalid = [], [], [], [], []
    tid = 0
    for g in rng.choice(100, int(rng.integers(1, 4)), replace=False):
        for _ in range(int(rng.integers(1, 5))):
            T = int(rng.integers(1, 9))
            group += [int(g)] * T
            traj += [tid] * T
            step += list(range(T))
            r = rng.choice([0.0, 0.0, 0.0, 0.0, 1.0, 0.1, -0.5, 2.0], T)
            r[-1] = 10.0 if rng.random() < 0.4 else float(rng.choice([0.0, 0.0, -0.5, 1.0]))
            reward += [float(x) for x in r]
            invalid += [bool(x) for x in rng.random(T) < 0.2]
            tid += 1
    n = len(reward)
    values = np.float32(rng.normal(0.0, 2.0, n)).astype(np.float64)  # float32-exact
    return dict(
        gamma=float(rng.choice([0.95, 1.0, 0.5, 0.0])),
        lam_turn=float(rng.choice([1.0, 0.95, 0.0, 0.7])),
        lam_seg=float(rng.choice([0.95, 1.0, 0.5, 0.0])),
        norm_adv=bool(rng.random() < 0.6),
        segments=str(rng.choice(["reward", "reward", "step", "trajectory"])),
        keep_penalty=float(rng.choice([0.0, -0.3, -0.3, 0.2])),
        keep_penalty_mode=str(rng.choice(["normalized", "fixed"])),
        invalid_penalty=float(rng.choice([0.1, 0.0, 0.5])),
        bootstrap_truncated=bool(rng.random() < 0.5),
        two_heads=bool(rng.random() < 0.5),
        resp_len=[int(x) for x in rng.integers(2, 5, n)],
        order=[int(x) for x in rng.permutation(n)],
        group=group, traj=traj, step=step, reward=reward, invalid=invalid,
        values=values.tolist(),
    )  # fmt: skip


def case_batch(case: dict[str, Any]) -> StepBatch:
    """The StepBatch of one golden case (also used by tests/hgpo/test_hiper_golden.py)."""
    return case_step_batch(
        case,
        state=np.zeros(len(case["reward"]), dtype=np.int64),
        invalid=np.asarray(case["invalid"], dtype=bool),
    )


def case_config(case: dict[str, Any], assign: str = "action") -> EstimatorConfig:
    """Our options for the authors' settings of one case."""
    return reference_config(
        "hiper", gamma=case["gamma"], invalid_penalty=case["invalid_penalty"],
        hiper_lam_turn=case["lam_turn"], hiper_lam_seg=case["lam_seg"],
        hiper_norm=case["norm_adv"], hiper_segments=case["segments"],
        hiper_keep_penalty=case["keep_penalty"],
        hiper_keep_penalty_mode=case["keep_penalty_mode"], hiper_assign=assign,
    )  # fmt: skip


def ours(case: dict[str, Any]) -> dict[str, np.ndarray]:
    """Our A^low, A^high, their sum ("sum") and the low-level returns on one case."""
    batch, V = case_batch(case), np.asarray(case["values"])
    out = compute_advantages("hiper", batch, case_config(case), values=V)
    both = compute_advantages("hiper", batch, case_config(case, "sum"), values=V)
    d = out.diagnostics["hiper"]
    return {"low": out.advantages, "high": d["high"], "sum": both.advantages,
            "returns": out.returns}  # fmt: skip


def run_reference(case: dict[str, Any], core: types.ModuleType, float64: bool) -> dict:
    """Their ``compute_hae_advantage`` on one case (steps 1-4 of the module docstring), per row
    in our order."""
    import torch

    batch = case_batch(case)
    order = np.asarray(case["order"])  # their row j is our row order[j]
    n, L = batch.n_steps, 4
    dt = torch.float64 if float64 else torch.float32
    lens = np.asarray(case["resp_len"])[order]
    mask = torch.zeros((n, L), dtype=torch.bool)
    for j, m in enumerate(lens):
        mask[j, :m] = True
    V = torch.tensor(np.asarray(case["values"])[order], dtype=dt)
    first = torch.zeros((n, L), dtype=torch.bool)
    first[:, 0] = True
    tensors = {"responses": torch.ones((n, L), dtype=torch.long), "response_mask": mask,
               "value_low": V[:, None].expand(n, L).clone(), "value_mask_low": first}  # fmt: skip
    if case["two_heads"]:
        tensors |= {"value_high": V[:, None].expand(n, L).clone(), "value_mask_high": first}
    last = np.zeros(n, dtype=bool)
    last[batch.traj_start + batch.traj_len - 1] = True
    switch = hiper_segments(batch, case["segments"])
    nt = {"traj_uid": np.array([f"t{t}" for t in batch.traj[order]], dtype=object),
          "turn_idx": batch.step[order], "rewards": batch.reward[order],
          "is_action_valid": ~batch.invalid[order], "dones": last[order],
          "switch": switch[order]}  # fmt: skip
    cfg = core.HAEConfig(
        gamma=case["gamma"], lam_turn=case["lam_turn"], lam_seg=case["lam_seg"],
        norm_adv=case["norm_adv"], keep_penalty=case["keep_penalty"],
        keep_penalty_mode=case["keep_penalty_mode"],
        invalid_action_penalty_coef=case["invalid_penalty"],
        bootstrap_truncated=case["bootstrap_truncated"],
    )  # fmt: skip
    with redirect_stdout(io.StringIO()):  # (it prints "truncation: ...")
        out = core.compute_hae_advantage(core.DataProto(tensors, nt), cfg, action_mask=mask.clone(),
                                         subgoal_mask=first.clone())  # fmt: skip
    b = out.batch
    rows = torch.arange(n)
    lastpos = torch.as_tensor(lens - 1)
    theirs = {
        "low": b["advantages_low"][rows, lastpos],  # an action token only
        "high": b["advantages_high"][:, 0],  # 0 off a segment's first turn (hi_mask)
        "sum": b["advantages"][:, 0],  # action and (first turn) subgoal token
        "returns": b["returns_low"][:, 0],
    }
    back = np.empty(n, dtype=np.int64)
    back[order] = np.arange(n)
    return {k: v.double().numpy()[back] for k, v in theirs.items()}


def max_rel(a: np.ndarray, b: np.ndarray) -> float:
    """max |a - b| / max(1, |b|)."""
    return float((np.abs(a - b) / np.maximum(1.0, np.abs(b))).max(initial=0.0))


def _compare(args: argparse.Namespace, refs: tuple[types.ModuleType, types.ModuleType]) -> tuple:
    rng = np.random.default_rng(args.seed)
    worst64 = dict.fromkeys(OUTPUTS, 0.0)
    worst32 = dict.fromkeys(OUTPUTS, 0.0)
    bad, golden, rows = [], [], 0
    for c in range(args.cases):
        case = random_case(rng)
        a = ours(case)
        f32 = run_reference(case, refs[0], float64=False)
        f64 = run_reference(case, refs[1], float64=True)
        rows += len(case["reward"])
        for k in OUTPUTS:
            worst64[k] = max(worst64[k], float(np.abs(a[k] - f64[k]).max()))
            worst32[k] = max(worst32[k], float(np.abs(a[k] - f32[k]).max()))
            if max_rel(a[k], f64[k]) > F64_TOL:
                bad.append(
                    f"case {c}: {k} differs from the float64 run by {max_rel(a[k], f64[k]):.3g}"
                )
        if args.write and c < args.golden_cases:
            golden.append({**case, **{f"reference_f64_{k}": f64[k].tolist() for k in OUTPUTS},
                           **{f"reference_f32_{k}": f32[k].tolist() for k in OUTPUTS}})  # fmt: skip
    return rows, worst64, worst32, bad, golden


ABOUT = (
    "Inputs and the outputs of the HiPER authors' code (hiper_hae/core_hae.py: "
    "compute_hae_advantage) made by benchmarks/make_hiper_golden.py; reference_f64_* the "
    "code with float32 replaced by float64, reference_f32_* as published (float32): low = "
    "advantages_low on an action token, high = advantages_high on the subgoal token, sum = "
    "advantages on a token in both masks, returns = returns_low."
)


def main(argv: list[str] | None = None) -> int:
    args = golden_parser(
        __doc__, GOLDEN, golden_cases=32, golden_help="cases in the file",
        ref_help="folder with hiper_hae/core_hae.py and verl/__init__.py",
    ).parse_args(argv)  # fmt: skip
    import torch

    torch.set_num_threads(1)
    refs = (load_reference(args.ref_dir, False), load_reference(args.ref_dir, True))
    rows, w64, w32, bad, golden = _compare(args, refs)
    fmt = ", ".join
    print(f"hiper  {args.cases} cases, {rows} rows; max |ours - float64 run|: "
          f"{fmt(f'{k} {v:.2g}' for k, v in w64.items())}")  # fmt: skip
    print(f"       max |ours - float32 run (as published)|: "
          f"{fmt(f'{k} {v:.2g}' for k, v in w32.items())}")  # fmt: skip
    for line in bad:
        print("MISMATCH", line)
    if args.write:
        write_golden(GOLDEN, ABOUT, HIPER_SOURCE, args.seed, golden)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
