"""Run the G2PO authors' advantage code next to ``hgpo``'s ``g2po`` and freeze the result.

    python -m benchmarks.make_g2po_golden --ref-dir /tmp/g2po_ref [--cases 400] [--write]

This is NOT run in CI: it needs torch and a local copy of the public reference code, which
this repository does not ship. It checks, on random batches built to hit the edge cases
(trajectories crossing in a state, revisited states, successful and failed episodes, groups
without a success, single-trajectory groups, invalid actions, several rollout groups, both
modes, the step weight), that ``compute_advantages("g2po", batch,
config=reference_config("g2po", ...))`` gives the reference code's numbers, and with
``--write`` stores a small set of inputs and the reference outputs in
``tests/hgpo/data/g2po_golden.json`` for ``tests/hgpo/test_g2po_golden.py``.

Reference code used (Nala-YN/G2PO, commit b8ffaf56ad241ce73507908e6ed30209cafd324d), copied
into ``--ref-dir`` only:

- ``g2po/core_g2po.py`` (blob 74936220786430f6c2a63cecb3ced307b4c01826), copied whole into
  ``<ref-dir>/core_g2po.py``;
- ``<ref-dir>/verl/__init__.py``: a stub defining ``DataProto`` (an object with ``.batch``,
  ``.non_tensor_batch`` and ``.meta_info`` dicts), the only verl name it imports.

The glue below replays what the authors' trainer does around the estimator
(``verl/trainer/ppo/ray_trainer.py``): ``compute_group_aggregation_values`` on the rollout
(``agent_system/multi_turn_rollout/rollout_loop.py``: every step row carries its episode's
reward, a float32 running sum of the env rewards, and its ``anchor_obs``); the episode reward
at the last response token of every step row (``agent_system/reward_manager/episode.py``);
``apply_invalid_action_penalty`` subtracting 0.1 x invalid from that token (it does not touch
the step rewards, which sit in ``non_tensor_batch``); then ``compute_g2po_outcome_advantage``.
Observations are the strings ``"obs <state>"``. Each case is run twice, as published
(float32) and with torch's default dtype float64 (the module names no float32 itself), and
each row is classed as in ``make_verl_agent_golden.py``.

The cases keep to where the two definitions are meant to agree: a successful episode's return
is exactly 10 (the authors test ``== 10``, ours ``>= g2po_success_return``), and every rollout
group has at least two step rows (one row gives their code a NaN).
"""

from __future__ import annotations

import io
import sys
import types
from contextlib import redirect_stdout
from typing import Any

import numpy as np

from benchmarks.golden_common import (
    case_step_batch,
    compare_cases,
    episode_rewards,
    golden_parser,
    golden_path,
    require_files,
    torch_default_dtype,
    trainer_scores,
    write_golden,
)
from benchmarks.make_verl_agent_golden import load_modules
from hgpo import StepBatch, compute_advantages, reference_config

GOLDEN = golden_path("g2po")
REF_COMMIT = "Nala-YN/G2PO@b8ffaf56ad241ce73507908e6ed30209cafd324d (g2po/core_g2po.py)"
REWARDS = np.array([0.0, 0.0, 0.0, 0.0, 1.0, 0.1, -0.5])


def random_case(rng: np.random.Generator) -> dict[str, Any]:
    """Inputs of one case: a batch plus the settings."""
    group, traj, step, reward, state, invalid, resp_len = [], [], [], [], [], [], []
    tid = 0
    for g in rng.choice(100, int(rng.integers(1, 4)), replace=False):
        n_states = int(rng.integers(2, 6))
        rows = 0
        while rows < 2 or (rows < 30 and rng.random() < 0.7):
            T = int(rng.integers(1, 8))
            rows += T
            group += [int(g)] * T
            traj += [tid] * T
            step += list(range(T))
            r = rng.choice(REWARDS, T, p=[0.25, 0.25, 0.15, 0.15, 0.08, 0.07, 0.05])
            if rng.random() < 0.35:
                r[:] = 0.0
                r[-1] = 10.0  # success: ALFWorld's reward, the episode's only one
            reward += [float(x) for x in r]
            state += [int(s) for s in rng.integers(0, n_states, T)]
            invalid += [bool(x) for x in rng.random(T) < 0.2]
            resp_len += [int(x) for x in rng.integers(1, 4, T)]
            tid += 1
    return dict(
        mode=str(rng.choice(["mean_std_norm", "mean_std_norm", "mean_norm"])),
        step_weight=float(rng.choice([1.0, 1.0, 0.5, 2.0])),
        group=group, traj=traj, step=step, reward=reward, state=state, invalid=invalid,
        resp_len=resp_len,
    )  # fmt: skip


