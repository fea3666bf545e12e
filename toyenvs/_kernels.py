"""numba kernels of toyenvs, by topic; this module gathers them under one name (``kn``).

Every random draw comes from a splitmix64 stream seeded by (seed, trajectory index), so a
trajectory's draws do not depend on how many others run, on their order or on the machine:
same seed, same output, bit for bit. A K-step context is a mixed-radix code and the policy's
rows live in an open-addressing hash table (both in :mod:`toyenvs._context`).

The kernels live in one module per topic, and every name is importable from here as before:

- :mod:`toyenvs._rng`: the counter-based random streams (``stream_seed``, ``rng_uniform``)
  and the constants of splitmix64, ``SEED_MAX`` and ``U`` (unsigned array indices);
- :mod:`toyenvs._context`: the context table (initial logits, cdf rows, the hash table and
  the rollout loops' ``probe``);
- :mod:`toyenvs._step`: one env step (the action draw and the move);
- :mod:`toyenvs._mc`: the Monte Carlo truth (Q, A, V at queried steps; gradient estimates);
- :mod:`toyenvs._chain`: the exact (hidden state, context) chain and the reachable contexts;
- :mod:`toyenvs._rollout_kernel`: the unbranched rollout (``rollout_kernel_fast``).

The branched rollout's kernels are in :mod:`toyenvs.branched_rollout`.
"""

from __future__ import annotations

from toyenvs._chain import (
    _PAIR,
    _TRIPLE,
    backward_layer,
    build_node_index,
    expand_layer,
    forward_layer,
    lookup_nodes,
    reachable_contexts,
)
from toyenvs._context import (
    INIT_RANDOM,
    INIT_UNIFORM,
    fill_cdf,
    fill_cdf_row,
    init_logit,
    init_logits_rows,
    probe,
    rehash,
    slot_of,
    table_find,
    table_find_many,
    table_find_or_insert,
    table_insert_many,
)
from toyenvs._mc import (
    _add_trajectory,
    _play,
    _trajectory_gradient,
    mc_gradient_kernel,
    mc_state_kernel,
    simulate_from,
)
from toyenvs._rng import (
    GOLD,
    MIX1,
    MIX2,
    SEED_MAX,
    SH11,
    SH27,
    SH30,
    SH31,
    SH32,
    TO_UNIT,
    U,
    mix64,
    rng_uniform,
    stream_seed,
    z_seeds,
)
from toyenvs._rollout_kernel import (
    LANES,
    LN_P,
    LN_POS,
    LN_S,
    LN_ST,
    LN_T,
    LN_TR,
    _take_trajectory,
    context_keys_pass,
    fill_step_rows,
    rollout_kernel_fast,
    run_trajectories,
)
from toyenvs._step import (
    draw_and_move,
    env_next,
    sample_action,
)
from toyenvs.core import INVALID_PENALTY

__all__ = [
    "GOLD",
    "INIT_RANDOM",
    "INIT_UNIFORM",
    "INVALID_PENALTY",
    "LANES",
    "LN_P",
    "LN_POS",
    "LN_S",
    "LN_ST",
    "LN_T",
    "LN_TR",
    "MIX1",
    "MIX2",
    "SEED_MAX",
    "SH11",
    "SH27",
    "SH30",
    "SH31",
    "SH32",
    "TO_UNIT",
    "_PAIR",
    "_TRIPLE",
    "U",
    "_add_trajectory",
    "_play",
    "_take_trajectory",
    "_trajectory_gradient",
    "backward_layer",
    "build_node_index",
    "context_keys_pass",
    "draw_and_move",
    "env_next",
    "expand_layer",
    "fill_cdf",
    "fill_cdf_row",
    "fill_step_rows",
    "forward_layer",
    "init_logit",
    "init_logits_rows",
    "lookup_nodes",
    "mc_gradient_kernel",
    "mc_state_kernel",
    "mix64",
    "probe",
    "reachable_contexts",
    "rehash",
    "rng_uniform",
    "rollout_kernel_fast",
    "run_trajectories",
    "sample_action",
    "simulate_from",
    "slot_of",
    "stream_seed",
    "table_find",
    "table_find_many",
    "table_find_or_insert",
    "table_insert_many",
    "z_seeds",
]
