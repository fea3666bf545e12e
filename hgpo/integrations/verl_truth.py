"""The exact truth of verl's policy on a toy env: ``truth/<estimator>/<metric>`` inside verl.

The same figures as ``python -m hgpo.train --truth-every N`` (:mod:`hgpo.train.truth_monitor`), for the
actor verl trains. The policy whose truth is exact is the *scored* policy of score mode,

    pi(a | x) = softmax_a( log p_theta(response(a) | x) / T ),

with ``response(a)`` the candidate text of action a (:func:`hgpo.train.episodes.response_text`)
and T verl's rollout temperature. Everything after scoring is :class:`TruthMonitor`'s, line for
line; this module only supplies its two inputs from verl:

1. a *scorer* (:func:`verl_scorer`): the chain's prompts x every candidate response as one
   verl ``DataProto`` (``prompts`` left-padded, ``responses`` right-padded, ``input_ids``,
   ``attention_mask``, ``position_ids``, ``response_mask``: what verl's agent loop emits), sent
   through the actor's ``compute_log_prob`` exactly as verl 0.9.1's trainer computes
   ``old_log_probs`` (``RayPPOTrainer._compute_old_log_prob``, verl/trainer/ppo/ray_trainer.py
   lines 1290-1325: ``to_tensordict`` -> ``left_right_2_no_padding`` -> ``compute_log_prob``
   -> ``no_padding_2_padding``), at temperature 1 (the truth divides by T itself), summed over
   each candidate's tokens;
2. the batch verl trained on (:meth:`VerlTruth.steps`), read through the metadata contract of
   :mod:`hgpo.integrations` (``uid``, ``traj_uid``, ``anchor_obs``, ``step_index``,
   ``rewards``, ``is_action_valid`` in ``non_tensor_batch``) plus one key the truth alone
   needs, ``hidden_state``: the toy env's hidden state id before the step (an observation does
   not identify it in a POMDP, and the exact advantage A*(z, a) is per hidden state).

The hook (:class:`TruthRayPPOTrainer`) is a ``RayPPOTrainer`` subclass that overrides
``_update_actor`` (ray_trainer.py line 1327; called once per step at line 1690, after the
advantages and before the weights change, its ``meta_info["metrics"]`` merged into the step's
metrics at lines 1718-1719 and logged by verl's ``Tracking`` logger at line 1802): every
``every`` steps it scores the chain with the actor that played the batch and adds the
``truth/*`` figures to the step's metrics. Settings come from verl's config, key
``trainer.hgpo_truth`` (:data:`SETTINGS`); T is ``actor_rollout_ref.rollout.temperature`` and
gamma ``algorithm.gamma``. Steps in critic warm-up (no actor update) log no truth.

What verl's generation does and what this means. verl's rollout samples free text (the agent
loop calls the server's ``generate``), it does not choose among listed candidates: the policy
that played the batch is the free-text policy, whose action distribution sums over every text
that parses to an action and has no finite chain (see :mod:`hgpo.train.truth_monitor`). So the figures
are exact for the scored policy of the *same weights*, and the estimators' errors are measured
against it; the two policies coincide only when the model puts (nearly) all of its mass on the
candidate texts. A free-text response that names no listed action lies outside the chain: a
step with any such row logs only the policy's figures and ``truth/rows_no_action``
(:meth:`VerlTruth.measure`). Score mode inside verl would need the agent loop to score the
candidates of each step (prompt log-probs of ``prompt + response(a)`` for every a from the rollout server,
which verl 0.9.1's ``generate`` interface does not return, or an actor ``compute_log_prob``
call per step from the loop, which runs in workers without the actor) and then sample an
action from the softmax; nothing here depends on how the batch was played.

verl 0.9.1's default v1 trainer (``trainer.use_v1=true``, verl/trainer/ppo/v1/, which the
stepwise agent loop needs) keeps the batch in a TransferQueue: :func:`register_v1` registers
:data:`V1_MODE` (``trainer.v1.trainer_mode=hgpo_truth``), a ``PPOTrainerSync`` subclass whose
``_update_actor(batch, metrics)`` (trainer_base.py line 1827, called in ``_step_once`` at line
610 before the update) reads the batch's non-padding rows with ``tq.kv_batch_get`` (as
``_compute_advantage`` does, lines 1745-1751; the contract's keys from each row's
``extra_fields``) and adds ``truth/*`` to ``metrics``. It needs the ``transfer_queue`` package
(verl's v1 trainer does). :mod:`hgpo.integrations.verl_truth_plugin` does both registrations
in every verl process.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from hgpo.extras import MissingExtraError
from hgpo.integrations.dataproto import step_batch_from_dataproto
from hgpo.train.train_config import TrainConfig, TrainConfigError
from hgpo.train.truth_monitor import Scorer, TruthMonitor, TruthSteps, truth_prompts

try:
    import torch
    from verl import DataProto
    from verl.protocol import pad_dataproto_to_divisor
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.padding import left_right_2_no_padding, no_padding_2_padding
except ImportError as e:  # the [verl] extra
    raise MissingExtraError(
        f"hgpo.integrations.verl_truth needs verl 0.9.x (the [verl] extra; {e}); install it "
        'with pip install -e ".[verl]"'
    ) from None

__all__ = [
    "CONTRACT_KEYS",
    "SETTINGS",
    "TRUTH_KEY",
    "V1_MODE",
    "TruthRayPPOTrainer",
    "VerlTruth",
    "install",
    "register_v1",
    "score_batch",
    "truth_config",
    "v1_rows",
    "verl_scorer",
]

log = logging.getLogger(__name__)

TRUTH_KEY = "hidden_state"
"""``non_tensor_batch`` key the truth needs beyond the contract: the toy env's hidden state id
s_t before each step (an int; :attr:`hgpo.train.episodes.Rollout.hidden`)."""

CONTRACT_KEYS = ("uid", "traj_uid", "anchor_obs")
"""The contract's required ``non_tensor_batch`` keys (optional: step_index, rewards,
is_action_valid, next_obs)."""

SETTINGS = {
    "env": "env",
    "every": "truth_every",
    "history_length": "history_length",
    "max_steps": "max_steps",
    "train_tasks": "train_tasks",
    "max_nodes": "truth_max_nodes",
    "max_prompts": "truth_max_prompts",
    "max_prompt_tokens": "max_prompt_tokens",
    "estimator_options": "estimator_options",
}
"""``trainer.hgpo_truth.<key>`` -> the :class:`TrainConfig` field it sets (its defaults and
checks apply; ``env`` and ``every`` are required). history_length, max_prompt_tokens and
train_tasks must be the ones the agent loop built its prompts and tasks with."""


def truth_config(settings: Mapping[str, Any], temperature: float, gamma: float) -> TrainConfig:
    """The :class:`TrainConfig` of the truth from ``trainer.hgpo_truth`` and verl's T, gamma.

    Raises:
        TrainConfigError (a ValueError) naming the key and value: an unknown key, a missing
        ``env`` or ``every``, an env that is not ``toy:...``, or any TrainConfig check.
    """
    unknown = sorted(set(settings) - set(SETTINGS))
    if unknown:
        raise TrainConfigError(
            f"trainer.hgpo_truth: unknown key(s) {unknown}; known: {', '.join(SETTINGS)} "
            "(temperature and gamma come from actor_rollout_ref.rollout and algorithm)"
        )
    for key in ("env", "every"):
        if key not in settings:
            raise TrainConfigError(f"trainer.hgpo_truth.{key} is required")
    every = settings["every"]
    if isinstance(every, bool) or not isinstance(every, int) or every < 1:
        raise TrainConfigError(f"trainer.hgpo_truth.every={every!r}: must be an int >= 1")
    env = settings["env"]
    if not isinstance(env, str) or not env.startswith("toy:"):
        raise TrainConfigError(
            f"trainer.hgpo_truth.env={env!r}: the exact truth needs a toy env "
            "('toy:<family>:<params>', e.g. 'toy:tmaze:length=0')"
        )
    fields = {SETTINGS[k]: v for k, v in settings.items()}
    return TrainConfig(action_mode="score", temperature=float(temperature),
                       gamma=float(gamma), **fields)  # fmt: skip


def score_batch(
    prompts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]], pad_token_id: int
) -> DataProto:
    """The (prompt, response) pairs as verl's agent loop emits them, one row each.

    prompts: int64[n, P] left-padded; responses: int64[n, R] right-padded; input_ids =
    [prompts | responses]; attention_mask: 1 on real tokens; position_ids = cumsum(mask) - 1
    (clipped at 0, verl.utils.model.compute_position_id_with_mask); response_mask: int64[n, R].
    meta_info: temperature 1.0 (raw log-probs), global_token_num (real tokens per row).
    """
    if len(prompts) != len(responses) or not prompts:
        raise ValueError(f"score_batch: {len(prompts)} prompts, {len(responses)} responses "
                         "(one each, at least one)")  # fmt: skip
    n, P, R = len(prompts), max(map(len, prompts)), max(map(len, responses))
    p_ids = torch.full((n, P), pad_token_id, dtype=torch.long)
    r_ids = torch.full((n, R), pad_token_id, dtype=torch.long)
    p_mask = torch.zeros((n, P), dtype=torch.long)
    r_mask = torch.zeros((n, R), dtype=torch.long)
    for i, (p, r) in enumerate(zip(prompts, responses, strict=True)):
        if not p or not r:
            raise ValueError(f"score_batch: row {i} has an empty prompt or response")
        p_ids[i, P - len(p) :], p_mask[i, P - len(p) :] = torch.tensor(list(p)), 1
        r_ids[i, : len(r)], r_mask[i, : len(r)] = torch.tensor(list(r)), 1
    mask = torch.cat([p_mask, r_mask], dim=1)
    tensors = {
        "prompts": p_ids, "responses": r_ids, "input_ids": torch.cat([p_ids, r_ids], dim=1),
        "attention_mask": mask, "position_ids": torch.clip(torch.cumsum(mask, -1) - 1, min=0),
        "response_mask": r_mask,
    }  # fmt: skip
    meta = {"temperature": 1.0, "global_token_num": mask.sum(-1).tolist()}
    return DataProto.from_dict(tensors=tensors, meta_info=meta)


def old_log_probs(compute_log_prob: Any, data: DataProto, dp_size: int = 1) -> torch.Tensor:
    """float32[n, R] the actor's log-probs of ``data``'s response tokens: verl 0.9.1's
    ``RayPPOTrainer._compute_old_log_prob`` steps (no entropy), the batch padded to a multiple
    of the actor's data-parallel size first (``pad_dataproto_to_divisor``) and cut back."""
    n = len(data)
    padded, _ = pad_dataproto_to_divisor(data, dp_size)
    td = left_right_2_no_padding(padded.to_tensordict())
    tu.assign_non_tensor(td, calculate_entropy=False, compute_loss=False)
    output = compute_log_prob(td)
    return no_padding_2_padding(tu.get(output, "log_probs"), td).float()[:n]


