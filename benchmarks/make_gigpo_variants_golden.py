"""Run public code of gigpo_similarity, gigpo_dynamic and empg next to ours and freeze the result.

    python -m benchmarks.make_gigpo_variants_golden --ref-dir /tmp/gref [--cases 300] [--write]

NOT run in CI: it needs torch and local copies of the public functions, which this repository
does not ship. On random batches (tied and near-tied returns, singleton groups, one-trajectory
groups, invalid actions, several rollout groups, both modes; observation texts that are
near-copies of each other, some past 200 characters; entropies with ties) it checks that
``compute_advantages(name, batch, config=reference_config(...), ...)`` gives the public code's
numbers, and with ``--write`` stores a few inputs and outputs in
``tests/hgpo/data/gigpo_variants_golden.json`` for ``tests/hgpo/test_gigpo_variants_golden.py``.

Code used (read through the public-code search, copied into ``--ref-dir`` only):
- ``<ref-dir>/core_gigpo.py``: ``gigpo/core_gigpo.py`` of vanzll/verl-agent at commit
  d0b97244c50f17fb43a6ef0a15bca0e95a044ff7 (a copy of the GiGPO authors' verl-agent), whole:
  ``compute_gigpo_outcome_advantage(..., enable_similarity, similarity_thresh)`` and
  ``build_step_group``;
- ``<ref-dir>/rollout_utils.py``: ``filter_group_data`` of
  ``agent_system/multi_turn_rollout/utils.py`` at the same commit (dynamic sampling, as
  ``examples/gigpo_dynamic_trainer/*.sh`` switch it on), under the lines
  ``import numpy as np`` and ``from typing import Dict, List``;
- ``<ref-dir>/empg_core_algos.py``: ``compute_grpo_outcome_advantage`` and
  ``compute_EMPG_advantage`` of ``recipe/shop_agent/ppo/core_algos.py`` of WillDreamer/ARLArena
  at commit dc1da9f717d1238c49d6f538e5b5bb4b134e76ef, under the lines ``import re``,
  ``from collections import defaultdict``, ``import numpy as np`` and ``import torch``.
  This is a third party's implementation of EMPG for verl-agent step rows: the EMPG authors
  published pseudocode on their project page, not a repository (see docs/estimators.md);
- ``<ref-dir>/verl/__init__.py``: a stub defining ``DataProto`` (an object with ``.batch`` and
  ``.non_tensor_batch``), the only verl name those functions import.

The glue replays what the trainers do before calling them, as
``benchmarks/make_verl_agent_golden.py`` does (float32 step returns, the episode reward at the
last response token of every step row, 0.1 x invalid subtracted from it and from the step
return). gigpo_dynamic: the rollout loop's float32 episode rewards go through
``filter_group_data`` (groups of ``env.rollout.n`` consecutive trajectories, not the last try)
and GiGPO runs on the kept rows only; a dropped row's reference advantage is 0. empg: ARLArena's
trainer computes GRPO's advantage, then ``compute_EMPG_advantage`` on a batch holding the
token entropies (``old_entropy``), and finds a step's turn in its prompt ("you have already
taken N step(s)"); our ``entropy`` is the mean over the step's response tokens.

Each case runs twice (published float32, and float32 replaced by float64 in the copied
source) and rows are classed as in make_verl_agent_golden: equal to both runs, to the float64
run only (float32 rounding), to the float32 run only, or to neither. A row off both runs is
explained only where rounding decides it: gigpo_dynamic rows of a group whose episode rewards
are tied in one precision and not in another. Anything else is a mismatch (exit 1).
"""

from __future__ import annotations

import io
import sys
import types
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.golden_common import (
    Tally,
    golden_entry,
    golden_parser,
    golden_path,
    torch_default_dtype,
    write_golden,
)
from benchmarks.make_verl_agent_golden import (
    MODES,
    REWARDS,
    _reference_inputs,
    case_batch,
    load_modules,
)
from hgpo import compute_advantages, reference_config

