"""verl-agent's advantage functions on this project's registry, and ``install()``.

The functions with exactly the signatures and outputs of verl-agent's (johnhaofu/verl-agent at
commit 796ed31) live in :mod:`hgpo.integrations.verl_agent_advantage` and are re-exported
here: ``compute_gigpo_outcome_advantage``, ``compute_hgpo_outcome_advantage``,
``compute_grpo_outcome_advantage``, ``compute_rloo_outcome_advantage``,
``compute_step_advantage`` and ``compute_registry_advantage`` (any other registered
estimator, with the per-step inputs it reads). :func:`install` routes verl-agent's ``compute_advantage`` (the
trainer's ``ray_trainer.py``) to them, by the name in ``algorithm.adv_estimator``, for every
estimator of ``hgpo.ESTIMATORS`` (:func:`routed_names`); the two-line change to a verl-agent
checkout is in its docstring.
"""

from __future__ import annotations

import importlib
import inspect
import sys
import types
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from hgpo import ESTIMATORS, estimator_reads
from hgpo.integrations.dataproto import check_step_inputs, row_entropy
from hgpo.integrations.verl_agent_advantage import (
    MODES,
    compute_gigpo_outcome_advantage,
    compute_grpo_outcome_advantage,
    compute_hgpo_outcome_advantage,
    compute_registry_advantage,
    compute_rloo_outcome_advantage,
    compute_step_advantage,
    with_base_level,
)
from hgpo.options import OptionError

__all__ = [
    "MODES",
    "TRAINER_MODULES",
    "VERL_AGENT_ESTIMATORS",
    "compute_gigpo_outcome_advantage",
    "compute_grpo_outcome_advantage",
    "compute_hgpo_outcome_advantage",
    "compute_registry_advantage",
    "compute_rloo_outcome_advantage",
    "compute_step_advantage",
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
NOT_ROUTED_WHY = (
    "it reads a critic value V(s_t) per step, and verl-agent's critic gives token values"
)
"""Why an estimator that reads state values (gae) is not routed."""


def routed_names() -> dict[str, str]:
    """``algorithm.adv_estimator`` value -> registry estimator, after :func:`install`.

    Every estimator of ``hgpo.ESTIMATORS`` (users' and entry points' included) under
    ``hgpo.<name>``, and under its plain name with ``-`` as ``_`` where verl-agent has no
    estimator of that name; verl-agent's own "hgpo", "gigpo", "grpo" and "rloo" are ours too
    (same signatures and outputs). Not routed: an estimator that reads state values, our
    "gae" (:data:`NOT_ROUTED_WHY`), and verl-agent's token-level estimators (gae, remax,
    reinforce_plus_plus(_baseline), grpo_passk), which keep verl-agent's code. An estimator
    that reads the policy's entropy takes it from ``non_tensor_batch['step_entropy']`` or
    ``batch['entropys']`` (see :func:`install`), one that reads observations from
    ``anchor_obs``; ``StepBatch.next_state`` (graphgpo's terminal states) comes from
    ``non_tensor_batch['next_obs']`` when the batch has it (verl-agent's GraphGPO recipe)."""
    names = {"hgpo": "hgpo", "gigpo": "gigpo", "grpo": "grpo", "rloo": "rloo"}
    for name in ESTIMATORS:
        if "values" in estimator_reads(name):
            continue
        names[f"hgpo.{name}"] = name
        plain = name.replace("-", "_")
        if plain not in VERL_AGENT_ESTIMATORS:
            names[plain] = name
    return names


def _needed_keys(name: str, multi_turn: bool) -> tuple[list[str], list[str]]:
    """(batch keys, non_tensor_batch keys) estimator ``name`` reads (the policy's entropy is
    checked on its own: :func:`hgpo.integrations.dataproto.check_step_inputs`)."""
    batch = ["token_level_rewards"] + (["loss_mask"] if multi_turn and name == "grpo" else [])
    non_tensor = ["uid", "traj_uid"]
    if name not in ("grpo", "rloo"):  # the step-return estimators, and every other one
        batch.append("step_rewards")
        non_tensor.append("anchor_obs")
    return batch, non_tensor


def _check_keys(data: Any, shown: str, name: str, multi_turn: bool) -> None:
    """A named error listing the keys estimator ``name`` needs, before any work."""
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
    reads = estimator_reads(name)
    if "entropy" in reads:
        check_step_inputs(data, ("entropy",), f"adv_estimator={shown!r}")


def _dispatch(name: str, data: Any, multi_turn: bool, norm_adv_by_std_in_grpo: Any,
              step_advantage_w: Any, gigpo_mode: Any, kwargs: dict[str, Any]) -> tuple:  # fmt: skip
    """Our function for registry estimator ``name``, with the arguments verl-agent's
    ``compute_advantage`` gives its own (the HGPO recipe's for hgpo)."""
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
    if name in _STEP_ESTIMATORS:
        return compute_step_advantage(name, **common, **hgpo_opts)
    entropy = row_entropy(data) if "entropy" in estimator_reads(name) else None
    return compute_registry_advantage(
        name, **common, history_length=hgpo_opts["history_length"], mode=hgpo_opts["mode"],
        entropy=entropy, next_obs=nt.get("next_obs"),
    )  # fmt: skip


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
        adv, ret = _dispatch(name, data, bool(multi_turn), norm_adv_by_std_in_grpo,
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
    ours and verl-agent's; a batch without a key the estimator reads is a ValueError naming it.
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
