"""EstimatorConfig: every option of every estimator, validated at construction."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from hgpo.fields import check_fields, field_choices, field_docs, setting
from hgpo.options import OptionError, check_int

__all__ = [
    "MAX_K", "REFERENCE_ESTIMATORS", "REFERENCE_ESTIMATOR_PROFILES", "REFERENCE_PROFILES",
    "REFERENCE_TERMS", "EstimatorConfig",
    "check_K", "field_docs", "reference_config",
]  # fmt: skip

MAX_K = 256
"""Deepest hierarchy allowed. Levels past the longest trajectory only repeat (or, with
early="drop", empty) the last one, and the paper's K is 2 or 4."""


def check_K(where: str, K: Any) -> int:
    """K as a Python int in 0..MAX_K, checked before anything of size (K + 1) x n is made."""
    try:
        return check_int(where, K, lo=0, hi=MAX_K)
    except OptionError as exc:
        raise OptionError(
            f"{exc} (each level is a pass over the batch and a row of the (K + 1) x n outputs)"
        ) from None


def _check_weights(K: int, alpha: float, weight_offset: float, base_weight: float) -> None:
    """Eq. (7)'s raw weights (k + weight_offset)^alpha, k = 0..K, must be non-zero and their sum
    (with base_weight) finite: an overflow would give inf / inf = NaN advantages, an underflow
    a level silently left unused."""

    def raw(k: int) -> float:
        try:
            return (k + weight_offset) ** alpha
        except OverflowError:
            return math.inf

    w0, wK = raw(0), raw(K)
    if not (math.isfinite((K + 1) * max(w0, wK) + base_weight) and min(w0, wK) > 0):
        raise OptionError(
            f"EstimatorConfig: the level weights (k + weight_offset)^alpha, k = 0..{K}, must be "
            f"finite and non-zero in float64, with their sum; weight_offset={weight_offset!r} "
            f"and alpha={alpha!r} give {w0!r} at k = 0 and {wK!r} at k = {K}: choose a smaller "
            "alpha or a weight_offset nearer 1"
        )


