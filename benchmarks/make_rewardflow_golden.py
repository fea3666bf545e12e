"""Run the RewardFlow authors' code next to our ``rewardflow`` estimator and freeze the result.

    python -m benchmarks.make_rewardflow_golden --ref-dir /tmp/rewardflow_ref [--cases 400] [--write]

This is NOT run in CI: it needs torch, networkx and a local copy of the authors' functions,
which this repository does not ship. On random batches built to hit the edge cases (states
revisited within a trajectory and shared across trajectories, self-loops, states that only
self-loop, cycles, negative and intermediate rewards, terminal states that are states of the
group or new ones, invalid actions, several rollout groups, both modes) it checks that
``compute_advantages("rewardflow", batch, <the case's options>)`` gives the authors'
numbers, and with ``--write`` stores the inputs and their outputs in
``tests/hgpo/data/rewardflow_golden.json`` for ``tests/hgpo/test_rewardflow_golden.py``.

Reference code (tmlr-group/RewardFlow at commit 1cdead8ef1104fc56dbd8d6937de0b57c82cd047,
read with the public-code tools; copy into ``--ref-dir`` only, never into this repository):
- ``rewardflow/core_rewardflow.py`` and ``rewardflow/propagation.py``, whole;
- ``agent_system/multi_turn_rollout/utils.py``, whole, with empty
  ``agent_system/__init__.py`` and ``agent_system/multi_turn_rollout/__init__.py`` (the real
  one imports the rollout loop and with it vLLM);
- ``agent_system/environments/env_manager.py``, whole: it is parsed, never imported (it
  imports every environment); the generic ``state_preprocess`` and ``clean_trajectory`` of
  ``SokobanEnvironmentManager`` (the same code as ``SearchEnvironmentManager``'s) are
  compiled from it and bound to a small manager;
- ``verl/__init__.py``: a stub defining ``DataProto``, the only verl name they import.

What the glue does with one batch, as their trainer does (``TrajectoryCollector`` then
``compute_advantage``):

1. ``total_batch_list``: per trajectory its T active rows (``anchor_obs`` "obs <state>",
   ``rewards``, ``active_masks`` True, ``uid`` the rollout group) and inactive rows after
   them (``active_masks`` False) whose ``anchor_obs`` is the observation after the last step:
   "obs <next_state>" in the cases with a terminal column (our ``next_state``), else a string
   of that trajectory's own (our batch then has no ``next_state``). Every trajectory gets at
   least one inactive row, as when the rollout loop runs past the batch's longest episode
   (module docstring of hgpo/rewardflow.py: their loop stops when all are done). Groups have
   equal sizes and are contiguous, as their ``batch_idx = i * n_groups // n_traj`` assumes;
2. ``apply_rewardflow_propagation(total_batch_list, config, tokenizer, envs)`` with
   ``config.algorithm.gamma`` the case's gamma: the ``step_rewards`` of every active row;
3. ``apply_invalid_action_penalty``'s arithmetic (coefficient 0.1 on invalid rows, subtracted
   from the row's episode score and its step reward) and
   ``compute_rewardflow_outcome_advantage(token_level_rewards, step_rewards, response_mask,
   anchor_obs, uid, traj_uid, mode=...)`` on the active rows, the episode reward at the last
   response token; in float32 (as their trainer holds the tensors) and in float64.

Rows are classed as in make_3spo_golden (both runs, the float64 run only, neither). The step
rewards of step 2 (Python floats) must equal ours to 1e-12 x max(1, |d|).
"""

from __future__ import annotations

import ast
import importlib
import io
import sys
import types
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.golden_common import (
    Tally,
    case_step_batch,
    golden_parser,
    golden_path,
    terminal_next_state,
    torch_default_dtype,
    write_golden,
)
from hgpo import StepBatch, compute_advantages, reference_config
from hgpo.config import EstimatorConfig
from hgpo.rewardflow import REWARDFLOW_SOURCE

GOLDEN = golden_path("rewardflow")
PENALTY = 0.1  # actor_rollout_ref.actor.invalid_action_penalty_coef in their scripts
STEP_TOL = 1e-12


