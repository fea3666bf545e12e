"""Run the authors' public advantage code next to ``hgpo.reference_config`` and freeze the result.

    python -m benchmarks.make_verl_agent_golden --ref-dir /tmp/vref [--cases 400] [--write]

This is NOT run in CI: it needs torch and a local copy of the public reference functions,
which this repository does not ship. It checks, on random batches built to hit the edge
cases (tied and near-tied returns, singleton groups, single-trajectory groups, revisited
states, invalid actions, trajectories shorter than K, several rollout groups, K = 0..4, both
modes, with and without HGPO's base group), that ``compute_advantages(name, batch,
config=reference_config(name, env, ...))`` gives the reference code's numbers, and with
``--write`` stores a small set of inputs and the reference outputs in
``tests/hgpo/data/verl_agent_golden.json`` for ``tests/hgpo/test_verl_agent_golden.py``.

Reference code used (read through the public-code search, copied into ``--ref-dir`` only):
- ``recipe/hgpo/core_hgpo.py`` of zzj1111/alfworldauto at commit
  51c1a039c38f1af54b09c05b81b76ce52d72c383 (the HGPO authors' recipe for verl-agent), copied
  whole into ``<ref-dir>/core_hgpo.py``;
- ``gigpo/core_gigpo.py`` of the same commit (the functions ``compute_step_discounted_returns``,
  ``compute_gigpo_outcome_advantage``, ``episode_norm_reward``, ``build_step_group``,
  ``step_norm_reward``, ``to_hashable`` and the helpers they call; the same function bodies
  are in vanzll/verl-agent at 3038c3b1c78fb75af7e113c74a32ac30d907fb50), into
  ``<ref-dir>/core_gigpo.py``;
- ``compute_grpo_outcome_advantage`` and ``compute_rloo_outcome_advantage`` of
  ``verl/trainer/ppo/core_algos.py`` at the same commit, into ``<ref-dir>/core_algos.py``;
- ``<ref-dir>/verl/__init__.py``: a stub defining ``DataProto`` (an object with ``.batch`` and
  ``.non_tensor_batch`` dicts), the only verl name those functions import.

The glue below replays what the authors' trainer (``recipe/hgpo/hgpo_ray_trainer.py``,
``agent_system/multi_turn_rollout/rollout_loop.py``, ``agent_system/reward_manager/episode.py``)
does before calling them: step returns from the env rewards (float32), the episode reward
(float32 running sum over the steps) written at the last response token of every step row,
then ``apply_invalid_action_penalty`` subtracting 0.1 x invalid from that token and from the
step return, then the estimator. Each step row has a random response length.

Each case is run twice: as published (float32) and with float32 replaced by float64 in the
copied modules (``--ref-dir`` source is rewritten in memory; torch's default dtype set to
float64). The float64 run separates semantics from float32 rounding. Rows are classed:
- ``exact``: our value equals the float64 run to 1e-9 and the float32 run to 1e-6 x max(1, |a|);
- ``f32``: equal to the float64 run but not to the float32 one: the float32 code itself is
  off there (a tied group whose float32 mean is not the tied value, or a near-tie such as
  1.0 vs 1.0001 that float32 cannot resolve); listed with their cause;
- ``mismatch``: differs from the float64 run too: a semantic difference (reported, and the
  script exits 1).
"""

from __future__ import annotations

import argparse
import io
import sys
import types
from contextlib import redirect_stdout
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.golden_common import (
    Tally,
    case_step_batch,
    episode_rewards,
    exec_source,
    golden_entry,
    golden_parser,
    golden_path,
    torch_default_dtype,
    trainer_scores,
    write_golden,
)
from hgpo import StepBatch, compute_advantages, reference_config

GOLDEN = golden_path("verl_agent")
REF_COMMIT = "zzj1111/alfworldauto@51c1a039c38f1af54b09c05b81b76ce52d72c383"
# Rewards that make tied and near-tied returns (1.0 vs 1.0001), 0.1 sums that round, and the
# ALFWorld success reward.
REWARDS = np.array([0.0, 0.0, 0.0, 0.0, 1.0, 1.0001, 0.1, 10.0, -0.5])
MODES = {"alfworld": "mean_std_norm", "webshop": "mean_norm"}