def verl_scorer(compute_log_prob: Any, pad_token_id: int, dp_size: int = 1) -> Scorer:
    """A :data:`~hgpo.train.truth_monitor.Scorer` on verl's actor: each pair's response log-probs
    (:func:`old_log_probs`, temperature 1) summed over its tokens.

    compute_log_prob: the actor worker group's method (``trainer.actor_rollout_wg
    .compute_log_prob``, verl/workers/engine_workers.py line 703), TensorDict -> TensorDict.
    """

    def score(prompts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]]) -> list[float]:
        data = score_batch(prompts, responses, pad_token_id)
        lp = old_log_probs(compute_log_prob, data, dp_size)
        mask = data.batch["response_mask"].to(lp.dtype)
        return (lp * mask).sum(-1).tolist()

    return score


class VerlTruth:
    """:class:`TruthMonitor` fed from verl: the batch by the contract, the scores by the actor."""

    def __init__(self, cfg: TrainConfig, tokenizer: Any) -> None:
        """Enumerate the chain; refuse it over ``truth_max_nodes`` nodes or
        ``truth_max_prompts`` prompts (TrainConfigError), before any scoring."""
        self.cfg = cfg
        try:
            self.monitor = TruthMonitor(cfg, tokenizer)
        except TrainConfigError as e:  # name the verl-side key: max_nodes is truth_max_nodes
            raise TrainConfigError(f"trainer.hgpo_truth (max_nodes={cfg.truth_max_nodes}, "
                                   f"max_steps={cfg.max_steps}): {e}") from None  # fmt: skip
        prompts = truth_prompts(self.monitor.chain)
        if prompts > cfg.truth_max_prompts:
            raise TrainConfigError(
                f"trainer.hgpo_truth.max_prompts={cfg.truth_max_prompts}: a truth pass of "
                f"{cfg.env!r} scores {prompts:,} prompts x {self.monitor.env.n_actions} actions"
                f" every {cfg.truth_every} steps; raise it, or shrink the env or history_length"
            )

    def due(self, global_step: int) -> bool:
        """Whether step ``global_step`` (verl counts from 1) logs the truth."""
        return global_step % self.cfg.truth_every == 0

    def steps(self, data: DataProto) -> TruthSteps:
        """The :class:`TruthSteps` of a verl step batch, rows put in (trajectory, step) order.

        Reward: ``rewards`` when given, else ``token_level_rewards`` summed over the row (the
        contract); observations: ``anchor_obs`` (the ``observations`` input of an estimator
        that reads them). Raises ValueError listing the keys it needs, before any work.
        """
        nt = data.non_tensor_batch
        missing = [k for k in (*CONTRACT_KEYS, TRUTH_KEY) if k not in nt]
        missing += [k for k in ("responses", "response_mask") if k not in data.batch]
        if "rewards" not in nt and "token_level_rewards" not in data.batch:
            missing.append("rewards or token_level_rewards")
        if missing:
            raise ValueError(
                f"hgpo truth: the verl batch lacks {missing}; it needs non_tensor_batch "
                f"{[*CONTRACT_KEYS, TRUTH_KEY]} (+ optional step_index, rewards, next_obs, "
                "is_action_valid) and batch responses, response_mask (+ token_level_rewards)"
            )
        rows = step_batch_from_dataproto(data, tokens=("response_mask",))  # rewards checked above
        order = rows.order
        mask = data.batch["response_mask"].bool()
        resp = data.batch["responses"]
        response_ids = [resp[i][mask[i]].tolist() for i in order.tolist()]
        hidden = np.asarray(nt[TRUTH_KEY], dtype=np.int64)[order]
        observations = np.asarray(nt["anchor_obs"], dtype=object)[order].tolist()
        return TruthSteps(rows.batch, hidden, self.monitor.action_ids(response_ids), observations)

    def measure(self, data: DataProto, scorer: Scorer) -> dict[str, float]:
        """``truth/*`` of the batch ``data`` and the policy ``scorer`` scores (call it before
        the update): the same figures as our trainer's ``--truth-every``, plus
        ``truth/rows_no_action``, the rows whose response names no listed action.

        verl samples free text, so such rows occur; they (and the later steps of their
        trajectories) lie outside the chain, so a batch with any of them logs the policy's
        figures (``truth/J``, sizes, times) and ``truth/rows_no_action`` only, with a warning.
        """
        steps = self.steps(data)
        bad = int((steps.action < 0).sum())
        if not bad:
            return {**self.monitor.measure_steps(steps, scorer), "truth/rows_no_action": 0.0}
        log.warning("truth: %d of %d rows name no listed action (free text); the estimator "
                    "figures are left out of this step", bad, steps.action.size)  # fmt: skip
        truth = self.monitor.policy_truth(scorer)
        return {
            "truth/J": truth.J, "truth/nodes": float(self.monitor.chain.n_nodes),
            "truth/prompts": float(self.monitor.row_code.size),
            "truth/time_score": truth.score_seconds, "truth/time_solve": truth.solve_seconds,
            "truth/rows_no_action": float(bad),
        }  # fmt: skip


