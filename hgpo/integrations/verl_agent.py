"""verl-agent's advantage functions on this project's registry, and ``install()``.

The functions with exactly the signatures and outputs of verl-agent's (johnhaofu/verl-agent at
commit 796ed31) live in :mod:`hgpo.integrations.verl_agent_advantage` and are re-exported
here: ``compute_gigpo_outcome_advantage``, ``compute_hgpo_outcome_advantage``,
``compute_grpo_outcome_advantage``, ``compute_rloo_outcome_advantage`` and
``compute_step_advantage``. Every other registered estimator (a newer built-in, a user's, an
entry point's) runs on verl-agent's batch itself through the metadata contract of
:mod:`hgpo.integrations.dataproto` (:func:`compute_contract_advantage`, with the options of
:func:`contract_config`): its ``StepBatch`` holds each step's own env reward
(``non_tensor_batch['rewards']``) and invalid flag (``is_action_valid``), not the trainer's
discounted step returns. :func:`install` routes verl-agent's ``compute_advantage`` (the
trainer's ``ray_trainer.py``) to them, by the name in ``algorithm.adv_estimator``, for every
estimator of ``hgpo.ESTIMATORS`` but those of :data:`UNROUTED_BUILTINS` and those that read
state values (:func:`routed_names`); the two-line change to a verl-agent checkout is in its
docstring.

What verl-agent's batch holds at the advantage step (johnhaofu/verl-agent at 796ed31,
``agent_system/multi_turn_rollout/rollout_loop.py``: ``vanilla_multi_turn_loop``,
``gather_rollout_data``): one row per step of an episode still running (rows with
``active_masks`` False are dropped), the episodes one after another, each in step order, with
``non_tensor_batch`` ``uid``, ``traj_uid``, ``anchor_obs``, ``rewards`` (the env's reward of
the step), ``is_action_valid``, ``active_masks``, ``episode_rewards`` and
``episode_lengths``; the trainer (``recipe/hgpo/hgpo_ray_trainer.py``) then adds
``batch['step_rewards']`` (``gigpo/core_gigpo.py::compute_step_discounted_returns`` of
``rewards`` with ``algorithm.gamma``, for HGPO and GiGPO only), ``token_level_scores`` (the
episode reward at each step's last response token) and subtracts
``actor.invalid_action_penalty_coef`` (0.1) x invalid from both
(``apply_invalid_action_penalty``).
"""

from __future__ import annotations

import importlib
import inspect
import sys
import types
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import numpy as np

from hgpo import ESTIMATORS, EstimatorConfig, compute_advantages, estimator_reads
from hgpo.config import REFERENCE_ESTIMATORS, reference_config
from hgpo.integrations.dataproto import (
    MissingMetadataError,
    check_metadata,
    check_step_inputs,
    step_batch_from_dataproto,
    step_inputs,
    to_tokens,
)
from hgpo.integrations.verl_agent_advantage import (
    MODES,
    compute_gigpo_outcome_advantage,
    compute_grpo_outcome_advantage,
    compute_hgpo_outcome_advantage,
    compute_rloo_outcome_advantage,
    compute_step_advantage,
    with_base_level,
)
from hgpo.options import OptionError, bad, check_bool

__all__ = [
    "MODES",
    "TRAINER_MODULES",
    "UNROUTED_BUILTINS",
    "VERL_AGENT_ESTIMATORS",
    "MissingMetadataError",
    "compute_contract_advantage",
    "compute_gigpo_outcome_advantage",
    "compute_grpo_outcome_advantage",
    "compute_hgpo_outcome_advantage",
    "compute_rloo_outcome_advantage",
    "compute_step_advantage",
    "contract_config",
    "install",
    "routed_names",
    "with_base_level",
]


# --------------------------------------------------------------------------- install()

VERL_AGENT_ESTIMATORS = ("gae", "grpo", "reinforce_plus_plus", "reinforce_plus_plus_baseline",
                         "remax", "rloo", "grpo_passk", "gigpo", "hgpo")  # fmt: skip
