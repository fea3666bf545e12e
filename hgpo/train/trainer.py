"""The training loop: rollout -> advantages (estimator registry) -> PPO update -> sync.

One iteration: ``groups_per_iter`` tasks x ``group_size`` rollouts, split across ranks by whole
rollout groups (every group lives on one rank, so each rank's advantages equal those of the
whole batch: no group ever crosses ranks); every step is a training sample with its step's
advantage on each response token; DeepSpeed holds the actor (and the critic for an estimator
that reads state values, ``gae``; under ZeRO-3 the reference too, sharded, without optimizer).
The estimator gets the per-step inputs it reads (:func:`estimator_inputs`).
"""

from __future__ import annotations

import logging
import math
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from agentenvs.registry import BENCHMARKS, benchmark
from hgpo import Advantages, compute_advantages, estimator_reads
from hgpo.train import dist
from hgpo.train.batched_score import batched_token_logprobs
from hgpo.train.branched_play import BranchPlan, branch_figures, play_branched
from hgpo.train.engines import build_engines, rollout_engine
from hgpo.train.envs import TRAIN_SPLIT, EnvSet, split_size, val_splits
from hgpo.train.episodes import Play, Rollout, logprob_gap, run_episodes
from hgpo.train.hf_engine import HFEngine
from hgpo.train.loss import ppo_loss, value_loss
from hgpo.train.model import (
    Packed,
    check_thinking_switch,
    grad_norm,
    load_tokenizer,
    pack,
    response_logprobs,
)
from hgpo.train.prefix_forward import (
    has_cache_api,
    has_dropout,
    prefix_pays,
    shared_prefix_logprobs,
)
from hgpo.train.preflight import validate_config
from hgpo.train.pretrained import model_folder
from hgpo.train.run_checkpoint import load_run, save_run
from hgpo.train.run_checkpoint import set_lr as set_lr  # (it lived here)
from hgpo.train.run_metrics import (
    LevelFigures,
    MetricsLogger,
    PhaseTimes,
    RankFigures,
    merge_metrics,
)
from hgpo.train.rundir import clear_run, resume_changes
from hgpo.train.tiny import build_tiny
from hgpo.train.train_config import TINY_MODEL, TrainConfig, TrainConfigError
from hgpo.train.truth_monitor import TruthMonitor
from hgpo.train.update import (
    MicroBatch,
    Scored,
    Targets,
    UpdateStats,
    count_minibatches,
    mean_token_entropy,
    pad_rows,
    plan_epoch,
)

log = logging.getLogger(__name__)

KILL_ENV = "HGPO_TRAIN_KILL_AT"
"""Test hook: "update:N" or "save:N" makes the process SIGKILL itself at that point of
iteration N (mid-update after the first optimizer step / mid-checkpoint before publishing)."""


def _maybe_die(point: str, iteration: int) -> None:
    if os.environ.get(KILL_ENV) == f"{point}:{iteration}":
        os.kill(os.getpid(), signal.SIGKILL)


NAN_ENV = "HGPO_TRAIN_NAN_AT"
"""Test hook: "N" makes iteration N's advantages NaN, so its PPO loss is NaN (the run must stop
before that iteration's checkpoint)."""


@dataclass(frozen=True)
class Estimate:
    """One iteration's advantages: the estimator's output (its per-level diagnostics feed the
    metrics) and the targets the PPO update fits."""

    output: Advantages
    targets: Targets


class NonFiniteError(RuntimeError):
    """A loss or gradient norm that is NaN or infinite: the run stops before its checkpoint."""


class EnvCrashError(RuntimeError):
    """More than ``max_crash_share`` of an iteration's episodes crashed in their envs (or all
    of them did): the run stops before that iteration's update and checkpoint."""


def begin_forward(engine: Any) -> None:
    """What ``DeepSpeedEngine.forward`` does before the module's forward, for a training
    forward that calls the engine's module (or its parts) directly.

    ZeRO-3 counts micro-batches in that step (DeepSpeed 0.19: the optimizer's
    ``clear_backward_seen_flag``); without it every backward of a mini-batch overwrites the
    accumulated gradient partitions instead of adding to them, so only the last micro-batch's
    gradient reaches the optimizer. ZeRO-1/2 accumulate correctly either way.
    """
    from deepspeed.runtime.base_optimizer import ZeROOptimizer

    if isinstance(engine.optimizer, ZeROOptimizer):
        engine.optimizer.clear_backward_seen_flag()