def load_modules(
    ref_dir: Path, names: tuple[str, ...], float64: bool
) -> dict[str, types.ModuleType]:
    """Import the copied reference modules ``names`` from ``ref_dir`` (optionally with
    float32 -> float64 in their source)."""
    sys.path.insert(0, str(ref_dir))  # for the verl stub
    tag = "f64" if float64 else "f32"
    return {name: exec_source(ref_dir / f"{name}.py", f"ref_{name}_{tag}", float64)
            for name in names}  # fmt: skip


def load_reference(ref_dir: Path, float64: bool) -> dict[str, types.ModuleType]:
    """Import the copied reference modules (optionally with float32 -> float64)."""
    return load_modules(ref_dir, ("core_hgpo", "core_gigpo", "core_algos"), float64)


def random_case(rng: np.random.Generator, estimator: str) -> dict[str, Any]:
    """Inputs of one case: a batch plus the estimator settings."""
    n_groups = int(rng.integers(1, 5))
    n_states = int(rng.integers(2, 5))
    group, traj, step, reward, state, invalid, resp_len = [], [], [], [], [], [], []
    tid = 0
    for g in rng.choice(100, n_groups, replace=False):
        for _ in range(int(rng.integers(1, 7))):
            T = int(rng.integers(1, 10))
            group += [int(g)] * T
            traj += [tid] * T
            step += list(range(T))
            r = rng.choice(REWARDS, T, p=[0.2, 0.2, 0.15, 0.1, 0.1, 0.1, 0.05, 0.05, 0.05])
            if rng.random() < 0.4:
                r[-1] = 10.0  # success at the last step
            reward += [float(x) for x in r]
            state += [int(s) for s in rng.integers(0, n_states, T)]
            invalid += [bool(x) for x in rng.random(T) < 0.2]
            resp_len += [int(x) for x in rng.integers(1, 5, T)]
            tid += 1
    env = str(rng.choice(["alfworld", "webshop"]))
    return dict(
        estimator=estimator,
        env=env,
        K=int(rng.integers(0, 5)),
        gamma=float(rng.choice([0.95, 0.95, 1.0, 0.5])),
        alpha=float(rng.choice([1.0, 1.0, 0.0, 2.0, 0.5])),
        base_group=bool(rng.random() < 0.5) if estimator == "hgpo" else False,
        group=group,
        traj=traj,
        step=step,
        reward=reward,
        state=state,
        invalid=invalid,
        resp_len=resp_len,
    )


@dataclass(frozen=True)
class _RefInputs:
    """What the authors' trainer hands its advantage function for one case (torch tensors
    of the run's float type, object arrays of string ids)."""

    scores: Any  # [n, L] the episode reward at each step's last response token, less 0.1 x invalid
    step_rewards: Any  # [n] the discounted step returns, less 0.1 x invalid
    response_mask: Any  # [n, L]
    anchor_obs: np.ndarray
    uid: np.ndarray
    traj_uid: np.ndarray


def run_reference(
    case: dict[str, Any], mods: dict[str, types.ModuleType], float64: bool
) -> np.ndarray:
    """The reference pipeline on one case; returns the per-step advantage."""
    with torch_default_dtype(float64):
        inputs = _reference_inputs(case, mods, float64)
        with redirect_stdout(io.StringIO()):
            adv = _reference_advantages(case, mods, inputs)
    return adv[:, 0].double().numpy()  # every row has >= 1 response token