"""``algorithm.adv_estimator`` values of verl-agent at 796ed31 (its ``AdvantageEstimator``
enum, with the HGPO recipe's "hgpo")."""

TRAINER_MODULES = ("recipe.hgpo.hgpo_ray_trainer", "verl.trainer.ppo.ray_trainer")
"""Where verl-agent defines ``compute_advantage`` (the HGPO recipe's trainer, its main one)."""

_STEP_ESTIMATORS = ("hgpo", "gigpo", "stepwise", "oracle", "hgpo-nohog2", "hgpo-uniform")
_GLUE = ("grpo", "rloo", *_STEP_ESTIMATORS)
"""Estimators that run through the glue of verl-agent's own functions (its ``step_rewards``
and episode scores, golden-checked against the authors' code); every other routed one runs
on the metadata contract (:func:`compute_contract_advantage`)."""
NOT_ROUTED_WHY = (
    "it reads a critic value V(s_t) per step, and verl-agent's critic gives token values"
)
"""Why an estimator that reads state values (gae) is not routed."""
UNROUTED_BUILTINS = {
    "gigpo_dynamic": "verl-agent does dynamic sampling in its rollout "
    "(algorithm.filter_groups.enable=True with adv_estimator=gigpo): it drops the groups whose "
    "episode rewards are all equal and samples new ones until the batch is full, keeping its "
    "last try unfiltered; routed here it would filter a second time at the advantage step, "
    "zeroing the groups verl-agent keeps on that last try (and, without filter_groups, zeroing "
    "tied groups with nothing sampled in their place)",
    "ecpo": "it needs each step's canonical action (StepBatch.action), and verl-agent's batch "
    "carries no action column",
}
"""Built-in estimators not routed to verl-agent, and why."""

VERL_AGENT_PENALTY = 0.1
"""verl-agent's ``actor.invalid_action_penalty_coef`` default (``verl/trainer/config/
ppo_trainer.yaml`` at 796ed31), which its trainer subtracts after discounting; ``fit`` does not
pass it to ``compute_advantage`` (pass ``invalid_action_penalty_coef=`` there for another)."""
_GIGPO_MODE = ("gigpo_similarity", "gigpo_dynamic", "graphgpo", "3spo", "rewardflow")
"""Estimators whose group normalisation is GiGPO's (``gigpo_mode``): GiGPO's variants, GraphGPO
(its recipe passes ``algorithm.graphgpo.mode`` as ``gigpo_mode``), 3SPO
(``compute_3spo_advantage`` is GiGPO's ``step_norm_reward``) and RewardFlow (its
``episode_norm_reward`` and ``step_norm_reward`` are GiGPO's, with GiGPO's ``mode``)."""


def routed_names() -> dict[str, str]:
    """``algorithm.adv_estimator`` value -> registry estimator, after :func:`install`.

    Every estimator of ``hgpo.ESTIMATORS`` (users' and entry points' included) under
    ``hgpo.<name>``, and under its plain name with ``-`` as ``_`` where verl-agent has no
    estimator of that name; verl-agent's own "hgpo", "gigpo", "grpo" and "rloo" are ours too
    (same signatures and outputs). Not routed: an estimator that reads state values, our
    "gae" (:data:`NOT_ROUTED_WHY`), the built-ins of :data:`UNROUTED_BUILTINS`, and
    verl-agent's token-level estimators (gae, remax, reinforce_plus_plus(_baseline),
    grpo_passk), which keep verl-agent's code. An estimator that reads the policy's entropy
    takes it from ``non_tensor_batch['step_entropy']`` or ``batch['entropys']`` (see
    :func:`install`), one that reads observations from ``anchor_obs``; ``StepBatch.next_state`` (graphgpo's and
    3spo's terminal states) comes from ``non_tensor_batch['next_obs']`` when the batch has it
    (verl-agent's GraphGPO recipe)."""
    names = {"hgpo": "hgpo", "gigpo": "gigpo", "grpo": "grpo", "rloo": "rloo"}
    for name in ESTIMATORS:
        if "values" in estimator_reads(name) or name in UNROUTED_BUILTINS:
            continue
        names[f"hgpo.{name}"] = name
        plain = name.replace("-", "_")
        if plain not in VERL_AGENT_ESTIMATORS:
            names[plain] = name
    return names