def tiny_corpus(env: str = "") -> list[str]:
    """Text the tiny tokenizer is trained on: the text ``env``'s benchmark adds of its own
    (a toy env: its template, observations, tasks and actions), then every benchmark's
    templates and typical env strings (``Benchmark.corpus``, ``templates``, ``sample_text``)."""
    own = benchmark(env, "TrainConfig.env").corpus(env) if env else []
    benches = BENCHMARKS.values()
    return [
        *own,
        *(t for b in benches for t in b.templates),
        *(t for b in benches for t in b.sample_text),
    ]


class Trainer:
    """Owns the engines, the environments, the logger and the loop of one run (one rank)."""

    def __init__(self, cfg: TrainConfig) -> None:
        validate_config(cfg)
        self.cfg = cfg
        self.out = Path(cfg.out_dir)
        self.rank, self.world, self.device = dist.init(cfg.device)
        self.grad_accum = self._grad_accum()
        use_bf16 = cfg.precision == "bf16" or (
            cfg.precision == "auto" and self.device.type == "cuda"
        )
        self.dtype = torch.bfloat16 if use_bf16 else torch.float32
        self.out.mkdir(parents=True, exist_ok=True)
        self._prepare_out_dir()
        self.model_path = self._prepare_model()
        torch.manual_seed(cfg.seed)
        self.tok = load_tokenizer(self.model_path)
        check_thinking_switch(self.tok, cfg.enable_thinking)
        self.sharded = cfg.zero_stage == 3
        self.lora = cfg.lora_rank > 0
        built = build_engines(cfg, self.model_path, self.dtype, self.device, self.grad_accum)
        self.actor, self.ref, self.critic = built.actor, built.ref, built.critic
        self.prefix_update = shared_prefix_applies(cfg, self.actor.module)
        self._ref_engine = built.ref_engine  # ZeRO-3: owns the hooks of the reference's shards
        self.engine = rollout_engine(
            cfg, self.tok, self.model_path, self.actor.module, self.dtype, self.device
        )
        self.groups_per_rank = cfg.groups_per_iter // self.world
        self.train_envs = EnvSet(cfg, TRAIN_SPLIT, self.groups_per_rank * cfg.group_size)
        self.val_envs: dict[str, EnvSet] = {}
        self.play = Play.training(cfg)
        self.branching = BranchPlan.from_config(cfg)
        self.truth = self._truth_monitor()
        self.start = 1
        self._grad_norm = 0.0  # the fallback grad norm when DeepSpeed records none
        if cfg.resume:
            self._load()
        self.logger = MetricsLogger(self.out, cfg, self.start) if self.rank == 0 else None

    # -- setup ---------------------------------------------------------------------------------
    def _prepare_out_dir(self) -> None:
        """Rank 0: --fresh removes the earlier run's files; the changes --resume makes to the
        checkpoint's settings are kept for resumes.jsonl; then config.json is written (every
        check of the folder ran in validate_config, before this)."""
        cfg = self.cfg
        self._resume_changes = resume_changes(cfg) if self.rank == 0 else {}
        if self.rank == 0:
            if cfg.fresh:
                removed = clear_run(self.out)
                if removed:
                    log.info("--fresh: removed %s from %s", ", ".join(removed), self.out)
            cfg.save(self.out / "config.json")
        dist.barrier()

    def _truth_monitor(self) -> Any:
        """The exact truth of the LLM policy on a toy env (``--truth-every``), or None."""
        if not self.cfg.truth_every:
            return None
        if self.world > 1:
            raise TrainConfigError(
                "TrainConfig.truth_every needs one rank (it scores the whole chain on rank 0), "
                f"got {self.world} ranks"
            )
        if self.device.type == "cpu" and torch.get_num_threads() > 1:
            log.info(
                "truth: scoring on the CPU with %d torch threads; on a shared, loaded machine "
                "OMP_NUM_THREADS=1 scores several times faster (python -m benchmarks.bench_truth "
                "--threads N)", torch.get_num_threads(),
            )  # fmt: skip
        return TruthMonitor(self.cfg, self.tok)

    def _grad_accum(self) -> int:
        """Micro-batches per optimizer step on each rank; refuses sizes the ranks cannot split."""
        cfg = self.cfg
        if cfg.groups_per_iter % self.world:
            raise TrainConfigError(
                f"TrainConfig.groups_per_iter={cfg.groups_per_iter} must be divisible by the "
                f"number of ranks ({self.world})"
            )
        per_opt_step = cfg.micro_batch_size * self.world
        if cfg.mini_batch_size % per_opt_step:
            raise TrainConfigError(
                f"TrainConfig.mini_batch_size={cfg.mini_batch_size} must be a multiple of "
                f"micro_batch_size x ranks = {per_opt_step}"
            )
        return cfg.mini_batch_size // per_opt_step

    def _reference_logprobs(self, batch: Packed) -> torch.Tensor:
        """Log-probs [B, R] of the response tokens under the KL reference."""
        if self.ref is not None:
            return response_logprobs(self.ref, batch)[0]
        with self.actor.module.disable_adapter():  # LoRA: the base model is the reference
            return response_logprobs(self.actor.module, batch)[0]

    def _prepare_model(self) -> str:
        cfg = self.cfg
        if cfg.model != TINY_MODEL:
            return model_folder(cfg.model)  # a named model or a GGUF file: its cache folder

        path = self.out / "tiny_model"
        if self.rank == 0:
            build_tiny(
                path,
                tiny_corpus(cfg.env),
                cfg.tiny_vocab,
                cfg.tiny_hidden,
                cfg.tiny_layers,
                cfg.seed,
                arch=cfg.tiny_arch,
            )
        dist.barrier()
        return str(path)

    # -- checkpoints ---------------------------------------------------------------------------
    def _save(self, iteration: int) -> None:
        """Checkpoint ``iteration`` (:func:`hgpo.train.run_checkpoint.save_run`)."""
        save_run(
            self.out, self.cfg, iteration, rank=self.rank, world=self.world, actor=self.actor,
            critic=self.critic, lora=self.lora, tok=self.tok, model_path=self.model_path,
            before_publish=lambda: _maybe_die("save", iteration),
        )  # fmt: skip

    def _load(self) -> None:
        """--resume: the newest checkpoint's engines and next iteration
        (:func:`hgpo.train.run_checkpoint.load_run`), then the rollout engine's weights."""
        got = load_run(
            self.out, self.cfg, self.world, self.actor, self.critic, self.lora,
            getattr(self, "_resume_changes", None),
        )  # fmt: skip
        if got is None:
            log.warning("--resume: no checkpoint in %s, starting from iteration 1", self.out)
            return
        path, self.start = got
        self.engine_sync()
        log.info("resumed from %s: next iteration %d", path, self.start)

    def engine_sync(self) -> None:
        """Push the actor's current weights to the rollout engine."""
        self.engine.sync(self.actor.module)

    # -- one iteration -------------------------------------------------------------------------
    def iteration(self, it: int) -> dict[str, Any]:
        """Run iteration ``it``: rollout -> score -> advantages -> PPO update -> weight sync.

        Returns its metrics (merged over ranks) on rank 0, {} on the other ranks.
        """
        torch.manual_seed(self.cfg.seed * 1_000_003 + it * 1_009 + self.rank)
        times = PhaseTimes()
        # 1. rollout: group_size episodes of each of this rank's tasks
        with times.timing("rollout"):
            roll = self._rollout(it)
        # 1b. crashed episodes are left out of the batch; too many of them stop the run
        stop_if_crashed(roll, self.cfg.max_crash_share, it)
        # 2. score: log-probs of the sampled tokens under the rollout's weights (and the
        #    reference's), the critic's values
        with times.timing("score"):
            scored = self._score(roll)
        # 3. advantages: the estimator by name, on the rollout's step batch
        with times.timing("advantage"):
            estimate = self._estimate(roll, scored, it)
        # 3b. every --truth-every iterations (toy envs): every estimator against the exact
        #     advantages of the weights that played this rollout, so before the update
        truth: dict[str, float] = {}
        if self.truth is not None and it % self.cfg.truth_every == 0:
            with times.timing("truth"):
                truth = self.truth.measure(roll, self.engine)
        # 4. PPO update over mini-batches, then 5. the rollout engine samples from the new weights
        with times.timing("update"):
            stats = self._update(roll, scored, estimate.targets, it)
            self.engine_sync()
        # 6. the iteration's figures, merged over ranks
        parts = dist.gather(self._rank_figures(roll, scored, estimate, stats, times))
        return {**merge_metrics(parts), **truth} if self.rank == 0 else {}

    def _estimate(self, roll: Rollout, scored: Scored, it: int) -> Estimate:
        """The configured estimator's advantages of the rollout's step batch, on the per-step
        inputs it reads (:func:`estimator_inputs`: the critic's values, the policy's entropy,
        the observations), and the targets the update fits (the returns too with a critic)."""
        cfg = self.cfg
        est = compute_advantages(
            cfg.estimator,
            roll.step_batch(),
            cfg.estimator_config(),
            **estimator_inputs(cfg.estimator, roll, scored, cfg.action_mode),
        )
        adv = est.advantages
        if os.environ.get(NAN_ENV) == str(it):
            adv = adv * np.nan
        return Estimate(est, Targets(adv, est.returns if cfg.use_critic else None))

    def _update(self, roll: Rollout, scored: Scored, targets: Targets, it: int) -> UpdateStats:
        """``ppo_epochs`` passes of PPO over mini-batches planned from the response lengths
        (shuffled by (seed, iteration, rank)); every rank takes the same number of optimizer
        steps, the most any rank needs. Raises NonFiniteError (on every rank) when a loss or
        gradient norm is not finite, before the weights reach the rollout engine."""
        cfg = self.cfg
        stats = UpdateStats()
        n_minibatches = dist.all_max(
            count_minibatches(len(roll), cfg.micro_batch_size * self.grad_accum)
        )
        rng = np.random.default_rng([cfg.seed, it, self.rank, 7])
        lengths = [len(r) for r in roll.response_ids]
        # ordered by prompt for the shared prefix; a critic's loss (a mean of micro-batch means)
        # would change with the order, so its runs keep the shuffled order
        prompts = roll.prompt_ids if self.prefix_update and self.critic is None else None
        for _ in range(cfg.ppo_epochs):
            plan = plan_epoch(lengths, n_minibatches, cfg.micro_batch_size, self.grad_accum, rng,
                              prompts)  # fmt: skip
            for m, minibatch in enumerate(plan):
                for micro in minibatch:
                    self._micro_step(roll, scored, targets, micro, stats)
                stats.add_grad_norm(self._last_grad_norm())
                if m == 0:
                    _maybe_die("update", it)
        stats.optimizer_steps = n_minibatches * cfg.ppo_epochs
        stats.lr = float(self.actor.optimizer.param_groups[0]["lr"])
        stop_unless_finite(stats, it)
        return stats

    def _rank_figures(
        self,
        roll: Rollout,
        scored: Scored,
        estimate: Estimate,
        stats: UpdateStats,
        times: PhaseTimes,
    ) -> RankFigures:
        """This rank's figures of the iteration, for merge_metrics (episodes: the roots of a
        branched rollout)."""
        adv = estimate.targets.advantages
        episodes = roll.root_episodes()
        return RankFigures(
            n_steps=len(roll),
            adv_sum=float(adv.sum()),
            adv_sq=float((adv**2).sum()),
            reward=episodes.reward,
            success=episodes.success,
            score=episodes.score,
            length=episodes.length,
            invalid=int(np.sum(roll.invalid)),
            gen_tokens=roll.gen_tokens,
            gen_s=roll.gen_seconds,
            env_s=roll.env_seconds,
            lp_gap=logprob_gap(roll.engine_logprobs, scored.old),
            levels=[
                LevelFigures(
                    d["level"],
                    d.get("utilisation", 0.0),
                    d.get("mean_group_size", 0.0),
                    d.get("n_groups", 0),
                )
                for d in estimate.output.diagnostics.get("levels", [])
            ],
            update=stats.metrics(),
            times=times,
            branching=branch_figures(roll) if self.branching is not None else None,
            crashed=roll.crashed,
            dropped=roll.dropped,
        )

    def _rollout(self, it: int) -> Rollout:
        """This rank's training rollout of iteration ``it``: independent episodes, or branched
        ones (``--rollout-scheme``) whose branch points are drawn from (seed, iteration, rank)."""
        tasks = self._tasks(it)
        if self.branching is None:
            return run_episodes(self.train_envs, self.engine, self.tok, tasks, self.play)
        rng = np.random.default_rng([self.cfg.seed, it, self.rank, 11])
        return play_branched(
            self.train_envs, self.engine, self.tok, tasks, self.play, self.branching, rng
        )

    def _tasks(self, it: int) -> list[int]:
        """This rank's tasks of iteration ``it``: seeded by (seed, iteration), whole groups."""
        cfg = self.cfg
        n = self.train_envs.num_tasks
        if cfg.train_tasks:
            n = min(n, cfg.train_tasks)
        rng = np.random.default_rng([cfg.seed, it])
        tasks = rng.choice(n, size=cfg.groups_per_iter, replace=n < cfg.groups_per_iter)
        g = self.groups_per_rank
        return [int(t) for t in tasks[self.rank * g : (self.rank + 1) * g]]

    @torch.no_grad()
    def _score(self, roll: Rollout) -> Scored:
        """Old log-probs (actor), reference log-probs and values of every step sample, and,
        for an estimator that reads ``entropy`` in action_mode "generate", each response's
        mean token entropy from the same forward (:func:`~hgpo.train.update.mean_token_entropy`:
        per micro-batch, the [B, R, V] log-probs are never kept).

        The old log-probs are the rollout's own where they are exactly what the actor's
        forward here would give (:meth:`_reusable_logprobs`): then the actor runs no forward,
        and the reference's log-probs come from batched passes that share prompt prefixes
        (:meth:`_reference_token_logprobs`)."""
        cfg = self.cfg
        want_entropy = needs_token_entropy(cfg.estimator, cfg.action_mode)
        reused = None if want_entropy else self._reusable_logprobs(roll)
        if reused is not None and self.critic is None:
            ref = self._reference_token_logprobs(roll) if cfg.kl_coef > 0 else None
            return Scored(reused, ref, None, None)
        old, ref, val, ent = [], [], [], []
        self.actor.module.eval()
        mb = cfg.micro_batch_size
        n_mb = math.ceil(len(roll) / mb)
        if self.sharded:  # ZeRO-3 forwards are collectives: every rank runs as many
            n_mb = dist.all_max(n_mb)
        for m in range(n_mb):
            extra = m * mb >= len(roll)  # a forward to keep in step, its result dropped
            sl = slice(0, 1) if extra else slice(m * mb, (m + 1) * mb)
            b = pack(roll.prompt_ids[sl], roll.response_ids[sl], self.tok.pad_token_id, self.device)
            lp, token_ent = None, None
            if reused is None:
                lp, token_ent = response_logprobs(self.actor.module, b, with_entropy=want_entropy)
            rl = self._reference_logprobs(b) if cfg.kl_coef > 0 else None
            v = self.critic.module(b) if self.critic is not None else None
            if extra:
                continue
            if lp is not None:
                old.extend(lp.float().cpu())
            if token_ent is not None:
                ent.extend(mean_token_entropy(token_ent, b.response_mask).cpu().tolist())
            if rl is not None:
                ref.extend(rl.float().cpu())
            if v is not None:
                val.extend(v.float().cpu())
        self.actor.module.train()
        return Scored(
            old if reused is None else reused,
            ref if cfg.kl_coef > 0 else None,
            val if self.critic is not None else None,
            ent if want_entropy else None,
        )

    def _reusable_logprobs(self, roll: Rollout) -> list[torch.Tensor] | None:
        """The rollout's own token log-probs as the old log-probs, where they are exactly
        what the actor's forward in :meth:`_score` computes, else None (score afresh).

        PPO's old log-probs are the behaviour weights' token log-probs at temperature 1 (the
        update's own forward divides by no temperature); score mode computes exactly those for
        every candidate before it samples one (the sampling temperature acts on the candidates'
        summed scores only, not on these), and generate mode's sampling passes compute them
        from the raw logits before the temperature and top-p act
        (:meth:`HFEngine.token_logprobs`). They are reused when the rollout engine scored with
        the actor's own module (the hf engine without a copy: not under ZeRO-3, whose engine
        holds a merged copy), in float32 (bf16's rounding differs between batch layouts), and
        every row has its own, one per response token. The weights cannot have changed in
        between: the update comes after :meth:`_score`; both passes run in eval mode (no
        dropout)."""
        if self.dtype != torch.float32:
            return None
        engine = self.engine
        if not isinstance(engine, HFEngine) or engine.copy or engine.model is not self.actor.module:
            return None
        got = roll.score_logprobs
        if len(got) != len(roll) or any(
            lp is None or len(lp) != len(r) for lp, r in zip(got, roll.response_ids, strict=True)
        ):
            return None
        return [torch.tensor(lp, dtype=torch.float32) for lp in got]

    def _reference_token_logprobs(self, roll: Rollout) -> list[torch.Tensor]:
        """The reference's token log-probs of every step sample, in batched passes that share
        the prompts' common prefixes (:func:`~hgpo.train.batched_score.batched_token_logprobs`;
        the figures of :meth:`_reference_logprobs` to float32 rounding). Not under ZeRO-3
        (its forwards are collectives, in micro-batches on every rank)."""
        pad = self.tok.pad_token_id
        if self.ref is not None:
            got = batched_token_logprobs(self.ref, roll.prompt_ids, roll.response_ids, pad,
                                         self.device)  # fmt: skip
        else:
            with self.actor.module.disable_adapter():  # LoRA: the base model is the reference
                got = batched_token_logprobs(self.actor.module, roll.prompt_ids,
                                             roll.response_ids, pad, self.device)  # fmt: skip
        self.actor.module.train()
        return [torch.tensor(lp, dtype=torch.float32) for lp in got]

    def _micro_step(
        self,
        roll: Rollout,
        scored: Scored,
        targets: Targets,
        micro: MicroBatch,
        stats: UpdateStats,
    ) -> None:
        """One forward/backward of the actor (and the critic) on ``micro``; DeepSpeed steps the
        optimizer at the mini-batch's last micro-batch."""
        rows = micro.rows
        prompts = [roll.prompt_ids[i] for i in rows]
        responses = [roll.response_ids[i] for i in rows]
        if micro.weight == 0:
            # padding (only to keep DeepSpeed's step count and the ranks' collectives): its
            # gradient is 0 whatever it holds, so its sample is cut to one token each way
            prompts, responses = [prompts[0][-1:]], [responses[0][:1]]
        adv = torch.tensor(targets.advantages[rows], dtype=torch.float32, device=self.device)
        begin_forward(self.actor)
        lp, ent, mask = self._actor_logprobs(prompts, responses)
        R = mask.shape[1]
        ref = pad_rows(scored.ref, rows, R, self.device) if scored.ref is not None else None
        loss, st = ppo_loss(
            lp,
            pad_rows(scored.old, rows, R, self.device),
            ref,
            adv[:, None].expand(-1, R),
            mask,
            self.cfg,
            entropy=ent,
            denom=micro.tokens,
        )
        # DeepSpeed divides by the accumulation steps; undo it so the mini-batch loss is a token mean.
        self.actor.backward(loss * self.grad_accum * micro.weight)
        if self.actor.is_gradient_accumulation_boundary():
            # DeepSpeed records the norm only on its ZeRO/bf16 paths; read it here otherwise.
            self._grad_norm = grad_norm(self.actor.module)
        self.actor.step()
        stats.add(st, micro.weight)
        if self.critic is not None and targets.returns is not None:
            assert scored.values is not None
            v = self.critic(pack(prompts, responses, self.tok.pad_token_id, self.device))
            v_old = torch.stack([scored.values[i] for i in rows]).to(self.device)
            ret = torch.tensor(targets.returns[rows], dtype=torch.float32, device=self.device)
            vl = value_loss(v, v_old, ret, self.cfg.value_clip).mean()
            self.critic.backward(vl * micro.weight)
            self.critic.step()
            stats.vf_losses.append(float(vl.detach()) * micro.weight)

    def _actor_logprobs(
        self, prompts: list[list[int]], responses: list[list[int]]
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        """The actor's response log-probs [B, R] (with grad), entropies [B, R] and response
        mask [B, R]: the micro-batch's shared prompt tokens once where that applies and pays
        (``shared_prefix_update``; hgpo.train.prefix_forward), else the packed forward."""
        pad = self.tok.pad_token_id
        if self.prefix_update and prefix_pays(prompts):
            return shared_prefix_logprobs(
                self.actor.module, prompts, responses, pad, self.device, with_entropy=True
            )
        b = pack(prompts, responses, pad, self.device)
        lp, ent = response_logprobs(self.actor.module, b, with_entropy=True)
        return lp, ent, b.response_mask

    def _last_grad_norm(self) -> float:
        """The actor's gradient norm of the optimizer step just taken (before clipping)."""
        gn = self.actor.get_global_grad_norm()
        return float(gn) if gn is not None else self._grad_norm

    # -- validation ----------------------------------------------------------------------------
    def validate(self) -> dict[str, float]:
        """Success (and WebShop score) on held-out tasks at the validation temperature."""
        cfg = self.cfg
        out: dict[str, float] = {}
        for split in val_splits(cfg.env):
            n = min(cfg.val_tasks, split_size(cfg, split))
            mine = list(range(n))[self.rank :: self.world]
            res: dict[str, Any] = {"success": [], "score": [], "task_type": [], "crashed": 0}
            if mine:
                if split not in self.val_envs:
                    self.val_envs[split] = EnvSet(cfg, split, len(mine))
                roll = run_episodes(
                    self.val_envs[split], self.engine, self.tok, mine, Play.validation(cfg)
                )
                res = {"success": roll.success, "score": roll.score, "task_type": roll.task_type,
                       "crashed": roll.crashed}  # fmt: skip
            parts = dist.gather(res)
            succ = [s for p in parts for s in p["success"]]
            score = [s for p in parts for s in p["score"]]
            types = [s for p in parts for s in p["task_type"]]
            out[f"val/{split}/success"] = float(np.mean(succ)) if succ else 0.0
            out[f"val/{split}/score"] = float(np.mean(score)) if score else 0.0
            out[f"val/{split}/tasks"] = len(succ)
            out[f"val/{split}/crashed"] = sum(p["crashed"] for p in parts)  # not in tasks
            for tt in sorted(set(types)):
                sel = [s for s, t in zip(succ, types, strict=True) if t == tt]
                out[f"val/{split}/type/{tt}"] = float(np.mean(sel))
        return out

    # -- the loop ------------------------------------------------------------------------------
    def run(self) -> list[dict[str, Any]]:
        """Train from ``self.start`` to ``cfg.iterations``; returns the logged rows (rank 0).

        Per iteration: train (:meth:`iteration`), then every ``val_every`` iterations validate,
        log the row, and every ``save_every`` iterations checkpoint (and after the last one).
        """
        cfg = self.cfg
        rows: list[dict[str, Any]] = []
        bar = self._progress_bar()
        try:
            for it in range(self.start, cfg.iterations + 1):
                m = self.iteration(it)
                last = it == cfg.iterations
                if due(cfg.val_every, it) or (cfg.val_every and last):
                    t = time.perf_counter()
                    m.update(self.validate())
                    m["time/validation"] = time.perf_counter() - t
                if self.rank == 0:
                    self.logger.log(it, m)
                    rows.append({"iteration": it, **m})
                    if bar is not None:
                        bar.update(1)
                        bar.set_postfix(
                            success=f"{m['success_rate']:.2f}", reward=f"{m['reward_mean']:.2f}"
                        )
                if due(cfg.save_every, it) or last:
                    self._save(it)
        finally:
            if bar is not None:
                bar.close()
        return rows

    def _progress_bar(self) -> Any:
        if self.rank != 0 or not self.cfg.progress:
            return None
        from tqdm import tqdm

        total, done = self.cfg.iterations, self.start - 1
        return tqdm(total=total, initial=done, desc="hgpo.train", unit="it")

    def close(self) -> None:
        """Stop env workers, the rollout engine and the logger."""
        self.train_envs.close()
        for e in self.val_envs.values():
            e.close()
        if self.logger is not None:
            self.logger.close()
        self.engine.close()


def needs_token_entropy(estimator: str, action_mode: str) -> bool:
    """Whether the scoring pass computes each response's mean token entropy: the estimator
    reads ``entropy`` and the steps are free text (score mode has the exact entropy over the
    candidates from the rollout)."""
    return "entropy" in estimator_reads(estimator) and action_mode != "score"


def step_entropy(roll: Rollout, scored: Scored, action_mode: str) -> np.ndarray:
    """float64[n] the policy's entropy at every step, in nats: in action_mode "score" the exact
    entropy of its distribution over the step's candidate actions at the rollout temperature
    (``Rollout.candidate_entropy``); in "generate" the mean token entropy of the step's
    response at temperature 1, the distribution of the PPO log-probs (``Scored.entropy``)."""
    if action_mode == "score":
        got = roll.candidate_entropy
        if len(got) != len(roll) or any(h is None for h in got):
            raise RuntimeError("step_entropy: a score-mode step without its candidate entropy")
        return np.asarray(got, dtype=np.float64)
    if scored.entropy is None:
        raise RuntimeError("step_entropy: the scoring pass computed no token entropy")
    return np.asarray(scored.entropy, dtype=np.float64)


def estimator_inputs(
    estimator: str, roll: Rollout, scored: Scored, action_mode: str
) -> dict[str, Any]:
    """The per-step inputs (``hgpo.STEP_INPUTS``) that ``estimator`` reads, by keyword for
    ``compute_advantages``, and no others:

    - ``values``: the critic's V(s_t) (:meth:`Scored.value_array`);
    - ``entropy``: the policy's entropy at each step (:func:`step_entropy`);
    - ``observations``: the observation text each step was taken from, as the env returned
      it (``Rollout.observation``).
    """
    out: dict[str, Any] = {}
    for key in estimator_reads(estimator):
        if key == "values":
            out["values"] = scored.value_array()
        elif key == "entropy":
            out["entropy"] = step_entropy(roll, scored, action_mode)
        elif key == "observations":
            out["observations"] = list(roll.observation)
        else:  # refused by TrainConfig before any model is built (TRAINER_INPUTS)
            raise TrainConfigError(
                f"estimator {estimator!r} reads {key!r}, which the trainer lacks"
            )
    return out


def shared_prefix_applies(cfg: TrainConfig, actor: torch.nn.Module) -> bool:
    """Whether the update may compute a micro-batch's common prompt prefix once: asked for
    (``shared_prefix_update``), and exact here: not ZeRO-3 (sharded parameters), no gradient
    checkpointing (no cache in a checkpointed forward), no active dropout (the rows would share
    the prefix's dropout draws), a decoder that takes a key/value cache."""
    return (
        cfg.shared_prefix_update
        and cfg.zero_stage != 3
        and not cfg.gradient_checkpointing
        and not has_dropout(actor)
        and has_cache_api(actor)
    )


def due(every: int, it: int) -> bool:
    """Whether a task done every ``every`` iterations (0 = never) falls on iteration ``it``."""
    return bool(every) and it % every == 0


def stop_unless_finite(stats: UpdateStats, it: int) -> None:
    """Raise NonFiniteError on every rank when any rank saw a NaN or infinite loss or gradient
    norm: before the weight sync and before the iteration's checkpoint."""
    if dist.all_max(int(not stats.finite)):
        raise NonFiniteError(
            f"iteration {it}: the PPO loss or the gradient norm is not finite; the run stops "
            "before writing a checkpoint (the last one is kept); lower --lr or check the inputs"
        )


def stop_if_crashed(roll: Rollout, max_share: float, it: int) -> None:
    """Raise EnvCrashError on every rank when, over all ranks, more than ``max_share`` of the
    iteration's episodes crashed, or a rank has no trajectory left to train on."""
    parts = dist.gather((roll.crashed, roll.played, len(roll.success)))
    crashed, played = sum(p[0] for p in parts), sum(p[1] for p in parts)
    empty = [r for r, p in enumerate(parts) if not p[2]]
    if crashed > max_share * played or empty:
        why = (
            ("none is" if len(parts) == 1 else f"rank {empty[0]} has none") + " left to train on"
            if empty
            else f"share {crashed / played:.2f} > TrainConfig.max_crash_share={max_share:g}"
        )
        raise EnvCrashError(
            f"iteration {it}: {crashed} of {played} episodes crashed in their environments "
            f"({why}); the run stops before this iteration's update and checkpoint; the log "
            "has the envs' errors; --max-crash-share sets the share a run tolerates"
        )


def train(cfg: TrainConfig) -> list[dict[str, Any]]:
    """Run ``cfg`` end to end; returns the metrics rows (on rank 0; [] elsewhere)."""
    trainer = Trainer(cfg)
    try:
        return trainer.run()
    finally:
        trainer.close()