class TruthRayPPOTrainer(RayPPOTrainer):
    """verl's ``RayPPOTrainer`` that logs ``truth/*`` every ``trainer.hgpo_truth.every`` steps.

    Only ``__init__`` (the chain, checked before any worker starts) and ``_update_actor`` (the
    truth of the weights that played the batch, merged into the metrics verl logs) differ.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.hgpo_truth = truth_from_config(self.config, self.tokenizer)

    def _update_actor(self, batch: DataProto) -> DataProto:
        truth = self.hgpo_truth_metrics(batch)
        output = super()._update_actor(batch)
        output.meta_info["metrics"].update(truth)
        return output

    def hgpo_truth_metrics(self, batch: DataProto) -> dict[str, float]:
        """``truth/*`` of ``batch`` on steps the settings ask for, else {}."""
        if self.hgpo_truth is None or not self.hgpo_truth.due(self.global_steps):
            return {}
        wg = self.actor_rollout_wg
        scorer = verl_scorer(wg.compute_log_prob, self.tokenizer.pad_token_id,
                             self._get_dp_size(wg, "actor"))  # fmt: skip
        return self.hgpo_truth.measure(batch, scorer)


def install() -> None:
    """Make verl's legacy task runner (``trainer.use_v1=false``, verl/trainer/main_ppo_v0.py,
    which builds ``RayPPOTrainer`` at line 218) build :class:`TruthRayPPOTrainer`: it rebinds
    that module's name, in the calling process (the one that runs ``TaskRunner.run``)."""
    import verl.trainer.main_ppo_v0 as v0

    v0.RayPPOTrainer = TruthRayPPOTrainer


def truth_from_config(config: Any, tokenizer: Any) -> VerlTruth | None:
    """The :class:`VerlTruth` of verl's ``config`` (key ``trainer.hgpo_truth``), None without it."""
    settings = config.trainer.get("hgpo_truth", None)
    if settings is None:
        return None
    cfg = truth_config(dict(settings), config.actor_rollout_ref.rollout.temperature,
                       config.algorithm.gamma)  # fmt: skip
    return VerlTruth(cfg, tokenizer)


V1_MODE = "hgpo_truth"
"""verl's v1 trainer mode of :func:`register_v1`'s trainer (``trainer.v1.trainer_mode``)."""

V1_FIELDS = ("responses", "response_mask", "rm_scores", "extra_fields")
"""The TransferQueue fields the v1 hook reads (``extra_fields``: each row's metadata dict)."""


def v1_rows(td: Any) -> DataProto:
    """A v1 TransferQueue read (:data:`V1_FIELDS`, nested tensors) as a DataProto for
    :meth:`VerlTruth.steps`: tensors padded (``to_padded_tensor``, as verl's
    ``_compute_advantage`` reads its rows), ``rm_scores`` as ``token_level_rewards``, each
    ``extra_fields`` key present in every row a ``non_tensor_batch`` column."""
    padded = td.to_padded_tensor()
    extra = list(padded.pop("extra_fields").tolist())
    tensors = {k: padded[k] for k in ("responses", "response_mask")}
    tensors["token_level_rewards"] = padded["rm_scores"]
    common = set.intersection(*(set(e) for e in extra)) if extra else set()
    cols = {k: np.array([e[k] for e in extra], dtype=object) for k in sorted(common)}
    return DataProto.from_dict(tensors=tensors, non_tensors=cols)


def register_v1() -> type:
    """Register verl 0.9.1's v1 trainer mode :data:`V1_MODE`: ``PPOTrainerSync`` that logs
    ``truth/*`` every ``trainer.hgpo_truth.every`` steps. Needs ``transfer_queue``.

    Raises:
        MissingExtraError without transfer_queue; TrainConfigError (at the trainer's
        tokenizer set-up, before any worker) for bad settings or ``parameter_sync_step`` != 1
        (several updates per step: no single policy played the step's batch).
    """
    try:
        import transfer_queue as tq
        from verl.trainer.ppo.v1 import PPOTrainerSync, register_trainer
        from verl.trainer.ppo.v1.trainer_base import TRAINER_REGISTRY
    except ImportError as e:
        raise MissingExtraError(
            f"hgpo.integrations.verl_truth.register_v1 needs verl's v1 trainer ({e}); install "
            "transfer_queue as verl's docs say, or run the legacy trainer (trainer.use_v1=false)"
        ) from None
    done = TRAINER_REGISTRY.get(V1_MODE)
    if done is not None and done.__module__ == __name__:  # registered before (a re-import)
        return done

    class TruthPPOTrainerSync(PPOTrainerSync):
        """verl's sync v1 trainer with the truth of the weights that played each batch."""

        @property
        def trainer_mode(self) -> str:
            """ "sync": verl picks the sync trainer's replay buffer and refills by testing
            ``trainer_mode == "sync"`` (trainer_base.py lines 153, 731, 902, 912, 1004), and
            reads ``trainer.v1.sync`` for its settings; the configured name is kept in
            ``hgpo_trainer_mode``."""
            return "sync"

        @trainer_mode.setter
        def trainer_mode(self, value: str) -> None:
            self.hgpo_trainer_mode = value

        def _init_tokenizer(self) -> None:
            super()._init_tokenizer()
            self.hgpo_truth = truth_from_config(self.config, self.tokenizer)
            if self.hgpo_truth is not None and self.parameter_sync_step != 1:
                raise TrainConfigError(
                    f"trainer.hgpo_truth needs parameter_sync_step=1, got "
                    f"{self.parameter_sync_step} (several updates per step)"
                )

        def _update_actor(self, batch: Any, metrics: dict) -> Any:
            truth = self.hgpo_truth
            if truth is not None and truth.due(self.global_steps):
                keys = [k for k, tag in zip(batch.keys, batch.tags, strict=True)
                        if not tag.get("is_padding", False)]  # fmt: skip
                td = tq.kv_batch_get(keys=keys, partition_id=batch.partition_id,
                                     select_fields=list(V1_FIELDS))  # fmt: skip
                wg = self.actor_rollout_wg
                dp = max(wg._dispatch_info["actor"]) + 1  # filled by _balance_batch
                scorer = verl_scorer(wg.compute_log_prob, self.tokenizer.pad_token_id, dp)
                metrics.update(truth.measure(v1_rows(td), scorer))
            return super()._update_actor(batch, metrics)

    TruthPPOTrainerSync.__qualname__ = "TruthPPOTrainerSync"
    return register_trainer(V1_MODE)(TruthPPOTrainerSync)