def _not_routed_why(shown: str) -> str | None:
    """Why ``algorithm.adv_estimator=shown`` names an estimator of ours that is not routed."""
    plain = shown.removeprefix("hgpo.")
    for name in ESTIMATORS:
        if plain in (name, name.replace("-", "_")):
            if name in UNROUTED_BUILTINS:
                return UNROUTED_BUILTINS[name]
            if "values" in estimator_reads(name):
                return NOT_ROUTED_WHY
    return None


def _needed_keys(name: str, multi_turn: bool) -> tuple[list[str], list[str]]:
    """(batch keys, non_tensor_batch keys) glue estimator ``name`` reads."""
    batch = ["token_level_rewards"] + (["loss_mask"] if multi_turn and name == "grpo" else [])
    non_tensor = ["uid", "traj_uid"]
    if name not in ("grpo", "rloo"):  # the step-return estimators
        batch.append("step_rewards")
        non_tensor.append("anchor_obs")
    return batch, non_tensor


def _check_keys(data: Any, shown: str, name: str, multi_turn: bool) -> None:
    """A named error listing the keys estimator ``name`` needs, before any work: the glue's
    keys, or the metadata contract's (with ``rewards``) and the per-step inputs it reads."""
    if name not in _GLUE:
        what = f"adv_estimator={shown!r}"
        try:
            check_metadata(data, what, tokens=("token_level_rewards",), extra=("rewards",))
        except MissingMetadataError as exc:
            if "rewards" in data.non_tensor_batch:
                raise
            raise MissingMetadataError(
                f"{exc}; verl-agent's rollout loop sets non_tensor_batch['rewards'], each "
                "step's env reward (vanilla_multi_turn_loop)"
            ) from None
        check_step_inputs(data, estimator_reads(name), what)
        return
    batch_keys, non_tensor_keys = _needed_keys(name, multi_turn)
    have = set(data.batch.keys())
    missing = [f"batch[{k!r}]" for k in batch_keys if k not in have]
    missing += [
        f"non_tensor_batch[{k!r}]" for k in non_tensor_keys if k not in data.non_tensor_batch
    ]
    if missing:
        needs = [f"batch[{k!r}]" for k in batch_keys] + [
            f"non_tensor_batch[{k!r}]" for k in non_tensor_keys
        ]
        hint = (" (verl-agent's trainer fills step_rewards only for adv_estimator=hgpo or gigpo)"
                if "batch['step_rewards']" in missing else "")  # fmt: skip
        raise OptionError(
            f"adv_estimator={shown!r}: the batch lacks {', '.join(missing)}; it needs "
            f"{', '.join(needs)}{hint}"
        )