def run_reference(case: dict[str, Any], mod: types.ModuleType, float64: bool) -> np.ndarray:
    """The reference pipeline on one case; returns the per-step advantage."""
    with torch_default_dtype(float64), redirect_stdout(io.StringIO()):
        return _reference(case, mod, float64)


def _reference(case: dict[str, Any], mod: types.ModuleType, float64: bool) -> np.ndarray:
    import torch

    ndt = np.float64 if float64 else np.float32
    n, L = len(case["group"]), max(case["resp_len"])
    traj = np.asarray(case["traj"])
    valid = ~np.asarray(case["invalid"], dtype=bool)
    episode = episode_rewards(case, float64)
    uid = np.array([f"g{g}" for g in case["group"]], dtype=object)
    traj_uid = np.array([f"t{t:04d}" for t in case["traj"]], dtype=object)
    batch = mod.DataProto(
        batch={"responses": torch.zeros((n, L), dtype=torch.long)},
        non_tensor_batch={
            "episode_rewards": np.array([episode[t] for t in traj.tolist()], dtype=ndt),
            "anchor_obs": np.array([f"obs {s}" for s in case["state"]], dtype=object),
            "traj_uid": traj_uid, "uid": uid, "is_action_valid": valid,
        },
    )  # fmt: skip
    step_rewards, group_idx, next_group_idx = mod.compute_group_aggregation_values(batch)
    response_mask, scores, _ = trainer_scores(case, episode, float64)
    adv, _ = mod.compute_g2po_outcome_advantage(
        token_level_rewards=scores, step_rewards=step_rewards, response_mask=response_mask,
        index=uid, traj_index=traj_uid, group_idx=group_idx, next_group_idx=next_group_idx,
        is_action_valid=valid, epsilon=1e-6, step_advantage_w=case["step_weight"],
        mode=case["mode"],
    )  # fmt: skip
    return adv[:, 0].double().numpy()  # every row has >= 1 response token


def case_batch(case: dict[str, Any]) -> StepBatch:
    """The StepBatch of one golden case (also used by tests/hgpo/test_g2po_golden.py)."""
    return case_step_batch(case, invalid=np.asarray(case["invalid"], dtype=bool))


def case_config(case: dict[str, Any]):
    """``reference_config("g2po")`` with the case's mode and step weight."""
    return reference_config(
        "g2po",
        norm="mean_std" if case["mode"] == "mean_std_norm" else "mean",
        g2po_step_weight=case["step_weight"],
    )


def ours(case: dict[str, Any]) -> np.ndarray:
    return compute_advantages("g2po", case_batch(case), config=case_config(case)).advantages


def main(argv: list[str] | None = None) -> int:
    p = golden_parser(__doc__, GOLDEN, golden_cases=16, golden_help="first cases in the file",
                      extra_cases=8)  # fmt: skip
    args = p.parse_args(argv)
    require_files(p, args.ref_dir, ("core_g2po.py", "verl/__init__.py"))
    import torch

    torch.set_num_threads(1)
    refs = [load_modules(args.ref_dir, ("core_g2po",), f)["core_g2po"] for f in (False, True)]
    rep = compare_cases(
        args, random_case, ours, lambda case, f64: run_reference(case, refs[f64], float64=f64)
    )
    print(rep.summary("g2po", args.cases))
    if rep.bad:
        print(f"     NOT EQUAL to the float64 run in {len(rep.bad)} cases, first: {rep.bad[0]}")
    if args.write:
        write_golden(GOLDEN, ABOUT, REF_COMMIT, args.seed, rep.golden)
    return int(bool(rep.bad))


ABOUT = (
    "Inputs and the outputs of the G2PO authors' advantage code (Nala-YN/G2PO "
    "g2po/core_g2po.py, after the glue of their ray_trainer.py and verl-agent's episode "
    "reward manager) made by benchmarks/make_g2po_golden.py; reference_f32 as published "
    "(float32), reference_f64 the same code under torch's float64 default dtype."
)


if __name__ == "__main__":
    sys.exit(main())