def load_reference(ref_dir: Path) -> tuple[types.ModuleType, type]:
    """(``rewardflow.core_rewardflow``, a manager class with the generic ``state_preprocess``
    and ``clean_trajectory`` compiled from ``env_manager.py``)."""
    sys.path.insert(0, str(ref_dir))
    core = importlib.import_module("rewardflow.core_rewardflow")
    src = (ref_dir / "agent_system" / "environments" / "env_manager.py").read_text()
    tree = ast.parse(src)
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef)
               and n.name == "SokobanEnvironmentManager")  # fmt: skip
    methods = [f for f in cls.body if isinstance(f, ast.FunctionDef)
               and f.name in ("state_preprocess", "clean_trajectory")]  # fmt: skip
    ns: dict[str, Any] = {}
    exec(compile(ast.Module(body=methods, type_ignores=[]), "env_manager.py", "exec"), ns)

    class Manager:
        state_preprocess = ns["state_preprocess"]
        clean_trajectory = ns["clean_trajectory"]

        @staticmethod
        def projection_f(texts: list[str]) -> tuple[list[str], list[bool]]:
            return list(texts), [True] * len(texts)

    return core, Manager


def random_case(rng: np.random.Generator) -> dict[str, Any]:
    """Inputs of one case: a batch (equal-sized, contiguous rollout groups) plus options."""
    n_states = int(rng.integers(2, 7))
    per_group = int(rng.integers(1, 6))
    group, traj, step, reward, state, invalid = [], [], [], [], [], []
    tid = 0
    with_invalid = rng.random() < 0.5
    for g in rng.choice(100, int(rng.integers(1, 4)), replace=False):
        for _ in range(per_group):
            T = int(rng.integers(1, 9))
            group += [int(g)] * T
            traj += [tid] * T
            step += list(range(T))
            r = rng.choice([0.0, 0.0, 0.0, 0.0, 1.0, -0.1, -0.5, 0.25], T)
            if rng.random() < 0.4:
                r[-1] = 10.0
            reward += [float(x) for x in r]
            s = rng.integers(0, n_states, T)
            if rng.random() < 0.3:  # stay put: self-loops
                s[rng.random(T) < 0.5] = s[0]
            state += [int(x) for x in s]
            invalid += [bool(x) for x in (rng.random(T) < 0.2) & with_invalid]
            tid += 1
    terminal = None
    if rng.random() < 0.6:  # the observation after each last step: a state or a new one
        terminal = [int(x) for x in rng.integers(0, n_states + 2, tid)]
    return dict(
        terminal=terminal,
        gamma=float(rng.choice([0.9, 0.9, 0.95, 0.5, 1.0, 0.0])),
        mode=str(rng.choice(["mean_norm", "mean_std_norm"])),
        invalid=invalid if with_invalid else None,
        group=group, traj=traj, step=step, reward=reward, state=state,
    )  # fmt: skip


def case_batch(case: dict[str, Any]) -> StepBatch:
    """The StepBatch of one golden case (also used by tests/hgpo/test_rewardflow_golden.py);
    with the case's terminal observations as the ``next_state`` of each last step."""
    return case_step_batch(
        case,
        invalid=None if case["invalid"] is None else np.asarray(case["invalid"]),
        next_state=None if case["terminal"] is None else terminal_next_state(case),
    )


def case_config(case: dict[str, Any]) -> EstimatorConfig:
    """``reference_config("rewardflow")`` with the case's gamma and mode."""
    return reference_config(
        "rewardflow",
        norm="mean" if case["mode"] == "mean_norm" else "mean_std",
        rewardflow_gamma=case["gamma"],
        invalid_penalty=PENALTY,
    )