def contract_config(
    name: str,
    gamma: Any = 1.0,
    norm_adv_by_std_in_grpo: Any = True,
    step_advantage_w: Any = 1.0,
    gigpo_mode: Any = "mean_std_norm",
    **kwargs: Any,
) -> EstimatorConfig:
    """The options of estimator ``name`` on verl-agent's batch, from the arguments verl-agent's
    ``compute_advantage`` gets (its own names; other keyword arguments are not read):

    - ``gamma`` (``algorithm.gamma``): ``gamma``; for graphgpo also ``graph_gamma`` (the
      GraphGPO recipe passes ``algorithm.gamma`` to ``compute_graph_path_returns``: 0.1 on
      ALFWorld, 0.2 on WebShop in its scripts) for rewardflow also
      ``rewardflow_gamma`` (RewardFlow's rollout passes ``algorithm.gamma`` to
      ``propagate_reward_decay``: 0.9 in its ALFWorld, WebShop and Sokoban scripts);
    - ``norm``: ``MODES[gigpo_mode]`` for GiGPO's variants, graphgpo and 3spo
      (:data:`_GIGPO_MODE`), ``norm_adv_by_std_in_grpo`` for empg (on verl-agent's GRPO),
      ``MODES[hgpo_mode]`` (default mean_std_norm) for every other one;
    - ``step_advantage_w``: ``omega`` (gigpo_similarity, gigpo_dynamic), ``graph_step_weight``
      (graphgpo), ``rewardflow_step_weight`` (rewardflow); ``episode_advantage_w`` (the GraphGPO recipe's; default 1):
      ``graph_episode_weight``; ``gigpo_similarity_thresh`` (default 0.95):
      ``gigpo_similarity_thresh``;
    - ``history_length`` (default 2): ``K``; ``epsilon`` (default 1e-6): ``eps``;
    - the invalid-action penalty as verl-agent's trainer applies it: ``invalid_penalty`` =
      ``invalid_action_penalty_coef`` (default :data:`VERL_AGENT_PENALTY`), subtracted after
      discounting (``penalty_mode="after_discount"``).

    On ``reference_config(name)`` (verl-agent's std, pooling and singleton rules, as its
    golden cases check them) where the estimator has a reference preset, on
    ``EstimatorConfig()`` otherwise (3spo, users' estimators). A bad value is a ValueError
    naming the option."""
    if name == "empg":
        norm = (
            "mean_std" if check_bool("norm_adv_by_std_in_grpo", norm_adv_by_std_in_grpo) else "mean"
        )
    else:
        key, mode = (("gigpo_mode", gigpo_mode) if name in _GIGPO_MODE
                     else ("hgpo_mode", kwargs.get("hgpo_mode", "mean_std_norm")))  # fmt: skip
        if not isinstance(mode, str) or mode not in MODES:
            raise bad(key, "'mean_std_norm' or 'mean_norm'", mode)
        norm = MODES[mode]
    opts: dict[str, Any] = dict(
        gamma=gamma, norm=norm, K=kwargs.get("history_length", 2),
        eps=kwargs.get("epsilon", 1e-6), penalty_mode="after_discount",
        invalid_penalty=kwargs.get("invalid_action_penalty_coef", VERL_AGENT_PENALTY),
    )  # fmt: skip
    if name in ("gigpo_similarity", "gigpo_dynamic"):
        opts["omega"] = step_advantage_w
    if name == "gigpo_similarity":
        opts["gigpo_similarity_thresh"] = kwargs.get("gigpo_similarity_thresh", 0.95)
    if name == "graphgpo":
        opts.update(graph_gamma=gamma, graph_step_weight=step_advantage_w,
                    graph_episode_weight=kwargs.get("episode_advantage_w", 1.0))  # fmt: skip
    if name == "rewardflow":
        opts.update(rewardflow_gamma=gamma, rewardflow_step_weight=step_advantage_w)
    if name in REFERENCE_ESTIMATORS:
        return reference_config(name, **opts)
    return EstimatorConfig.from_options(**opts)


def _check_active(data: Any) -> None:
    """verl-agent's batch holds the steps of running episodes only (``gather_rollout_data``
    drops the rows whose ``active_masks`` is False): a ValueError naming a row that is not."""
    if "active_masks" not in data.non_tensor_batch:
        return
    active = np.asarray(data.non_tensor_batch["active_masks"]).tolist()
    off = [i for i, a in enumerate(active) if not a]
    if off:
        raise ValueError(
            f"non_tensor_batch['active_masks'][{off[0]}] is {active[off[0]]!r}: a row after its "
            "episode ended (verl-agent's gather_rollout_data keeps the active rows only)"
        )