def _reference_inputs(
    case: dict[str, Any], mods: dict[str, types.ModuleType], float64: bool
) -> _RefInputs:
    """The glue of the authors' trainer before the estimator (module docstring): step
    returns, the episode reward at the last response token, the invalid-action penalty."""
    import torch

    ndt = np.float64 if float64 else np.float32
    n = len(case["group"])
    rewards = np.asarray(case["reward"], dtype=ndt)
    # The rollout loop's uids are strings; ours are ints. Strings keep np.unique's order
    # irrelevant (nothing depends on it) and exercise to_hashable on str observations.
    traj_uid = np.array([f"t{t:04d}" for t in case["traj"]], dtype=object)
    batch = mods["core_hgpo"].DataProto(
        batch={"input_ids": torch.zeros((n, 1), dtype=torch.long)},
        non_tensor_batch={
            "rewards": rewards,
            "traj_uid": traj_uid,
            "active_masks": np.ones(n, dtype=bool),
        },
    )
    core = mods["core_hgpo"] if case["estimator"] == "hgpo" else mods["core_gigpo"]
    with redirect_stdout(io.StringIO()):
        step_rewards = core.compute_step_discounted_returns(batch=batch, gamma=case["gamma"])
    # rollout_loop's episode rewards, at the last response token less the invalid penalty
    # (hgpo_ray_trainer.apply_invalid_action_penalty, coefficient 0.1), on the returns too.
    response_mask, scores, penalty = trainer_scores(case, episode_rewards(case, float64), float64)
    for i in range(n):
        step_rewards[i] -= 0.1 * penalty[i]
    return _RefInputs(
        scores=scores,
        step_rewards=step_rewards,
        response_mask=response_mask,
        anchor_obs=np.array([f"obs {s}" for s in case["state"]], dtype=object),
        uid=np.array([f"g{g}" for g in case["group"]], dtype=object),
        traj_uid=traj_uid,
    )


def _reference_advantages(
    case: dict[str, Any], mods: dict[str, types.ModuleType], x: _RefInputs
) -> Any:
    """The case's estimator in the reference code, as its trainer calls it ([n, L] tensor)."""
    est, mode = case["estimator"], MODES[case["env"]]
    common = dict(token_level_rewards=x.scores, response_mask=x.response_mask, index=x.uid,
                  traj_index=x.traj_uid)  # fmt: skip
    if est == "hgpo":
        adv, _ = mods["core_hgpo"].compute_hgpo_outcome_advantage(
            **common, step_rewards=x.step_rewards, anchor_obs=x.anchor_obs,
            history_length=case["K"], mode=mode, length_weight_alpha=case["alpha"],
            base_group=case["base_group"],
        )  # fmt: skip
    elif est == "gigpo":
        adv, _ = mods["core_gigpo"].compute_gigpo_outcome_advantage(
            **common, step_rewards=x.step_rewards, anchor_obs=x.anchor_obs,
            step_advantage_w=1.0, mode=mode,
        )  # fmt: skip
    elif est == "grpo":
        adv, _ = mods["core_algos"].compute_grpo_outcome_advantage(
            **common, norm_adv_by_std_in_grpo=(mode == "mean_std_norm")
        )
    elif est == "rloo":
        adv, _ = mods["core_algos"].compute_rloo_outcome_advantage(**common)
    else:
        raise ValueError(est)
    return adv


def case_batch(case: dict[str, Any]) -> StepBatch:
    """The StepBatch of one golden case (also used by tests/hgpo/test_verl_agent_golden.py)."""
    return case_step_batch(case, invalid=np.asarray(case["invalid"], dtype=bool))


def ours(case: dict[str, Any]) -> np.ndarray:
    """``compute_advantages`` with the reference preset on the same case."""
    batch = case_batch(case)
    est = case["estimator"]
    opts: dict[str, Any] = dict(K=case["K"], gamma=case["gamma"])
    if est == "hgpo":
        opts.update(alpha=case["alpha"], base_group=case["base_group"])
    cfg = reference_config(est, env=case["env"], **opts)
    return compute_advantages(est, batch, config=cfg).advantages