def ours(case: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """(advantages, step rewards before the invalid penalty) of our code on one case."""
    out = compute_advantages("rewardflow", case_batch(case), config=case_config(case))
    d = out.returns.copy()
    if case["invalid"] is not None:
        d += PENALTY * np.asarray(case["invalid"])
    return out.advantages, d


def _rollout(case: dict[str, Any]) -> list[list[dict[str, Any]]]:
    """Step 1: the rollout loop's ``total_batch_list`` of one case."""
    rows: dict[int, list[int]] = {}
    for i, t in enumerate(case["traj"]):
        rows.setdefault(t, []).append(i)
    width = max(len(r) for r in rows.values()) + 1
    out = []
    for t, rs in rows.items():
        end = f"end of trajectory {t}" if case["terminal"] is None else f"obs {case['terminal'][t]}"
        traj = []
        for j in range(width):
            active = j < len(rs)
            i = rs[j] if active else rs[-1]
            traj.append({
                "anchor_obs": f"obs {case['state'][i]}" if active else end,
                "rewards": case["reward"][i] if active else 0.0,
                "active_masks": active, "uid": f"g{case['group'][i]}",
                "responses": f"action {j}",
            })  # fmt: skip
        out.append(traj)
    return out


def run_reference(case: dict[str, Any], core: types.ModuleType, manager: type) -> dict:
    """Steps 1-3 of the module docstring: their step rewards and float32/float64 advantages."""
    tokenizer = types.SimpleNamespace(decode=str)
    config = types.SimpleNamespace(algorithm=types.SimpleNamespace(gamma=case["gamma"]))
    with redirect_stdout(io.StringIO()):
        tbl = core.apply_rewardflow_propagation(_rollout(case), config, tokenizer, manager())
    steps = [row["step_rewards"] for traj in tbl for row in traj if row["active_masks"]]
    out = {"reference_step": [float(x) for x in steps]}
    for name, f64 in (("reference_f32", False), ("reference_f64", True)):
        out[name] = _advantage(case, core, np.asarray(steps, dtype=np.float64), f64)
    return out


def _advantage(case: dict[str, Any], core: types.ModuleType, steps: np.ndarray, f64: bool):
    import torch

    dt = torch.float64 if f64 else torch.float32
    with torch_default_dtype(f64):
        n = len(steps)
        traj, reward = np.asarray(case["traj"]), np.asarray(case["reward"])
        ep = np.bincount(traj, weights=reward)[traj].astype(np.float64 if f64 else np.float32)
        score = torch.zeros((n, 2), dtype=dt)
        score[:, -1] = torch.tensor(ep, dtype=dt)
        step_r = torch.tensor(steps.astype(np.float64 if f64 else np.float32), dtype=dt)
        if case["invalid"] is not None:  # apply_invalid_action_penalty
            inv = torch.tensor(np.asarray(case["invalid"], dtype=np.float32), dtype=dt)
            score[:, -1] -= PENALTY * inv
            step_r -= PENALTY * inv
        obs = np.array([f"obs {s}" for s in case["state"]], dtype=object)
        uid = np.array([f"g{g}" for g in case["group"]], dtype=object)
        tuid = np.array([f"t{t}" for t in case["traj"]], dtype=object)
        with redirect_stdout(io.StringIO()):
            adv, _ = core.compute_rewardflow_outcome_advantage(
                score, step_r, torch.ones((n, 2), dtype=dt), obs, uid, tuid, mode=case["mode"]
            )
    a = adv[:, 0].double().numpy()
    return [float(np.float32(x)) for x in a] if not f64 else a.tolist()


ABOUT = (
    "Inputs and the outputs of the RewardFlow authors' code (rewardflow/core_rewardflow.py: "
    "apply_rewardflow_propagation with the generic state_preprocess/clean_trajectory, "
    "compute_rewardflow_outcome_advantage) made by benchmarks/make_rewardflow_golden.py; "
    "reference_step the propagated step rewards (float64), reference_f32 the advantages as "
    "their trainer computes them (float32), reference_f64 the same in float64."
)


def main(argv: list[str] | None = None) -> int:
    args = golden_parser(
        __doc__, GOLDEN, golden_cases=24, golden_help="cases in the file (at least)",
        ref_help="folder with rewardflow/, agent_system/ and verl/ (see above)",
    ).parse_args(argv)  # fmt: skip
    import torch

    torch.set_num_threads(1)
    core, manager = load_reference(args.ref_dir)
    rng = np.random.default_rng(args.seed)
    tally, step_worst, bad, golden = Tally(), 0.0, [], []
    for c in range(args.cases):
        case = random_case(rng)
        a, d = ours(case)
        ref = run_reference(case, core, manager)
        f32, f64 = np.asarray(ref["reference_f32"]), np.asarray(ref["reference_f64"])
        cls = tally.add(a, f32, f64)
        theirs = np.asarray(ref["reference_step"])
        rel = np.abs(d - theirs) / np.maximum(1.0, np.abs(theirs))
        step_worst = max(step_worst, float(rel.max()))
        if (cls >= 2).any() or (rel > STEP_TOL).any():
            bad.append(f"case {c}: rows {np.flatnonzero(cls >= 2).tolist()} (advantage), "
                       f"{np.flatnonzero(rel > STEP_TOL).tolist()} (step reward)")  # fmt: skip
        if args.write and (c < args.golden_cases or (cls >= 1).any()):
            golden.append({**case, **ref, "classes": np.bincount(cls, minlength=4).tolist()})
    print(tally.summary("rewardflow", args.cases))
    print(f"       max |ours - f32| where both agree: {tally.worst[0]:.2g}; max |ours - f64|: "
          f"{tally.worst[2]:.2g}; step rewards: max relative difference {step_worst:.2g}")  # fmt: skip
    for line in bad:
        print("MISMATCH", line)
    if args.write:
        write_golden(GOLDEN, ABOUT, REWARDFLOW_SOURCE, args.seed, golden)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