def compute_contract_advantage(name: str, data: Any, cfg: EstimatorConfig) -> tuple[Any, Any]:
    """``compute_advantages(name, StepBatch, cfg, **inputs)`` on verl-agent's batch, as
    ``(A[row] * response_mask[row],) * 2`` in ``token_level_rewards``' dtype (verl-agent's
    estimators return the advantage twice).

    The StepBatch is the metadata contract's (:func:`hgpo.integrations.dataproto.
    step_batch_from_dataproto`): groups ``uid``, trajectories ``traj_uid``, steps in batch
    order, states ``anchor_obs``, reward ``non_tensor_batch['rewards']`` (each step's env
    reward, without the penalty: needed here, a MissingMetadataError naming it otherwise),
    invalid ``not is_action_valid``, next_state ``next_obs`` when the batch has it; the inputs
    the estimator reads as :func:`hgpo.integrations.dataproto.step_inputs` gives them
    (``entropy`` from ``step_entropy`` or ``entropys``, ``observations`` from ``anchor_obs``).
    An estimator that reads state values is refused (verl-agent's critic gives token values)."""
    reads = estimator_reads(name)
    what = f"estimator {name!r}"
    if "values" in reads:
        raise OptionError(f"{what}: {NOT_ROUTED_WHY}")
    check_metadata(data, what, extra=("rewards",))
    check_step_inputs(data, reads, what)
    _check_active(data)
    rows = step_batch_from_dataproto(data)
    out = compute_advantages(name, rows.batch, cfg, **step_inputs(data, rows, reads))
    adv = to_tokens(
        rows.to_rows(out.advantages), data.batch["response_mask"], data.batch["token_level_rewards"]
    )
    return adv, adv


def _dispatch(name: str, data: Any, multi_turn: bool, gamma: Any, norm_adv_by_std_in_grpo: Any,
              step_advantage_w: Any, gigpo_mode: Any, kwargs: dict[str, Any]) -> tuple:  # fmt: skip
    """Our function for registry estimator ``name``, with the arguments verl-agent's
    ``compute_advantage`` gives its own (the HGPO recipe's for hgpo)."""
    if name not in _GLUE:
        cfg = contract_config(name, gamma, norm_adv_by_std_in_grpo, step_advantage_w,
                              gigpo_mode, **kwargs)  # fmt: skip
        return compute_contract_advantage(name, data, cfg)
    b, nt = data.batch, data.non_tensor_batch
    common = dict(token_level_rewards=b["token_level_rewards"], response_mask=b["response_mask"],
                  index=nt["uid"], traj_index=nt["traj_uid"])  # fmt: skip
    if name == "grpo":
        if multi_turn:
            common["response_mask"] = b["loss_mask"][:, -b["response_mask"].size(1) :]
        return compute_grpo_outcome_advantage(
            **common, norm_adv_by_std_in_grpo=norm_adv_by_std_in_grpo
        )
    if name == "rloo":
        return compute_rloo_outcome_advantage(**common)
    common.update(step_rewards=b["step_rewards"], anchor_obs=nt["anchor_obs"])
    if name == "gigpo":
        return compute_gigpo_outcome_advantage(
            **common, step_advantage_w=step_advantage_w, mode=gigpo_mode,
            enable_similarity=kwargs.get("gigpo_enable_similarity", False),
            similarity_thresh=kwargs.get("gigpo_similarity_thresh", 0.95),
        )  # fmt: skip
    hgpo_opts = dict(history_length=kwargs.get("history_length", 2),
                     mode=kwargs.get("hgpo_mode", "mean_std_norm"),
                     length_weight_alpha=kwargs.get("hgpo_length_weight_alpha", 1.0),
                     base_group=kwargs.get("hgpo_base_group", False))  # fmt: skip
    if name == "hgpo":
        return compute_hgpo_outcome_advantage(**common, **hgpo_opts)
    return compute_step_advantage(name, **common, **hgpo_opts)