GOLDEN = golden_path("gigpo_variants")
REF_COMMITS = {
    "gigpo_similarity": "vanzll/verl-agent@d0b97244c50f17fb43a6ef0a15bca0e95a044ff7",
    "gigpo_dynamic": "vanzll/verl-agent@d0b97244c50f17fb43a6ef0a15bca0e95a044ff7",
    "empg": "WillDreamer/ARLArena@dc1da9f717d1238c49d6f538e5b5bb4b134e76ef",
}
ESTIMATORS = tuple(REF_COMMITS)
_LONG = "you see a cabinet 1, a cabinet 2, a countertop 1, a drawer 1, a fridge 1, a shelf 1, "
TEXTS = (
    "You arrive at fridge 1. The fridge 1 is closed.",
    "You arrive at fridge 1. The fridge 1 is open.",
    "You arrive at fridge 2. The fridge 2 is closed.",
    "You arrive at cabinet 1. On the cabinet 1, you see a mug 1.",
    "You arrive at cabinet 1. On the cabinet 1, you see a mug 2.",
    "Nothing happens.",
    "",
    _LONG * 3,
    (_LONG * 3).replace("fridge 1", "fridge 2"),
    (_LONG * 3)[:-60] + "and a toaster 1.",
)
ENTROPIES = np.array([0.0, 0.3, 0.3, 0.8, 1.7, 2.5, 4.0])


def load_reference(ref_dir: Path, float64: bool) -> dict[str, types.ModuleType]:
    """Import the copied modules (optionally with float32 -> float64)."""
    mods = load_modules(ref_dir, ("core_gigpo", "rollout_utils", "empg_core_algos"), float64)
    mods["core_hgpo"] = mods["core_gigpo"]  # what _reference_inputs takes DataProto from
    return mods


ABOUT = (
    "Inputs and the outputs of public code for gigpo_similarity and gigpo_dynamic "
    "(verl-agent) and empg (ARLArena's implementation), made by "
    "benchmarks/make_gigpo_variants_golden.py; reference_f32 as published, "
    "reference_f64 the same code with float32 replaced by float64."
)


def random_case(rng: np.random.Generator, estimator: str) -> dict[str, Any]:
    """One case: groups of ``group_n`` consecutive trajectories (as the rollout loop lays them
    out), their rewards, states, invalid actions, response lengths, observation texts and
    token entropies, and the estimator's settings."""
    n_groups, group_n = (
        int(rng.integers(1, 5)),
        int(rng.choice([1, 2, 3, 4, 6], p=[0.05, 0.3, 0.3, 0.2, 0.15])),
    )
    n_states = int(rng.integers(2, 6))
    cols: dict[str, list] = {k: [] for k in ("group", "traj", "step", "reward", "state", "invalid", "resp_len", "entropy")}  # fmt: skip
    tid = 0
    for g in rng.choice(100, n_groups, replace=False):
        for _ in range(group_n):
            T = int(rng.integers(1, 8))
            r = rng.choice(REWARDS, T, p=[0.2, 0.2, 0.15, 0.1, 0.1, 0.1, 0.05, 0.05, 0.05])
            if rng.random() < 0.4:
                r[-1] = 10.0
            resp = rng.integers(1, 5, T)
            cols["group"] += [int(g)] * T
            cols["traj"] += [tid] * T
            cols["step"] += list(range(T))
            cols["reward"] += [float(x) for x in r]
            cols["state"] += [int(s) for s in rng.integers(0, n_states, T)]
            cols["invalid"] += [bool(x) for x in rng.random(T) < 0.2]
            cols["resp_len"] += [int(x) for x in resp]
            cols["entropy"] += [[float(x) for x in rng.choice(ENTROPIES, m)] for m in resp]
            tid += 1
    texts = list(rng.permutation(len(TEXTS)))
    return dict(
        estimator=estimator,
        env=str(rng.choice(["alfworld", "webshop"])),
        gamma=float(rng.choice([0.95, 0.95, 1.0, 0.5])),
        group_n=group_n,
        thresh=float(rng.choice([0.95, 0.9, 0.8, 0.6, 0.3])),
        k=float(rng.choice([1.0, 1.0, 0.5, 3.0])),
        k_f=float(rng.choice([1.0, 1.0, 2.0])),
        zeta=float(rng.choice([0.05, 0.1, 0.5])),
        observations=[TEXTS[texts[s % len(TEXTS)]] for s in cols["state"]],
        **cols,
    )