@dataclass(frozen=True)
class EstimatorConfig:
    """Options of the advantage estimators. Defaults follow the paper (hgpo-spec.md).

    ``reference_config`` gives the options that reproduce the authors' public code instead.
    """

    K: int = setting(2, lo=0, hi=MAX_K)  # checked by check_K first: its message says the cost
    """Depth of the hierarchy = memory length: levels k = 0..K (Eq. 3-4)."""
    alpha: float = setting(1.0, lo=0.0)
    """Weight sharpness of Eq. (7): w_k proportional to (k + weight_offset)^alpha; alpha >= 0."""
    gamma: float = setting(0.95, lo=0.0, hi=1.0)
    """Discount of the step return R_t."""
    norm: str = setting("mean_std", choices=("mean_std", "mean"))
    """Group normalisation: "mean_std" ((x - mean) / (std + eps)) or "mean" (x - mean, Dr.GRPO)."""
    std: str = setting("population", choices=("population", "sample"))
    """Std of step-level groups (levels, stepwise, oracle): "population" or "sample"."""
    episode_std: str = setting("population", choices=("population", "sample"))
    """Std of episode-level groups (grpo, gigpo's episode term, base_group)."""
    eps: float = setting(1e-6, lo=0.0)
    """Added to the std in "mean_std"."""
    early: str = setting("paper", choices=("paper", "drop"))
    """Steps with t < k: "paper" (C_k = the shorter full history) or "drop" (left out of level k)."""
    weight_offset: float = setting(1.0, lo=0.0, lo_open=True)
    """Level k's raw weight is (k + weight_offset)^alpha: 1 in the paper, 2 in the public code."""
    weight_eps: float = setting(0.0, lo=0.0)
    """Added to the sum of raw weights (the public code adds eps)."""
    zero_rule: str = setting("degenerate", choices=("degenerate", "value", "none"))
    """Which levels Eq. (7) leaves out of both sums: "degenerate" (the step's group is a
    singleton or tied, decided exactly), "value" (A_k == 0.0, the public code's test, sensitive
    to rounding) or "none" (none: every level the step belongs to counts)."""
    base_group: bool = False
    """Add the episode (GiGPO) advantage as an extra level with raw weight ``base_weight``."""
    base_weight: float = setting(1.0, lo=0.0)
    """Raw weight of the base level (1 in the public code, whatever alpha is)."""
    include_actions: bool = False
    """Put past actions in the context keys (the prompt holds them too)."""
    invalid_penalty: float = setting(0.1, lo=0.0)
    """Cost of an invalid action (StepBatch.invalid)."""
    penalty_mode: str = setting("return", choices=("return", "after_discount"))
    """"return": r_t - penalty enters the discounted return (paper); "after_discount": the
    penalty is subtracted from the step's return (and episode score) after discounting (public code)."""
    omega: float = setting(1.0, lo=0.0)
    """GiGPO: weight of the step term."""
    episode_pooling: str = setting("trajectory", choices=("trajectory", "steps"))
    """Episode terms: one score per trajectory, or "steps": every step row counts (GiGPO code)."""
    episode_singleton: str = setting("zero", choices=("zero", "raw"))
    """Episode group of one member: "zero" or "raw" (mean 0, std 1: GiGPO code)."""
    gae_lambda: float = setting(0.95, lo=0.0, hi=1.0)
    """GAE's lambda (gae only)."""
    leave_one_out: bool = False
    """Leave-one-out step-level groups (RLOO-style): each step's baseline in a level group G_k
    (hgpo's levels, stepwise, oracle, hgpo-nohog2, gigpo's step term) is the mean return of
    the *other* members, A_k = (R_t - mean_{j in G_k, j != t} R_j) [/ (std_{G_k} + eps)]
    = n / (n - 1) (R_t - mean_{G_k} R) [/ ...], n = |G_k|; the std stays the whole group's.
    Episode-level groups are unchanged (the rloo estimator is GRPO's leave-one-out)."""
    # --- empg / gigpo variants options
    empg_k: float = setting(1.0, lo=0.0, hi=50.0)
    """EMPG: k of the self-calibrating scale g(H) = exp(-k H_norm) / mean_batch exp(-k H_norm)."""
    empg_k_future: float = setting(1.0, lo=0.0, hi=50.0)
    """EMPG: k' of the future-clarity bonus f(H_{t+1}) = exp(-k' H_norm,t+1)."""
    empg_zeta: float = setting(0.1, lo=0.0, hi=100.0)
    """EMPG: zeta, the weight of the future-clarity bonus (0.1 in the authors' pseudocode)."""
    empg_eps: float = setting(1e-8, lo=0.0, hi=1.0)
    """EMPG: epsilon added to the entropy range (max - min) of the min-max normalisation and
    to the batch mean of exp(-k H_norm) that g divides by (1e-8 in the authors' pseudocode)."""
    empg_final_norm: str = setting("mean", choices=("mean", "none"))
    """EMPG: final batch-level normalisation of A_mod: "mean" (subtract the batch mean over
    steps, the authors' zero-mean normalisation) or "none"."""
    gigpo_similarity_thresh: float = setting(0.95, lo=0.0, hi=1.0, lo_open=True, hi_open=True)
    """gigpo_similarity: two observations share a step group when difflib's
    SequenceMatcher(None, obs, representative).ratio() >= this, in (0, 1) (verl-agent's
    ``algorithm.gigpo.similarity_thresh``, default 0.95)."""
    gigpo_dynamic_rescale: bool = False
    """gigpo_dynamic: multiply the kept steps' advantages by n / n_kept, so that a mean over
    all n steps equals the mean over the kept steps (the batch dynamic sampling would have
    filled with kept groups only)."""

    # --- graphgpo options
    graph_gamma: float = setting(0.1, lo=0.0, hi=1.0)
    """GraphGPO: decay of the graph return 10 graph_gamma^d, d the number of transitions from
    the step's next state to the goal in its rollout group's graph (the authors' recipes: 0.1
    on ALFWorld, 0.2 on WebShop). Not ``gamma``, the reward discount of the other estimators,
    which graphgpo does not use."""
    graph_normalize_distance: bool = False
    """GraphGPO: the return is 10 graph_gamma^(d(s'_t) - d(s_t) + 1), the step's progress
    (10 for a step one transition closer to the goal), instead of 10 graph_gamma^d(s'_t), the
    next state's nearness (the authors' ``normalize_distance``)."""
    graph_success_return: float = setting(0.0, lo=-1e12, hi=1e12)
    """GraphGPO: an episode whose return (its environment rewards, without the invalid-action
    penalty) exceeds this reached the goal: its last step leads to the group's goal node (the
    authors' code: episode reward > 0)."""
    graph_step_weight: float = setting(1.0, lo=0.0, hi=1e6)
    """GraphGPO: weight of the graph step term (the authors' ``step_advantage_w``)."""
    graph_episode_weight: float = setting(1.0, lo=0.0, hi=1e6)
    """GraphGPO: weight of the episode term, Eq. (1) as in gigpo (the authors'
    ``episode_advantage_w``)."""

    # --- 3spo options
    spo3_alpha: float = setting(50.0, lo=0.0, hi=1e6)
    """3SPO: annealing rate alpha of the state score's lambda(t) = alpha log t (the authors'
    scripts and README: 50; their StateScoreManager's own default, 1, is never used)."""
    spo3_xi: float = setting(10.0, lo=0.0, hi=1e9)
    """3SPO: failures threshold xi; a state with N_fail >= xi and success rate <= zeta scores
    0 (truncated)."""
    spo3_zeta: float = setting(0.1, lo=0.0, hi=1.0)
    """3SPO: success-rate threshold zeta of the truncation test."""
    spo3_omega_k: float = setting(0.1, lo=0.0, hi=1e3)
    """3SPO: decay rate omega_k of the novelty weight w(N) = 0.5 exp(-omega_k N_total(s_t))."""
    spo3_eps: float = setting(1e-6, lo=0.0, hi=1.0)
    """3SPO: epsilon of the success rate N_success / (N_total + epsilon)."""
    spo3_g_max: int = setting(8, lo=1, hi=4096)
    """3SPO: G_max of the rollout allocation n(s) = ceil(G_max S(s)) (branch:3spo only)."""
    spo3_count_scope: str = setting("batch", choices=("batch", "group"))
    """3SPO: which trajectories' visits a state's counts N_total, N_success and t come from:
    "batch" (every trajectory of the batch, states shared across tasks, as the authors' global
    StateScoreManager) or "group" (the step's rollout group only)."""
    spo3_target: str = setting("reward", choices=("reward", "return"))
    """3SPO: what is normalised within the (group, state) groups: "reward" (the shaped step
    reward R_3SPO itself, the post-step bandit of the paper) or "return" (its discounted return
    with ``gamma``)."""
    spo3_terminal_score: float = setting(1.0, lo=0.0, hi=1.0)
    """3SPO: S(s_{t+1}) after a trajectory's last step, whose next observation the batch does
    not hold (1: an unseen state, as the authors' code scores the never-counted terminal
    observation)."""

    # --- ecpo options (arXiv 2606.05885; no public code: hgpo/ecpo.py says which are ours)
    ecpo_kappa: float = setting(2.0, lo=0.0, hi=1e6)
    """ECPO: prior strength kappa of the shrinkage mu~_{s,u} = (n_{s,u} Gbar_{s,u} + kappa
    mu_s) / (n_{s,u} + kappa), in pseudo-occurrences at the anchor mean (2 as the paper's
    summaries quote; 0: no shrinkage, the paper's VarGate-only ablation)."""
    ecpo_tau: float = setting(4.0, lo=0.0, hi=1e6, lo_open=True)
    """ECPO: count scale tau of the gate's tanh(n_s / tau), n_s the occurrences at the anchor
    (4 is our choice: the text read gives no value)."""
    ecpo_omega: float = setting(1.0, lo=0.0, hi=1e6)
    """ECPO: weight omega of the gated step term rho(s) A_act(s, u) added to the episode term
    (1, GiGPO's step weight: our choice, the text read gives no value)."""
    ecpo_gate: str = setting("variance", choices=("variance", "none"))
    """ECPO: "variance" (rho(s) = tanh(n_s / tau) B_s / (B_s + W_s + eps_g), the paper's
    Variance-Gated Credit Weighting) or "none" (rho = 1: the paper's ECA-only ablation)."""
    ecpo_gate_eps: float = setting(0.0, lo=0.0, hi=1e6)
    """ECPO: eps_g of the gate's denominator, in squared return units (0, our choice: an
    anchor whose returns are all equal gets rho = 0 exactly, and 0 keeps the gate
    scale-free)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "K", check_K("EstimatorConfig.K", self.K))
        check_fields(self, "EstimatorConfig")  # numpy scalars stored as Python numbers and str
        _check_weights(self.K, self.alpha, self.weight_offset, self.base_weight)

    def replace(self, **changes: Any) -> EstimatorConfig:
        """A copy with ``changes``; an unknown option raises ValueError naming it."""
        known = {f.name for f in dataclasses.fields(self)}
        for key in changes:
            if key not in known:
                raise ValueError(
                    f"unknown estimator option {key!r}; known options: {', '.join(sorted(known))}"
                )
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_options(cls, **options: Any) -> EstimatorConfig:
        """Build from keyword options, rejecting unknown names with a ValueError."""
        return cls().replace(**options)


CHOICES = field_choices(EstimatorConfig)
"""The string fields of EstimatorConfig and their choices (a read-only view of the fields'
settings)."""


REFERENCE_PROFILES: Mapping[str, Mapping[str, Any]] = MappingProxyType(
    {
        "alfworld": MappingProxyType({"norm": "mean_std"}),
        "webshop": MappingProxyType({"norm": "mean"}),
    }
)
"""verl-agent's per-benchmark estimator settings, by *reference profile*: the benchmark whose
verl-agent recipe a run reproduces (``recipe/hgpo/*.sh``: ALFWorld normalises by the group
std, WebShop by the mean only). Data about the reference code, not a branch on our
benchmarks: the core knows the profiles and no benchmark; a benchmark adapter names the
profile it follows (``agentenvs.adapters.Benchmark.reference_profile``; a toy env follows
none), and the trainer passes that name as ``reference_config(..., env=profile)``."""

REFERENCE_TERMS: Mapping[str, Any] = MappingProxyType(
    dict(
        penalty_mode="after_discount",
        episode_pooling="steps",
        episode_std="sample",
        episode_singleton="raw",
    )
)
"""The options every estimator of the reference shares (after the profile's)."""

_HGPO_REFERENCE = MappingProxyType(
    dict(std="population", early="drop", weight_offset=2.0, weight_eps=1e-6, zero_rule="value")
)
REFERENCE_ESTIMATORS: Mapping[str, Mapping[str, Any]] = MappingProxyType(
    {
        **dict.fromkeys(
            ("hgpo", "hgpo-uniform", "hgpo-nohog2", "oracle", "stepwise"), _HGPO_REFERENCE
        ),
        "gigpo": MappingProxyType({"std": "sample"}),
        # verl-agent's GiGPO with enable_similarity / after filter_group_data; EMPG (ARLArena)
        # on verl-agent's GRPO: checked by benchmarks/make_gigpo_variants_golden.py
        "gigpo_similarity": MappingProxyType({"std": "sample"}),
        "gigpo_dynamic": MappingProxyType({"std": "sample"}),
        "empg": MappingProxyType({"std": "sample"}),
        "grpo": MappingProxyType({"std": "sample"}),
        # verl's compute_rloo_outcome_advantage never divides by a std, whatever the env.
        "rloo": MappingProxyType({"std": "sample", "norm": "mean"}),
        # recipe/GraphGPO/run_*.sh: mean_std_norm on every benchmark (WebShop included)
        "graphgpo": MappingProxyType({"std": "sample", "norm": "mean_std"}),
    }
)
"""Each estimator's own options in the reference (applied last: rloo's norm wins over the
profile's)."""

REFERENCE_ESTIMATOR_PROFILES: Mapping[tuple[str, str], Mapping[str, Any]] = MappingProxyType(
    {
        ("graphgpo", "alfworld"): MappingProxyType({"graph_gamma": 0.1}),
        ("graphgpo", "webshop"): MappingProxyType({"graph_gamma": 0.2}),
    }
)
"""An estimator's options that its recipe sets per benchmark, by (estimator, reference
profile), applied after the estimator's own: GraphGPO's ``algorithm.gamma`` is 0.1 in
``recipe/GraphGPO/run_qwen2.5_*_alfworld_train.sh`` and 0.2 in the WebShop ones."""


def reference_config(
    estimator: str = "hgpo", env: str = "alfworld", **overrides: Any
) -> EstimatorConfig:
    """Options that reproduce the authors' public implementation (verl-agent).

    ``env`` is the reference profile (:data:`REFERENCE_PROFILES`: "alfworld" or "webshop"),
    the options are the profile's, then :data:`REFERENCE_TERMS`, then the estimator's
    (:data:`REFERENCE_ESTIMATORS`), then ``overrides``:

    hgpo (``recipe/hgpo/core_hgpo.py``): early steps dropped from deeper levels, levels counted
    from 1 (weights (k + 2)^alpha), population std, eps added to the weight sum, the invalid
    penalty subtracted after discounting; the optional base level is GiGPO's episode term
    (every step row pooled, sample std, a one-row group passes through).
    gigpo (``gigpo/core_gigpo.py``): sample std for both terms, step rows pooled, one-member
    episode group passes through, step groups by the raw observation.
    grpo / rloo (verl-agent's ``verl/trainer/ppo/core_algos.py``): step rows pooled, sample
    std, a one-row group passes through; rloo never divides by a std (mode "mean" always).
    Mode: "mean_std" on ALFWorld, "mean" on WebShop (the profiles).
    graphgpo (verl-agent ``recipe/GraphGPO/core_graph.py``): GiGPO's normalisation
    (``compute_graphgpo_outcome_advantage`` calls GiGPO's functions), "mean_std" on both
    benchmarks, graph_gamma 0.1 on ALFWorld and 0.2 on WebShop
    (:data:`REFERENCE_ESTIMATOR_PROFILES`); checked by ``benchmarks/make_graphgpo_golden.py``.

    Checked by running that code (zzj1111/alfworldauto at 51c1a039, the HGPO authors' recipe)
    next to ours on 2,000 random batches per estimator: every row agrees with its float32
    output to 1e-6 (relative to max(1, |A|)) or, where float32 rounding throws that code off,
    with the same code run in float64 to 1e-7; for hgpo, rows whose "A_k == 0" test is decided
    by rounding may follow either run. ``benchmarks/make_verl_agent_golden.py`` does the check;
    ``tests/hgpo/test_verl_agent_golden.py`` replays its frozen outputs.
    """
    profile = REFERENCE_PROFILES.get(env)
    if profile is None:
        names = " or ".join(repr(name) for name in REFERENCE_PROFILES)
        raise ValueError(f"reference_config: env must be {names}, got {env!r}")
    own = REFERENCE_ESTIMATORS.get(estimator)
    if own is None:
        raise ValueError(f"reference_config: no reference preset for estimator {estimator!r}")
    per_env = REFERENCE_ESTIMATOR_PROFILES.get((estimator, env), {})
    options = {**profile, **REFERENCE_TERMS, **own, **per_env, **overrides}
    return EstimatorConfig.from_options(**options)