def _router(original: Callable[..., Any], response_mask_fn: Callable[[Any], Any] | None):
    """verl-agent's ``compute_advantage``, with the names of :func:`routed_names` going to
    the registry and the rest to ``original``."""
    routed = routed_names()

    def compute_advantage(data, adv_estimator, gamma=1.0, lam=1.0, num_repeat=1,
                          multi_turn=False, norm_adv_by_std_in_grpo=True,
                          step_advantage_w=1.0, gigpo_mode="mean_std_norm", **kwargs):  # fmt: skip
        shown = str(getattr(adv_estimator, "value", adv_estimator))
        name = routed.get(shown)
        if name is None:
            if shown in VERL_AGENT_ESTIMATORS:
                return original(data, adv_estimator, gamma=gamma, lam=lam,
                                num_repeat=num_repeat, multi_turn=multi_turn,
                                norm_adv_by_std_in_grpo=norm_adv_by_std_in_grpo,
                                step_advantage_w=step_advantage_w, gigpo_mode=gigpo_mode,
                                **kwargs)  # fmt: skip
            why = _not_routed_why(shown)
            if why is not None:
                raise OptionError(f"adv_estimator={shown!r} is not routed to verl-agent: {why}")
            raise OptionError(
                f"adv_estimator: unknown estimator {shown!r}; hgpo's: {', '.join(routed)}; "
                f"verl-agent's own: {', '.join(n for n in VERL_AGENT_ESTIMATORS if n not in routed)}"
            )
        _check_keys(data, shown, name, bool(multi_turn))
        if "response_mask" not in data.batch:
            if response_mask_fn is None:
                raise OptionError(
                    f"adv_estimator={shown!r}: the batch lacks batch['response_mask']"
                )
            data.batch["response_mask"] = response_mask_fn(data)
        adv, ret = _dispatch(name, data, bool(multi_turn), gamma, norm_adv_by_std_in_grpo,
                             step_advantage_w, gigpo_mode, kwargs)  # fmt: skip
        data.batch["advantages"] = adv
        data.batch["returns"] = ret
        return data

    compute_advantage.__wrapped__ = original  # type: ignore[attr-defined]
    compute_advantage.hgpo_routed = routed  # type: ignore[attr-defined]
    return compute_advantage


def _trainer_module(module: types.ModuleType | str) -> types.ModuleType:
    if isinstance(module, str):
        module = importlib.import_module(module)
    fn = getattr(module, "compute_advantage", None)
    if (
        not callable(fn)
        or "step_advantage_w" not in inspect.signature(getattr(fn, "__wrapped__", fn)).parameters
    ):
        raise OptionError(
            f"install: module {getattr(module, '__name__', module)!r} has no verl-agent "
            "compute_advantage(data, adv_estimator, ..., step_advantage_w, gigpo_mode, **kwargs) "
            "(for upstream verl use VERL_USE_EXTERNAL_MODULES=hgpo.integrations.verl)"
        )
    return module


class _Alias(str):
    """A value of verl-agent's ``AdvantageEstimator`` that also equals the routed names whose
    trainer path it takes: ``"stepwise" == AdvantageEstimator.HGPO`` is True after install()
    (a str subclass's ``__eq__`` is tried first on ``"stepwise" == member``, and on ``in``)."""

    also: frozenset[str]

    def __new__(cls, value: str, also: frozenset[str]) -> _Alias:
        obj = super().__new__(cls, value)
        obj.also = also
        return obj

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, str):
            return NotImplemented
        plain = str.__str__(other)
        return str.__eq__(str.__str__(self), plain) or plain in self.also

    def __ne__(self, other: object) -> bool:
        eq = self.__eq__(other)
        return eq if eq is NotImplemented else not eq

    __hash__ = str.__hash__


def _admitting_enum(enum: Any, routed: dict[str, str]) -> type:
    """verl-agent's ``AdvantageEstimator`` (same member names and values) whose members also
    equal our routed names, each on the member whose trainer path gives it its inputs:
    step-return estimators on HGPO (the recipe) or GiGPO (verl-agent's main trainer), so that
    the trainer admits them (``RayPPOTrainer.__init__``) and fills ``step_rewards`` for them
    (``fit``); our grpo / rloo on GRPO / RLOO."""
    values = {m.name: str(m.value) for m in enum}
    step_path = "hgpo" if "hgpo" in values.values() else "gigpo"
    also: dict[str, set[str]] = defaultdict(set)
    for shown, name in routed.items():
        if shown not in values.values():
            also[name if name in ("grpo", "rloo", "gigpo") else step_path].add(shown)
    members = {k: _Alias(v, frozenset(also[v])) for k, v in values.items()}
    return type(enum.__name__, (), {**members, "__doc__": enum.__doc__, "hgpo_admits": True})


