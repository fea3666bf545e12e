"""Hypothesis strategies for step batches that stress the estimators' edge cases."""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from hgpo import EstimatorConfig, StepBatch, estimator_reads

# Tied and near-tied rewards (1.0 vs 1.0001, 0.1 whose sums round) are the point of the set.
REWARDS = st.sampled_from([0.0, 0.0, 0.0, 1.0, 1.0001, 0.1, 10.0, -0.5, 3.0])


@st.composite
def step_batches(draw, max_groups: int = 3, max_traj: int = 4, max_len: int = 7, n_states: int = 3):
    """Batches with singleton groups, single-trajectory groups, revisited states within one
    trajectory, trajectories shorter than K, and tied / near-tied returns."""
    n_groups = draw(st.integers(1, max_groups))
    groups, rewards, states, actions, invalid = [], [], [], [], []
    group_ids = draw(
        st.lists(st.integers(-5, 50), min_size=n_groups, max_size=n_groups, unique=True)
    )
    for g in group_ids:
        for _ in range(draw(st.integers(1, max_traj))):
            T = draw(st.integers(1, max_len))
            groups.append(g)
            rewards.append(draw(st.lists(REWARDS, min_size=T, max_size=T)))
            states.append(draw(st.lists(st.integers(0, n_states - 1), min_size=T, max_size=T)))
            actions.append(draw(st.lists(st.integers(0, 1), min_size=T, max_size=T)))
            invalid.append(draw(st.lists(st.booleans(), min_size=T, max_size=T)))
    with_invalid = draw(st.booleans())
    b = StepBatch.from_trajectories(
        groups, rewards, states, actions, invalid if with_invalid else None
    )
    if draw(st.booleans()):  # arbitrary (non-dense, shuffled) trajectory ids
        perm = draw(st.permutations(list(range(b.n_traj))))
        ids = np.asarray(perm, dtype=np.int64)[b.traj_index] * 7 + 3
        b = StepBatch(b.group, ids, b.step, b.reward, b.state, b.action, b.invalid)
    return b


@st.composite
def configs(draw) -> EstimatorConfig:
    return EstimatorConfig(
        K=draw(st.integers(0, 4)),
        alpha=draw(st.sampled_from([0.0, 0.5, 1.0, 2.0])),
        gamma=draw(st.sampled_from([0.95, 1.0, 0.5, 0.0])),
        norm=draw(st.sampled_from(["mean_std", "mean"])),
        std=draw(st.sampled_from(["population", "sample"])),
        episode_std=draw(st.sampled_from(["population", "sample"])),
        early=draw(st.sampled_from(["paper", "drop"])),
        weight_offset=draw(st.sampled_from([1.0, 2.0])),
        weight_eps=draw(st.sampled_from([0.0, 1e-6])),
        zero_rule=draw(st.sampled_from(["degenerate", "value", "none"])),
        base_group=draw(st.booleans()),
        include_actions=draw(st.booleans()),
        penalty_mode=draw(st.sampled_from(["return", "after_discount"])),
        episode_pooling=draw(st.sampled_from(["trajectory", "steps"])),
        episode_singleton=draw(st.sampled_from(["zero", "raw"])),
        omega=draw(st.sampled_from([1.0, 0.5])),
        leave_one_out=draw(st.booleans()),
        empg_k=draw(st.sampled_from([1.0, 0.0, 3.0])),
        empg_k_future=draw(st.sampled_from([1.0, 0.5])),
        empg_zeta=draw(st.sampled_from([0.1, 0.0, 1.0])),
        empg_eps=draw(st.sampled_from([1e-8, 0.0])),
        empg_final_norm=draw(st.sampled_from(["mean", "none"])),
        gigpo_similarity_thresh=draw(st.sampled_from([0.95, 0.9, 0.6, 0.3, 0.99])),
        gigpo_dynamic_rescale=draw(st.booleans()),
    )


@st.composite
def graph_batches(draw, max_traj: int = 5, max_len: int = 6):
    """[graphgpo] step batches (few states, so trajectories cross in the graph), half of them
    with a next_state column whose terminal states are sometimes a state the group has seen
    (reconnecting the graph) and sometimes a new one."""
    b = draw(step_batches(max_traj=max_traj, max_len=max_len))
    if draw(st.booleans()):
        last = b.traj_start + b.traj_len - 1
        terminal = draw(st.lists(st.integers(0, 3), min_size=b.n_traj, max_size=b.n_traj))
        ns = np.empty_like(b.state)
        ns[:-1] = b.state[1:]
        ns[last] = terminal
        b = StepBatch(b.group, b.traj, b.step, b.reward, b.state, b.action, b.invalid,
                      next_state=ns)  # fmt: skip
    return b