def rounding_decided(case: dict[str, Any]) -> np.ndarray:
    """bool[n]: rows where float rounding alone decides hgpo's "A_k == 0" test
    (zero_rule="value"): some level gives the step exactly 0 in our exact-tie arithmetic
    although its group has >= 2 members (a tied group, or the step sits at its group's
    mean), so a run of the reference code that leaves an ulp of residue there counts the level
    and one that does not leaves it out. The only rows where our preset may differ from a
    run of the reference code by more than that run's rounding."""
    n = len(case["group"])
    if case["estimator"] != "hgpo":
        return np.zeros(n, dtype=bool)
    batch = case_batch(case)
    cfg = reference_config(
        "hgpo",
        env=case["env"],
        K=case["K"],
        gamma=case["gamma"],
        alpha=case["alpha"],
        base_group=case["base_group"],
    )
    out = compute_advantages("hgpo", batch, config=cfg)
    sizes = []
    for ids in out.level_groups[: case["K"] + 1]:
        counts = np.bincount(ids[ids >= 0], minlength=1)
        sizes.append(np.where(ids >= 0, counts[np.maximum(ids, 0)], 0))
    if case["base_group"]:
        _, inv, counts = np.unique(batch.group, return_inverse=True, return_counts=True)
        sizes.append(counts[inv])
    return ((out.level_advantages == 0) & (np.stack(sizes) >= 2)).any(axis=0)


def _parser() -> argparse.ArgumentParser:
    return golden_parser(
        __doc__, GOLDEN, cases_help="random cases per estimator",
        estimators=dict(default=["hgpo", "gigpo", "grpo", "rloo"]),
        golden_cases=12, golden_help="cases per estimator in the file",
    )  # fmt: skip


@dataclass
class _Report(Tally):
    """One estimator's comparison over its cases."""

    bad_cases: list[tuple[int, int]] = field(default_factory=list)
    """(case, rows) where a row differs beyond what rounding decides."""
    first_bad: dict[str, Any] | None = None
    golden: list[dict[str, Any]] = field(default_factory=list)
    """The cases for the golden file: the first ones and every one with a row not "both"."""


def _compare(est: str, args: argparse.Namespace, refs: tuple[dict, dict], rng) -> _Report:
    """``args.cases`` random cases of ``est``: ours against both reference runs."""
    rep = _Report()
    for c in range(args.cases):
        case = random_case(rng, est)
        a = ours(case)
        f32 = run_reference(case, refs[0], float64=False)
        f64 = run_reference(case, refs[1], float64=True)
        cls = rep.add(a, f32, f64)
        unexplained = (cls >= 2) & ~rounding_decided(case)
        if unexplained.any():
            rep.bad_cases.append((c, int(unexplained.sum())))
            if rep.first_bad is None:
                i = int(np.flatnonzero(unexplained)[0])
                rep.first_bad = dict(case=c, row=i, ours=a[i], f64=f64[i], f32=f32[i],
                                     **{k: case[k] for k in ("env", "K", "gamma", "alpha",
                                                             "base_group")})  # fmt: skip
        if args.write and (c < args.golden_cases or (cls >= 2).any()):
            rep.golden.append(golden_entry(case, f32, f64, cls))
    return rep


def _print_report(est: str, cases: int, rep: _Report) -> None:
    bad = f"; UNEXPLAINED in {len(rep.bad_cases)} cases, first: {rep.first_bad}"
    print(rep.summary(f"{est:<6}", cases) + (bad if rep.bad_cases else ""))
    print("       " + rep.worst_text())


ABOUT = (
    "Inputs and the outputs of the authors' public advantage code (verl-agent "
    "recipe/hgpo/core_hgpo.py, gigpo/core_gigpo.py, verl core_algos grpo/rloo) "
    "made by benchmarks/make_verl_agent_golden.py; reference_f32 as published "
    "(float32), reference_f64 the same code with float32 replaced by float64."
)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    import torch

    torch.set_num_threads(1)
    refs = (load_reference(args.ref_dir, float64=False), load_reference(args.ref_dir, float64=True))
    rng = np.random.default_rng(args.seed)
    golden: list[dict[str, Any]] = []
    status = 0
    for est in args.estimators:
        rep = _compare(est, args, refs, rng)
        _print_report(est, args.cases, rep)
        golden += rep.golden
        status |= bool(rep.bad_cases)
    if args.write:
        write_golden(GOLDEN, ABOUT, REF_COMMIT, args.seed, golden)
    return status


if __name__ == "__main__":
    sys.exit(main())