def _config(case: dict[str, Any]):
    """Our options for the case: the estimator's verl-agent preset and the case's."""
    return reference_config(
        case["estimator"],
        env=case["env"],
        gamma=case["gamma"],
        gigpo_similarity_thresh=case["thresh"],
        empg_k=case["k"],
        empg_k_future=case["k_f"],
        empg_zeta=case["zeta"],
    )


def step_entropy(case: dict[str, Any]) -> np.ndarray:
    """float64[n] mean token entropy of each step's response (our ``entropy`` input)."""
    return np.array([float(np.mean(e)) for e in case["entropy"]])


def ours(case: dict[str, Any]) -> np.ndarray:
    est = case["estimator"]
    inputs: dict[str, Any] = {}
    if est == "empg":
        inputs["entropy"] = step_entropy(case)
    if est == "gigpo_similarity":
        inputs["observations"] = case["observations"]
    return compute_advantages(est, case_batch(case), config=_config(case), **inputs).advantages


def run_reference(case: dict[str, Any], mods: dict, float64: bool) -> np.ndarray:
    """The public pipeline on one case; the advantage at each step's first response token."""
    with torch_default_dtype(float64), redirect_stdout(io.StringIO()):
        if case["estimator"] == "gigpo_dynamic":
            return _dynamic(case, mods, float64)
        x = _reference_inputs({**case, "estimator": "gigpo"}, mods, float64)
        if case["estimator"] == "gigpo_similarity":
            adv, _ = mods["core_gigpo"].compute_gigpo_outcome_advantage(
                token_level_rewards=x.scores, step_rewards=x.step_rewards,
                response_mask=x.response_mask,
                anchor_obs=np.array(case["observations"], dtype=object), index=x.uid,
                traj_index=x.traj_uid, step_advantage_w=1.0, mode=MODES[case["env"]],
                enable_similarity=True, similarity_thresh=case["thresh"],
            )  # fmt: skip
        else:
            adv = _empg(case, mods, x, float64)
    return adv[:, 0].double().numpy()


def _empg(case: dict[str, Any], mods: dict, x: Any, float64: bool) -> Any:
    """ARLArena's trainer: GRPO's advantage, then compute_EMPG_advantage on the batch."""
    import torch

    algos = mods["empg_core_algos"]
    fdt = torch.float64 if float64 else torch.float32
    adv, _ = algos.compute_grpo_outcome_advantage(
        token_level_rewards=x.scores, response_mask=x.response_mask, index=x.uid,
        traj_index=x.traj_uid, norm_adv_by_std_in_grpo=MODES[case["env"]] == "mean_std_norm",
    )  # fmt: skip
    n, L = x.response_mask.shape
    entropy = torch.zeros((n, L), dtype=fdt)
    for i, e in enumerate(case["entropy"]):
        entropy[i, : len(e)] = torch.tensor(e, dtype=fdt)

    class _Tensors(dict):
        batch_size = (n,)

    prompts = [
        [{"content": "Your task is to ..." if t == 0 else f"you have already taken {t} step(s)"}]
        for t in case["step"]
    ]
    data = types.SimpleNamespace(
        batch=_Tensors(old_entropy=entropy, response_mask=x.response_mask, advantages=adv),
        non_tensor_batch={"raw_prompt": prompts, "traj_uid": x.traj_uid},
    )
    out, _ = algos.compute_EMPG_advantage(
        batch=data, k=case["k"], k_f=case["k_f"], zeta=case["zeta"]
    )
    return out


