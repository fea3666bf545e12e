"""Run the GraphGPO authors' advantage code next to ``hgpo``'s ``graphgpo`` and freeze the result.

    python -m benchmarks.make_graphgpo_golden --ref-dir /tmp/graphgpo_ref [--cases 400] [--write]

This is NOT run in CI: it needs torch, networkx and matplotlib (imported by the reference
module) and a local copy of the public reference code, which this repository does not ship.
It checks, on random batches built to hit the edge cases (groups whose trajectories cross in
the graph, revisited states and self-loops, failed trajectories ending in a state of the
group or in a new one, groups without a success, single-trajectory groups, invalid actions,
several rollout groups, both benchmarks' gammas, both modes, ``normalize_distance``, the
step/episode weights), that ``compute_advantages("graphgpo", batch,
config=reference_config("graphgpo", env, ...))`` gives the reference code's numbers, and with
``--write`` stores a small set of inputs and the reference outputs in
``tests/hgpo/data/graphgpo_golden.json`` for ``tests/hgpo/test_graphgpo_golden.py``.

Reference code used (verl-agent PR #256, commit 234a913609ef820de826f2276b7b912e4b8b8410,
"Add recipe/GraphGPO"; read from the mirror of zzj1111/alfworldauto, where these files are
unchanged at 51c1a039c38f1af54b09c05b81b76ce52d72c383; the fork named in the issue,
floatingstarZ/verl-agent@113f665c7f3ce99422b2237102762db31131bd17, could not be read whole:
its recipe README and config differ from these only in set-up lines), copied into
``--ref-dir`` only:

- ``recipe/GraphGPO/core_graph.py`` (blob 71eafd72143746fd603cddd211c462533ff38da2), copied
  whole into ``<ref-dir>/core_graph.py``;
- ``gigpo/core_gigpo.py`` (blob 116dab941157c4236d4228de39346273694a0695, the file
  ``make_verl_agent_golden.py`` uses too), copied whole into ``<ref-dir>/core_gigpo.py``;
  core_graph.py imports it as ``gigpo.core_gigpo``;
- ``<ref-dir>/verl/__init__.py``: a stub defining ``DataProto`` (an object with ``.batch``,
  ``.non_tensor_batch`` and ``.meta_info`` dicts), the only verl name those modules import.

The glue below replays what the authors' trainer does before the estimator:
``recipe/GraphGPO/rollout_loop.py`` (``gather_rollout_data``: each step row carries its
``anchor_obs`` and ``next_obs``, the next step's anchor or, after the last step, the terminal
observation, replaced by ``'success'`` when the episode reward, a float32 running sum of the
env rewards, is > 0), ``recipe/GraphGPO/graphgpo_ray_trainer.py`` (``ComplexGraph.from_data``,
``Calculate_all_shortest_path``, ``compute_graph_path_returns``; the episode reward at the last
response token of every step row, ``reward_manager/episode.py``; ``apply_invalid_action_penalty``
subtracting 0.1 x invalid from that token and from the step return; then
``compute_graphgpo_outcome_advantage``). Observations are the strings ``"obs <state>"``.

A case either gives ours ``StepBatch.next_state`` (the terminal states are drawn from the
group's states and one more, so a failed trajectory's end may rejoin the graph) or leaves it
out, and then the reference gets a terminal observation no other row has (``"end <traj>"``):
the two readings of a failed trajectory's end that ``graphgpo`` documents.

Each case is run twice: as published (float32) and with float32 replaced by float64 in the
copied modules (torch's default dtype set to float64), and each row is classed as in
``make_verl_agent_golden.py``: equal to both runs; to the float64 run only (float32 rounding
throws the published code off); to the float32 run only; to neither (a semantic mismatch:
reported, and the script exits 1).
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
    case_step_batch,
    compare_cases,
    episode_rewards,
    exec_source,
    golden_parser,
    golden_path,
    require_files,
    terminal_next_state,
    torch_default_dtype,
    trainer_scores,
    write_golden,
)
from hgpo import StepBatch, compute_advantages, reference_config

GOLDEN = golden_path("graphgpo")
REF_COMMIT = "verl-agent@234a913609ef820de826f2276b7b912e4b8b8410 (zzj1111/alfworldauto@51c1a039)"
REWARDS = np.array([0.0, 0.0, 0.0, 0.0, 1.0, 0.1, -0.5])
WEIGHTS = [(1.0, 1.0), (1.0, 1.0), (1.0, 0.0), (0.5, 2.0)]


def load_reference(ref_dir: Path, float64: bool) -> types.ModuleType:
    """Import the copied core_graph module (its core_gigpo as ``gigpo.core_gigpo``), optionally
    with float32 replaced by float64 in both."""
    sys.path.insert(0, str(ref_dir))  # for the verl stub
    gigpo = types.ModuleType("gigpo")
    gigpo.__path__ = []  # a package, for "from gigpo.core_gigpo import ..."
    core_gigpo = exec_source(ref_dir / "core_gigpo.py", "gigpo.core_gigpo", float64)
    gigpo.core_gigpo = core_gigpo
    saved = {k: sys.modules.get(k) for k in ("gigpo", "gigpo.core_gigpo")}
    sys.modules.update({"gigpo": gigpo, "gigpo.core_gigpo": core_gigpo})
    try:
        with redirect_stdout(io.StringIO()):
            name = f"ref_core_graph_{'f64' if float64 else 'f32'}"
            return exec_source(ref_dir / "core_graph.py", name, float64)
    finally:
        for k, v in saved.items():
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v


def random_case(rng: np.random.Generator) -> dict[str, Any]:
    """Inputs of one case: a batch (with terminal states) plus the settings."""
    n_groups = int(rng.integers(1, 4))
    group, traj, step, reward, state, invalid, resp_len, terminal = [], [], [], [], [], [], [], []
    tid = 0
    for g in rng.choice(100, n_groups, replace=False):
        n_states = int(rng.integers(2, 6))
        for _ in range(int(rng.integers(1, 7))):
            T = int(rng.integers(1, 8))
            group += [int(g)] * T
            traj += [tid] * T
            step += list(range(T))
            r = rng.choice(REWARDS, T, p=[0.25, 0.25, 0.15, 0.15, 0.08, 0.07, 0.05])
            if rng.random() < 0.35:
                r[-1] = 10.0  # success at the last step
            reward += [float(x) for x in r]
            state += [int(s) for s in rng.integers(0, n_states, T)]
            invalid += [bool(x) for x in rng.random(T) < 0.2]
            resp_len += [int(x) for x in rng.integers(1, 4, T)]
            terminal.append(int(rng.integers(0, n_states + 1)))  # n_states: a new state
            tid += 1
    w_step, w_episode = WEIGHTS[int(rng.integers(len(WEIGHTS)))]
    return dict(
        env=str(rng.choice(["alfworld", "webshop"])),
        mode=str(rng.choice(["mean_std_norm", "mean_std_norm", "mean_norm"])),
        normalize_distance=bool(rng.random() < 0.3),
        step_weight=w_step,
        episode_weight=w_episode,
        with_next_state=bool(rng.random() < 0.6),
        group=group,
        traj=traj,
        step=step,
        reward=reward,
        state=state,
        invalid=invalid,
        resp_len=resp_len,
        terminal=terminal,
    )


def _observations(case: dict[str, Any], episode: dict[int, Any]) -> tuple[np.ndarray, np.ndarray]:
    """(anchor_obs, next_obs) as gather_rollout_data leaves them."""
    n = len(case["group"])
    anchor = np.array([f"obs {s}" for s in case["state"]], dtype=object)
    nxt = np.empty(n, dtype=object)
    traj = case["traj"]
    for i in range(n):
        if i + 1 < n and traj[i + 1] == traj[i]:
            nxt[i] = anchor[i + 1]
        elif episode[traj[i]] > 0:
            nxt[i] = "success"
        elif case["with_next_state"]:
            nxt[i] = f"obs {case['terminal'][traj[i]]}"
        else:
            nxt[i] = f"end {traj[i]}"  # seen nowhere else
    return anchor, nxt


def run_reference(case: dict[str, Any], mod: types.ModuleType, float64: bool) -> np.ndarray:
    """The reference pipeline on one case; returns the per-step advantage."""
    with torch_default_dtype(float64), redirect_stdout(io.StringIO()):
        return _reference(case, mod, float64)


def _reference(case: dict[str, Any], mod: types.ModuleType, float64: bool) -> np.ndarray:
    import torch

    ndt = np.float64 if float64 else np.float32
    n = len(case["group"])
    rewards = np.asarray(case["reward"], dtype=ndt)
    traj = np.asarray(case["traj"])
    valid = ~np.asarray(case["invalid"], dtype=bool)
    episode = episode_rewards(case, float64)
    anchor, nxt = _observations(case, episode)
    uid = np.array([f"g{g}" for g in case["group"]], dtype=object)
    traj_uid = np.array([f"t{t:04d}" for t in case["traj"]], dtype=object)
    batch = mod.DataProto(
        batch={"input_ids": torch.zeros((n, 1), dtype=torch.long)},
        non_tensor_batch={
            "rewards": rewards, "traj_uid": traj_uid, "uid": uid,
            "active_masks": np.ones(n, dtype=bool), "anchor_obs": anchor, "next_obs": nxt,
            "text_actions": np.array(["act"] * n, dtype=object),
            "episode_rewards": np.array([episode[t] for t in traj.tolist()], dtype=ndt),
            "is_action_valid": valid,
        },
    )  # fmt: skip
    gamma = reference_config("graphgpo", env=case["env"]).graph_gamma  # recipe/GraphGPO/run_*.sh
    graphs = mod.ComplexGraph.from_data(batch, enable_similarity=False, similarity_thresh=0.95)
    mod.ComplexGraph.Calculate_all_shortest_path(graphs)
    step_rewards = mod.compute_graph_path_returns(
        batch=batch, Gs=graphs, gamma=gamma, normalize_distance=case["normalize_distance"]
    )
    response_mask, scores, penalty = trainer_scores(case, episode, float64)
    for i in range(n):
        step_rewards[i] -= 0.1 * penalty[i]
    adv, _ = mod.compute_graphgpo_outcome_advantage(
        token_level_rewards=scores, step_rewards=step_rewards, response_mask=response_mask,
        anchor_obs=anchor, index=uid, traj_index=traj_uid, epsilon=1e-6,
        step_advantage_w=case["step_weight"], episode_advantage_w=case["episode_weight"],
        mode=case["mode"],
    )  # fmt: skip
    return adv[:, 0].double().numpy()  # every row has >= 1 response token


def case_batch(case: dict[str, Any]) -> StepBatch:
    """The StepBatch of one golden case (also used by tests/hgpo/test_graphgpo_golden.py)."""
    return case_step_batch(
        case,
        invalid=np.asarray(case["invalid"], dtype=bool),
        next_state=terminal_next_state(case) if case["with_next_state"] else None,
    )


def case_config(case: dict[str, Any]):
    """``reference_config("graphgpo", env)`` with the case's mode, distance rule and weights."""
    return reference_config(
        "graphgpo",
        env=case["env"],
        norm="mean_std" if case["mode"] == "mean_std_norm" else "mean",
        graph_normalize_distance=case["normalize_distance"],
        graph_step_weight=case["step_weight"],
        graph_episode_weight=case["episode_weight"],
    )


