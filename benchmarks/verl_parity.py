"""Parity of our estimators inside verl: verl's compute_advantage against our compute_advantages.

Run: ``python -m benchmarks.verl_parity [--seeds 50]`` (needs the [verl] extra; CPU only).

Two checks, printed one line per case:

1. ``exact``: a DataProto built the way verl-agent builds one (one row per agent step: three
   rollout groups of four episodes of 1-6 steps, responses padded to 7 tokens, a few
   observations per group so that steps share states and contexts, the env reward and the
   action validity per row) goes through verl's own ``ray_trainer.compute_advantage`` (ours
   once ``hgpo.integrations.verl`` is imported), in three row layouts (verl-agent's emission
   order; step-major; shuffled, read back through ``step_index``). Its token advantages are
   compared with our ``compute_advantages`` on a StepBatch built from the per-episode lists
   alone (``StepBatch.from_trajectories``), broadcast as ``A[row] * response_mask[row]`` in
   float32: the line gives the rows and response tokens compared and how many token
   positions (padding included) differ at all.
2. ``verl's own``: ``hgpo.grpo`` / ``hgpo.rloo`` against verl's ``grpo`` / ``rloo`` on one-step
   episodes (16 groups, one of a single episode), verl's in float32, ours in float64: the
   largest difference relative to max(1, |A|).

The tests (tests/integrations/test_verl.py) use these builders and assert the same.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

import numpy as np

from hgpo import EstimatorConfig, StepBatch, compute_advantages, state_ids
from hgpo.options import ArgumentParser, check_int

CASES = [
    ("grpo", {}),
    ("rloo", {}),
    ("stepwise", {}),
    ("gigpo", {}),
    ("oracle", {"K": 2}),
    ("hgpo", {"K": 2}),
    ("hgpo", {"K": 4}),
    ("hgpo", {"K": 2, "include_actions": True}),
    ("hgpo", {"K": 4, "base_group": True, "zero_rule": "value"}),
    ("hgpo-nohog2", {"K": 4}),
    ("hgpo-uniform", {"K": 2}),
    ("gae", {}),
    ("3spo", {}),
    ("3spo", {"spo3_alpha": 1.0, "spo3_count_scope": "group", "spo3_target": "return"}),
]
GAMMA = 0.95
LAM = 0.9


@dataclass
class Episodes:
    """The per-trajectory lists a rollout produced (the independent reference)."""

    groups: list[int]
    rewards: list[list[float]]
    obs: list[list[str]]
    valid: list[list[bool]]
    lengths: list[list[int]]  # response length of every step
    tokens: list[list[list[int]]]  # response tokens of every step
    values: list[list[float]]  # the critic's V(s_t) at the step's first response token


def make_episodes(
    seed: int, n_groups: int = 3, n_per_group: int = 4, width: int = 7, max_steps: int = 6
) -> Episodes:
    """Random episodes: ``n_groups`` rollout groups of ``n_per_group`` episodes of 1 to
    ``max_steps`` steps, responses of 1 to ``width`` tokens."""
    rng = np.random.default_rng(seed)
    ep = Episodes([], [], [], [], [], [], [])
    for g in range(n_groups):
        for _ in range(n_per_group):
            T = int(rng.integers(1, max_steps + 1))
            ep.groups.append(g)
            ep.rewards.append([float(r) for r in rng.choice([0.0, 0.0, 0.5, 1.0, 10.0], T)])
            # few observations per group, so steps share states and contexts
            ep.obs.append([f"task {g}: room {int(rng.integers(0, 3))}" for _ in range(T)])
            ep.valid.append([bool(v) for v in rng.random(T) > 0.2])
            lens = [int(x) for x in rng.integers(1, width + 1, T)]
            ep.lengths.append(lens)
            ep.tokens.append([[int(t) for t in rng.integers(0, 3, n)] for n in lens])
            ep.values.append([float(v) for v in rng.normal(size=T).astype(np.float32)])
    return ep


def reference_batch(ep: Episodes, order: list[int], include_actions: bool) -> StepBatch:
    """Our StepBatch of the episodes, trajectories in ``order``, from the lists alone."""
    pick = [ep.obs[i] for i in order]
    flat_obs = [o for traj in pick for o in traj]
    keys = state_ids(flat_obs)
    states, at = [], 0
    for traj in pick:
        states.append(keys[at : at + len(traj)].tolist())
        at += len(traj)
    actions = None
    if include_actions:
        flat = [bytes(np.asarray(t, dtype=np.int64)) for i in order for t in ep.tokens[i]]
        akeys, actions, at = state_ids(flat), [], 0
        for i in order:
            actions.append(akeys[at : at + len(ep.tokens[i])].tolist())
            at += len(ep.tokens[i])
    return StepBatch.from_trajectories(
        [ep.groups[i] for i in order],
        [ep.rewards[i] for i in order],
        states,
        actions,
        [[not v for v in ep.valid[i]] for i in order],
    )


def rows_of(ep: Episodes, layout: str, seed: int) -> list[tuple[int, int]]:
    """(trajectory, step) of every DataProto row. "emitted": verl-agent's gather order
    (trajectory by trajectory, step order); "steps": step-major, as the rollout loop's
    per-step batches are (a trajectory's rows in step order, interleaved); "shuffled": any
    order (verl's balance_batch), read back through step_index."""
    rows = [(i, t) for i in range(len(ep.groups)) for t in range(len(ep.rewards[i]))]
    if layout == "steps":
        rows.sort(key=lambda r: (r[1], r[0]))
    elif layout == "shuffled":
        perm = np.random.default_rng(seed + 1).permutation(len(rows))
        rows = [rows[k] for k in perm]
    return rows


def make_dataproto(ep: Episodes, rows: list[tuple[int, int]], width: int = 7, step_index=False):
    import torch  # the [llm] extra, loaded once the flags are read
    from verl import DataProto

    n = len(rows)
    uids = [str(uuid.UUID(int=1000 + g)) for g in range(max(ep.groups) + 1)]
    tuids = [str(uuid.UUID(int=5000 + i)) for i in range(len(ep.groups))]
    responses = torch.zeros((n, width), dtype=torch.int64)
    mask = torch.zeros((n, width), dtype=torch.int64)
    tlr = torch.zeros((n, width), dtype=torch.float32)
    values = torch.randn((n, width), generator=torch.Generator().manual_seed(n))
    for r, (i, t) in enumerate(rows):
        L = ep.lengths[i][t]
        responses[r, :L] = torch.tensor(ep.tokens[i][t])
        mask[r, :L] = 1
        tlr[r, L - 1] = sum(ep.rewards[i])  # verl-agent: the episode reward at the last token
        values[r, 0] = ep.values[i][t]  # V(s_t) at the first response token
    non_tensor = {
        "uid": np.array([uids[ep.groups[i]] for i, _ in rows], dtype=object),
        "traj_uid": np.array([tuids[i] for i, _ in rows], dtype=object),
        "anchor_obs": np.array([ep.obs[i][t] for i, t in rows], dtype=object),
        "rewards": np.array([ep.rewards[i][t] for i, t in rows], dtype=object),
        "is_action_valid": np.array([ep.valid[i][t] for i, t in rows], dtype=object),
    }
    if step_index:
        non_tensor["step_index"] = np.array([t for _, t in rows], dtype=object)
    tensors = {"responses": responses, "response_mask": mask, "token_level_rewards": tlr}
    tensors["values"] = values
    return DataProto.from_dict(tensors=tensors, non_tensors=non_tensor)


def algo_config(options: dict):
    from omegaconf import OmegaConf

    return OmegaConf.create({"gamma": GAMMA, "lam": LAM, "hgpo": options})


def first_seen(rows: list[tuple[int, int]]) -> list[int]:
    return list(dict.fromkeys(i for i, _ in rows))


def outcome_dataproto(seed: int, n_groups: int = 16, n: int = 5):
    """The outcome setting verl's own grpo/rloo are for: one row per episode (one step),
    the score at the last response token; one group of a single episode."""
    import torch  # the [llm] extra, loaded once the flags are read
    from verl import DataProto

    rng = np.random.default_rng(seed)
    sizes = [n] * (n_groups - 1) + [1]
    rows = sum(sizes)
    width = 6
    lens = rng.integers(1, width + 1, rows)
    mask = (torch.arange(width)[None, :] < torch.tensor(lens)[:, None]).long()
    tlr = torch.zeros((rows, width), dtype=torch.float32)
    tlr[torch.arange(rows), torch.tensor(lens) - 1] = torch.tensor(
        rng.choice([0.0, 0.25, 1.0, 3.0], rows), dtype=torch.float32
    )
    uid = np.array([f"u{g}" for g, s in enumerate(sizes) for _ in range(s)], dtype=object)
    return DataProto.from_dict(
        tensors={"response_mask": mask, "token_level_rewards": tlr},
        non_tensors={
            "uid": uid,
            "traj_uid": np.array([f"t{i}" for i in range(rows)], dtype=object),
            "anchor_obs": np.array(["start"] * rows, dtype=object),
        },
    )


OUTCOME = {  # ours: (options, norm_adv_by_std_in_grpo) against verl's own estimator
    "grpo": ({"episode_std": "sample", "episode_singleton": "raw"}, True),
    "rloo": ({"episode_singleton": "raw"}, False),
}


def exact_case(name: str, options: dict, layout: str, seed: int) -> tuple[int, int, int]:
    """(rows, response tokens, token positions that differ, padding included) of one case
    (check 1 of the module doc)."""
    from verl.trainer.ppo import ray_trainer

    from hgpo.integrations.verl import verl_name

    ep = make_episodes(seed)
    rows = rows_of(ep, layout, seed)
    data = make_dataproto(ep, rows, step_index=layout == "shuffled")
    out = ray_trainer.compute_advantage(
        data, adv_estimator=verl_name(name), gamma=GAMMA, lam=LAM, config=algo_config(options)
    )
    want, _, _ = reference_tokens(ep, rows, name, options, data.batch["response_mask"])
    got, mask = out.batch["advantages"], data.batch["response_mask"]
    return int(mask.shape[0]), int(mask.sum()), int((got != want).sum())


def reference_tokens(
    ep: Episodes, rows: list, name: str, options: dict, mask
) -> tuple[Any, Any, np.ndarray]:
    """Our compute_advantages on the episodes' own StepBatch: the float32 token advantages and
    returns in the DataProto's row order, and the step advantages of the StepBatch."""
    import torch  # the [llm] extra, loaded once the flags are read

    order = first_seen(rows)  # the contract: trajectories in order of first appearance
    batch = reference_batch(ep, order, options.get("include_actions", False))
    values = np.array([v for i in order for v in ep.values[i]]) if name == "gae" else None
    cfg = EstimatorConfig(gamma=GAMMA, gae_lambda=LAM, **options)
    ref = compute_advantages(name, batch, cfg, values=values)
    start = {i: int(s) for i, s in zip(order, batch.traj_start, strict=True)}
    at = [start[i] + t for i, t in rows]  # the reference row of every DataProto row
    mask = mask.float()
    tokens = [
        torch.tensor(col[at], dtype=torch.float32)[:, None] * mask
        for col in (ref.advantages, ref.returns)
    ]
    return tokens[0], tokens[1], ref.advantages


def outcome_case(name: str, seed: int) -> float:
    """max |ours - verl's| / max(1, |verl's|) of check 2 of the module doc."""
    import torch  # the [llm] extra, loaded once the flags are read
    from verl.trainer.ppo import ray_trainer

    from hgpo.integrations.verl import verl_name

    options, by_std = OUTCOME[name]
    mine = ray_trainer.compute_advantage(
        outcome_dataproto(seed),
        adv_estimator=verl_name(name),
        norm_adv_by_std_in_grpo=by_std,
        config=algo_config(options),
    ).batch["advantages"]
    ref = ray_trainer.compute_advantage(
        outcome_dataproto(seed), adv_estimator=name, config=algo_config({})
    ).batch["advantages"]
    return float(((mine - ref).abs() / torch.clamp(ref.abs(), min=1.0)).max())


def time_case(name: str, options: dict, repeats: int = 5) -> tuple[int, float, float]:
    """(rows, seconds of ours, seconds of verl's grpo): the median over ``repeats`` of
    verl's compute_advantage on one batch of the paper's shape (16 groups of 8 episodes of
    1-50 steps, about 3,300 steps; responses of up to 512 tokens)."""
    import time

    from verl.trainer.ppo import ray_trainer

    from hgpo.integrations.verl import verl_name

    ep = make_episodes(0, n_groups=16, n_per_group=8, width=512, max_steps=50)
    rows = rows_of(ep, "emitted", 0)
    data = make_dataproto(ep, rows, width=512)

    def median(estimator: str, config) -> float:
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            ray_trainer.compute_advantage(data, adv_estimator=estimator, config=config)
            times.append(time.perf_counter() - t0)
        return float(np.median(times))

    ours = median(verl_name(name), algo_config(options))
    return len(rows), ours, median("grpo", algo_config({}))


def main(argv: list[str] | None = None) -> None:
    ap = ArgumentParser(prog="python -m benchmarks.verl_parity", description=__doc__)
    ap.add_argument("--seeds", type=int, default=20, help="random batches per case (default 20)")
    ap.add_argument(
        "--time", action="store_true", help="also time the advantage step on the paper's shape"
    )
    args = ap.parse_args(argv)
    try:
        check_int("--seeds", args.seeds, lo=1, hi=100_000)
    except ValueError as exc:
        ap.error(str(exc))
    import torch  # the [llm] extra, loaded once the flags are read
    import verl

    print(f"verl {verl.__version__}, torch {torch.__version__}, {args.seeds} batches per case")
    for name, options in CASES:
        for layout in ("emitted", "steps", "shuffled"):
            total = np.zeros(3, dtype=np.int64)
            for seed in range(args.seeds):
                total += exact_case(name, options, layout, seed)
            rows, tokens, differ = total.tolist()
            opts = ",".join(f"{k}={v}" for k, v in options.items()) or "-"
            print(
                f"exact  {name:12s} {opts:35s} {layout:8s} {rows} rows, {tokens} tokens: "
                f"{differ} differ"
            )
    for name in sorted(OUTCOME):
        worst = max(outcome_case(name, seed) for seed in range(args.seeds))
        print(f"verl's own {name}: largest difference {worst:.2e} relative to max(1, |A|)")
    if args.time:
        import os

        for name, options in (("hgpo", {"K": 4}), ("gigpo", {})):
            n, ours, grpo = time_case(name, options)
            print(
                f"time   {name} {options or ''}: {n} steps x 512 tokens, compute_advantage "
                f"{ours * 1e3:.1f} ms (verl's grpo {grpo * 1e3:.1f} ms), load average "
                f"{os.getloadavg()[0]:.1f}"
            )


if __name__ == "__main__":
    main()