@st.composite
def graph_configs(draw) -> EstimatorConfig:
    """[graphgpo] ``configs()`` with GraphGPO's own options drawn too."""
    w_step, w_episode = draw(st.sampled_from([(1.0, 1.0), (1.0, 0.0), (0.0, 1.0), (0.5, 2.0)]))
    return draw(configs()).replace(
        graph_gamma=draw(st.sampled_from([0.1, 0.2, 0.95, 1.0, 0.0])),
        graph_normalize_distance=draw(st.booleans()),
        graph_success_return=draw(st.sampled_from([0.0, 1.0, -0.5])),
        graph_step_weight=w_step,
        graph_episode_weight=w_episode,
    )


# Entropies with ties (all-equal batches exercise the min-max normalisation's eps), zeros and
# a wide range.
ENTROPIES = st.sampled_from([0.0, 0.5, 0.5, 1.0, 2.302585, 1e-3, 7.0])

_LONG = "you see a cabinet 1, a cabinet 2, a countertop 1, a drawer 1, a fridge 1, " * 4
# Observation texts whose difflib ratios straddle the thresholds: near-copies, a prefix, the
# empty text, and texts past 200 characters where difflib's autojunk makes the ratio
# asymmetric (ratio(a, b) != ratio(b, a)).
OBSERVATIONS = [
    "you see a fridge 1",
    "you see a fridge 2",
    "you see a fridge",
    "you see a cabinet 1",
    "On the fridge 1, you see nothing.",
    "kitchen",
    "",
    _LONG,
    _LONG.replace("fridge 1", "fridge 2", 2),
    _LONG[:-40] + "a sinkbasin 1, and a toaster 1.",
    "ab" * 120,
    "ba" * 119 + "c",
]


@st.composite
def step_inputs(draw, name: str, batch: StepBatch) -> dict:
    """The per-step inputs estimator ``name`` reads, drawn for ``batch`` (keyword arguments of
    compute_advantages)."""
    reads = estimator_reads(name)
    n = batch.n_steps
    out: dict = {}
    if "entropy" in reads:
        out["entropy"] = np.asarray(draw(st.lists(ENTROPIES, min_size=n, max_size=n)))
    if "observations" in reads:
        if draw(st.booleans()):  # one text per state (a branch then starts like its parent)
            pool = draw(st.permutations(OBSERVATIONS))
            out["observations"] = [pool[int(s) % len(pool)] for s in batch.state]
        else:
            out["observations"] = draw(
                st.lists(st.sampled_from(OBSERVATIONS), min_size=n, max_size=n)
            )
    if "values" in reads:
        out["values"] = np.asarray(draw(st.lists(REWARDS, min_size=n, max_size=n)))
    return out


def default_inputs(name: str, batch: StepBatch) -> dict:
    """Fixed inputs for the estimators that read them, for tests not about those inputs:
    entropy 0, 0.5, ..., 2 cycling over the rows, observation "state <s>", values 0."""
    reads = estimator_reads(name)
    out: dict = {}
    if "entropy" in reads:
        out["entropy"] = (np.arange(batch.n_steps) % 5) * 0.5
    if "observations" in reads:
        out["observations"] = [f"state {s}" for s in batch.state.tolist()]
    if "values" in reads:
        out["values"] = np.zeros(batch.n_steps)
    return out


@st.composite
def spo3_options(draw) -> dict:
    """3SPO's own options (EstimatorConfig's spo3_* fields), edge values included."""
    return dict(
        spo3_alpha=draw(st.sampled_from([0.0, 0.5, 1.0, 50.0])),
        spo3_xi=draw(st.sampled_from([0.0, 1.0, 2.0, 10.0])),
        spo3_zeta=draw(st.sampled_from([0.0, 0.1, 0.5, 1.0])),
        spo3_omega_k=draw(st.sampled_from([0.0, 0.1, 1.0])),
        spo3_eps=draw(st.sampled_from([0.0, 1e-6])),
        spo3_count_scope=draw(st.sampled_from(["batch", "group"])),
        spo3_target=draw(st.sampled_from(["reward", "return"])),
        spo3_terminal_score=draw(st.sampled_from([1.0, 0.0, 0.5])),
    )


@st.composite
def ecpo_options(draw) -> dict:
    """ECPO's own options (EstimatorConfig's ecpo_* fields), edge values included."""
    return dict(
        ecpo_kappa=draw(st.sampled_from([2.0, 0.0, 0.5, 1e3])),
        ecpo_tau=draw(st.sampled_from([4.0, 1.0, 0.25, 1e3])),
        ecpo_omega=draw(st.sampled_from([1.0, 0.0, 0.5])),
        ecpo_gate=draw(st.sampled_from(["variance", "none"])),
        ecpo_gate_eps=draw(st.sampled_from([0.0, 1e-6, 1.0])),
    )