def _dynamic(case: dict[str, Any], mods: dict, float64: bool) -> np.ndarray:
    """filter_group_data on the rollout loop's episode rewards, then GiGPO on the kept rows."""
    ndt = np.float64 if float64 else np.float32
    traj = np.asarray(case["traj"])
    n_traj = int(traj.max()) + 1
    episode = np.zeros(n_traj, dtype=ndt)
    for t, r in zip(traj, np.asarray(case["reward"], dtype=ndt), strict=True):
        episode[t] = ndt(episode[t] + r)  # the rollout loop's running sum, step by step
    group = np.asarray(case["group"])
    batch_list = [[{"uid": f"g{group[traj == t][0]}"}] for t in range(n_traj)]
    config = types.SimpleNamespace(
        data=types.SimpleNamespace(train_batch_size=n_traj // case["group_n"]),
        env=types.SimpleNamespace(rollout=types.SimpleNamespace(n=case["group_n"])),
    )
    kept = mods["rollout_utils"].filter_group_data(
        batch_list=batch_list, episode_rewards=episode, episode_lengths=np.zeros(n_traj),
        success={}, traj_uid=np.arange(n_traj), tool_callings=np.zeros(n_traj), config=config,
        last_try=False,
    )[4]  # fmt: skip
    out = np.zeros(len(traj))
    rows = np.flatnonzero(np.isin(traj, kept))
    if rows.size:
        sub = {k: [case[k][i] for i in rows] for k in ("group", "traj", "step", "reward", "state", "invalid", "resp_len")}  # fmt: skip
        x = _reference_inputs({**case, **sub, "estimator": "gigpo"}, mods, float64)
        adv, _ = mods["core_gigpo"].compute_gigpo_outcome_advantage(
            token_level_rewards=x.scores, step_rewards=x.step_rewards,
            response_mask=x.response_mask, anchor_obs=x.anchor_obs, index=x.uid,
            traj_index=x.traj_uid, step_advantage_w=1.0, mode=MODES[case["env"]],
        )  # fmt: skip
        out[rows] = adv[:, 0].double().numpy()
    return out


def rounding_decided(case: dict[str, Any]) -> np.ndarray:
    """bool[n]: gigpo_dynamic rows of a group whose episode rewards are not all equal but lie
    within 1e-6 of each other: float32, float64 and the order of the sum may tie them or not."""
    n = len(case["group"])
    if case["estimator"] != "gigpo_dynamic":
        return np.zeros(n, dtype=bool)
    traj, group = np.asarray(case["traj"]), np.asarray(case["group"])
    E = np.bincount(traj, weights=np.asarray(case["reward"]))
    out = np.zeros(n, dtype=bool)
    for g in np.unique(group):
        e = E[np.unique(traj[group == g])]
        spread = e.max() - e.min()
        out[group == g] = 0 < spread <= 1e-6 * max(1.0, float(np.abs(e).max()))
    return out


def _compare(est: str, args, refs, rng) -> tuple[Tally, list, list]:
    """(rows per class and the largest differences, mismatching cases, golden cases)."""
    tally, bad, golden = Tally(), [], []
    for c in range(args.cases):
        case = random_case(rng, est)
        a = ours(case)
        f32 = run_reference(case, refs[0], float64=False)
        f64 = run_reference(case, refs[1], float64=True)
        cls = tally.add(a, f32, f64)
        unexplained = (cls >= 2) & ~rounding_decided(case)
        if unexplained.any():
            i = int(np.flatnonzero(unexplained)[0])
            bad.append(dict(case=c, row=i, ours=a[i], f32=f32[i], f64=f64[i]))
        if args.write and (c < args.golden_cases or (cls >= 2).any()):
            golden.append(golden_entry(case, f32, f64, cls))
    return tally, bad, golden


def main(argv: list[str] | None = None) -> int:
    args = golden_parser(
        __doc__, GOLDEN, ref_help="folder with the copied modules", cases=300,
        cases_help="random cases per estimator",
        estimators=dict(default=list(ESTIMATORS), choices=ESTIMATORS),
        golden_cases=8, golden_help="cases per estimator in the file",
    ).parse_args(argv)  # fmt: skip
    import torch

    torch.set_num_threads(1)
    refs = (load_reference(args.ref_dir, False), load_reference(args.ref_dir, True))
    rng = np.random.default_rng(args.seed)
    golden: list[dict[str, Any]] = []
    status = 0
    for est in args.estimators:
        tally, bad, cases = _compare(est, args, refs, rng)
        print(tally.summary(f"{est:<17}", args.cases)
              + f"; max |ours - f64| where equal: {tally.worst[2]:.2g}"
              + (f"; UNEXPLAINED in {len(bad)} cases, first: {bad[0]}" if bad else ""))  # fmt: skip
        golden += cases
        status |= bool(bad)
    if args.write:
        write_golden(GOLDEN, ABOUT, REF_COMMITS, args.seed, golden)
    return status


if __name__ == "__main__":
    sys.exit(main())