def ours(case: dict[str, Any]) -> np.ndarray:
    return compute_advantages("graphgpo", case_batch(case), config=case_config(case)).advantages


def main(argv: list[str] | None = None) -> int:
    p = golden_parser(__doc__, GOLDEN, golden_cases=16, golden_help="first cases in the file",
                      extra_cases=8)  # fmt: skip
    args = p.parse_args(argv)
    require_files(p, args.ref_dir, ("core_graph.py", "core_gigpo.py", "verl/__init__.py"))
    import torch

    torch.set_num_threads(1)
    refs = (load_reference(args.ref_dir, False), load_reference(args.ref_dir, True))
    rep = compare_cases(
        args, random_case, ours, lambda case, f64: run_reference(case, refs[f64], float64=f64)
    )
    print(rep.summary("graphgpo", args.cases))
    print("       " + rep.worst_text())
    if rep.bad:
        print(f"       NOT EQUAL to the float64 run in {len(rep.bad)} cases, first: {rep.bad[0]}")
    if args.write:
        write_golden(GOLDEN, ABOUT, REF_COMMIT, args.seed, rep.golden)
    return int(bool(rep.bad))


ABOUT = (
    "Inputs and the outputs of the GraphGPO authors' advantage code (verl-agent "
    "recipe/GraphGPO/core_graph.py with gigpo/core_gigpo.py, after the glue of "
    "recipe/GraphGPO/rollout_loop.py and graphgpo_ray_trainer.py) made by "
    "benchmarks/make_graphgpo_golden.py; reference_f32 as published (float32), "
    "reference_f64 the same code with float32 replaced by float64."
)


if __name__ == "__main__":
    sys.exit(main())