def _admit(mod: types.ModuleType, routed: dict[str, str]) -> None:
    enum = getattr(mod, "AdvantageEstimator", None)
    if enum is None or getattr(enum, "hgpo_routed", None) == routed:
        return
    original = getattr(enum, "hgpo_original", enum)  # (ours of an earlier install)
    admitting = _admitting_enum(original, routed)
    admitting.hgpo_original, admitting.hgpo_routed = original, dict(routed)
    mod.AdvantageEstimator = admitting


def install(module: types.ModuleType | str | None = None) -> list[types.ModuleType]:
    """Route verl-agent's ``compute_advantage`` to the registry, by name (:func:`routed_names`).

    module: verl-agent's trainer module (or its name); None: every module of
    :data:`TRAINER_MODULES` already imported. Its ``compute_advantage`` global is replaced (the
    trainer's ``fit`` looks it up at each call); installing twice changes nothing. The two-line
    change to a verl-agent checkout, at the end of ``recipe/hgpo/hgpo_ray_trainer.py`` (or of
    ``verl/trainer/ppo/ray_trainer.py``), so that the Ray process running ``fit`` has it::

        from hgpo.integrations import verl_agent
        verl_agent.install()

    The module's ``AdvantageEstimator`` is replaced too, by a class with the same members whose
    values also equal our routed names (:func:`_admitting_enum`): the trainer compares
    ``config.algorithm.adv_estimator`` with those members to admit an estimator and to fill
    ``batch["step_rewards"]`` (only for HGPO / GiGPO), so ``algorithm.adv_estimator=stepwise``
    gets the HGPO recipe's inputs. Nothing else of the trainer changes.

    The routes are fixed here: an estimator registered later (``hgpo.register_estimator``)
    is routed by another install() (the ``hgpo.estimators`` entry points are loaded here). An
    estimator that reads the policy's entropy needs it in the batch: verl-agent's ``fit``
    computes token entropies with the old log-probs and drops them after its metric; delete
    that line (``old_log_prob.batch.pop("entropys")``, verl-agent 796ed31
    ``verl/trainer/ppo/ray_trainer.py`` line 1150, ``recipe/hgpo/hgpo_ray_trainer.py`` line
    1237) so that ``batch['entropys']`` reaches the advantage step, where each step's entropy
    is their mean over its response tokens (or set ``non_tensor_batch['step_entropy']``
    yourself); without either it is a MissingMetadataError naming both keys.

    Returns the modules patched. An estimator name it does not know is a ValueError listing
    ours and verl-agent's (one of ours that is not routed: a ValueError saying why); a batch
    without a key the estimator reads is a ValueError naming it (the glue's keys) or a
    :class:`MissingMetadataError` (a KeyError) listing the contract's keys, ``rewards``
    included, for the estimators on the contract (:func:`compute_contract_advantage`).
    """
    if module is None:
        mods = [sys.modules[m] for m in TRAINER_MODULES if m in sys.modules]
        if not mods:
            raise OptionError(
                f"install: none of {', '.join(TRAINER_MODULES)} is imported; call install() at "
                "the end of verl-agent's ray_trainer.py, or pass the trainer module"
            )
    else:
        mods = [module]
    mods = [_trainer_module(m) for m in mods]
    for mod in mods:
        fn = mod.compute_advantage
        if getattr(fn, "hgpo_routed", None) is None:
            mod.compute_advantage = _router(fn, getattr(mod, "compute_response_mask", None))
        elif fn.hgpo_routed != routed_names():  # estimators registered since: route them too
            mod.compute_advantage = _router(
                fn.__wrapped__, getattr(mod, "compute_response_mask", None)
            )
        _admit(mod, mod.compute_advantage.hgpo_routed)
    return mods
