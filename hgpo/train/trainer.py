"""The training loop: rollout -> advantages (estimator registry) -> PPO update -> sync.

One iteration: ``groups_per_iter`` tasks x ``group_size`` rollouts, split across ranks by whole
rollout groups (every group lives on one rank, so each rank's advantages equal those of the
whole batch: no group ever crosses ranks); every step is a training sample with its step's
advantage on each response token; DeepSpeed holds the actor (and the critic for ``gae``; under
ZeRO-3 the reference too, sharded, without optimizer).
"""

from __future__ import annotations

import json
import logging
import math
import os
import signal
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hgpo import compute_advantages
from hgpo.train import checkpoint as ckpt
from hgpo.train import dist
from hgpo.train.config import TINY_MODEL, TrainConfig, TrainConfigError, is_toy
from hgpo.train.envs import TRAIN_SPLIT, EnvSet, split_size, val_splits
from hgpo.train.metrics import MetricsLogger
from hgpo.train.model import (
    HF_MODEL_DIR,
    Critic,
    HFEngine,
    check_model,
    grad_norm,
    kl_k3,
    load_causal_lm,
    load_tokenizer,
    pack,
    policy_loss,
    response_logprobs,
    save_hf_model,
    value_loss,
)
from hgpo.train.rollout import Rollout, logprob_gap, run_episodes

log = logging.getLogger(__name__)

KILL_ENV = "HGPO_TRAIN_KILL_AT"
"""Test hook: "update:N" or "save:N" makes the process SIGKILL itself at that point of
iteration N (mid-update after the first optimizer step / mid-checkpoint before publishing)."""


def _maybe_die(point: str, iteration: int) -> None:
    if os.environ.get(KILL_ENV) == f"{point}:{iteration}":
        os.kill(os.getpid(), signal.SIGKILL)


def validate_config(cfg: TrainConfig) -> None:
    """Checks that need the filesystem or the hub, done before any heavy work."""
    if cfg.model != TINY_MODEL:
        check_model(cfg.model)
    if cfg.env == "alfworld" and cfg.alfworld_games_dir:
        for split in (TRAIN_SPLIT, *val_splits("alfworld")):
            if not (Path(cfg.alfworld_games_dir) / split).is_dir():
                raise ValueError(
                    f"TrainConfig.alfworld_games_dir: {cfg.alfworld_games_dir!r} has no {split}/ folder"
                )
    if cfg.truth_every:  # issue 14 hook: the chain fits --truth-max-nodes, before any model
        from hgpo.train.truth import truth_chain

        truth_chain(cfg)


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


def set_lr(optimizer: Any, lr: float, weight_decay: float) -> None:
    """Set every parameter group's learning rate and weight decay (DeepSpeed's ZeRO optimizers
    wrap the torch optimizer and share its ``param_groups``)."""
    for group in optimizer.param_groups:
        group["lr"], group["weight_decay"] = lr, weight_decay


def tiny_corpus(env: str = "") -> list[str]:
    """Text the tiny tokenizer is trained on: the paper's templates and typical env strings
    (a toy env adds its template, observations, tasks and actions)."""
    from agentenvs import prompts

    toy: list[str] = []
    if is_toy(env):  # issue 14 hook
        from agentenvs.toytext import toy_corpus

        toy = toy_corpus(env)
    return [
        *toy,
        prompts.ALFWORLD_TEMPLATE,
        prompts.ALFWORLD_TEMPLATE_NO_HIS,
        prompts.WEBSHOP_TEMPLATE,
        prompts.WEBSHOP_TEMPLATE_NO_HIS,
        "You arrive at fridge 1. The fridge 1 is closed. You open the fridge 1. In it, you see "
        "a apple 1, a egg 2, and a tomato 1. Nothing happens. You pick up the apple 1 from the "
        "countertop 1. You heat the apple 1 using the microwave 1. You move the apple 1 to the "
        "diningtable 1. go to cabinet 1, open drawer 2, take mug 1 from shelf 3, use desklamp 1",
        "Back to Search [SEP] Page 1 (Total results: 50) [SEP] Next > [SEP] B09XYZ [SEP] $19.99 "
        "Buy Now Description Features Reviews size color price lower than 40.00 dollars",
    ]


class Trainer:
    """Owns the engines, the environments, the logger and the loop of one run (one rank)."""

    def __init__(self, cfg: TrainConfig) -> None:
        import deepspeed

        validate_config(cfg)
        self.cfg = cfg
        self.out = Path(cfg.out_dir)
        self.rank, self.world, self.device = dist.init(cfg.device)
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
        self.grad_accum = cfg.mini_batch_size // per_opt_step
        use_bf16 = cfg.precision == "bf16" or (
            cfg.precision == "auto" and self.device.type == "cuda"
        )
        self.dtype = torch.bfloat16 if use_bf16 else torch.float32
        self.out.mkdir(parents=True, exist_ok=True)
        if self.rank == 0:
            cfg.save(self.out / "config.json")
        self.model_path = self._prepare_model()
        torch.manual_seed(cfg.seed)
        self.tok = load_tokenizer(self.model_path)
        actor = load_causal_lm(self.model_path, self.dtype, self.device)
        if cfg.gradient_checkpointing:
            actor.gradient_checkpointing_enable()
        self.sharded = cfg.zero_stage == 3
        ds_cfg = self._ds_config()
        self.ref = None
        self._ref_engine = None  # ZeRO-3: owns the hooks that gather the reference's shards
        if cfg.kl_coef > 0:
            ref = load_causal_lm(self.model_path, self.dtype, self.device).eval()
            ref.requires_grad_(False)
            if self.sharded:  # sharded like the actor, forward only (no optimizer)
                self._ref_engine, *_ = deepspeed.initialize(model=ref, config=ds_cfg)
                ref = self._ref_engine.module.eval()
            self.ref = ref
        # A torch optimizer: DeepSpeed's own Adam would be compiled with g++ on first use.
        opt = torch.optim.AdamW(actor.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
        self.actor, *_ = deepspeed.initialize(model=actor, optimizer=opt, config=ds_cfg)
        self.critic = None
        if cfg.use_critic:
            critic = Critic(self.model_path, self.dtype).to(self.device)
            copt = torch.optim.AdamW(
                critic.parameters(), lr=cfg.critic_lr, weight_decay=cfg.weight_decay
            )
            self.critic, *_ = deepspeed.initialize(model=critic, optimizer=copt, config=ds_cfg)
        self.engine = self._rollout_engine()
        self.groups_per_rank = cfg.groups_per_iter // self.world
        self.train_envs = EnvSet(cfg, TRAIN_SPLIT, self.groups_per_rank * cfg.group_size)
        self.val_envs: dict[str, EnvSet] = {}
        self.truth = None  # issue 14 hook: exact truth of the LLM policy on a toy env
        if cfg.truth_every:
            if self.world > 1:
                raise TrainConfigError("TrainConfig.truth_every needs one rank (it scores the "
                                       f"whole chain on rank 0), got {self.world} ranks")  # fmt: skip
            from hgpo.train.truth import TruthMonitor

            self.truth = TruthMonitor(cfg, self.tok)
        self.start = 1
        self._grad_norm = 0.0
        if cfg.resume:
            self._load()
        self.logger = MetricsLogger(self.out, cfg, self.start) if self.rank == 0 else None

    # -- setup ---------------------------------------------------------------------------------
    def _prepare_model(self) -> str:
        cfg = self.cfg
        if cfg.model != TINY_MODEL:
            return cfg.model
        from hgpo.train.tiny import build_tiny

        path = self.out / "tiny_model"
        if self.rank == 0:
            build_tiny(
                path,
                tiny_corpus(cfg.env),
                cfg.tiny_vocab,
                cfg.tiny_hidden,
                cfg.tiny_layers,
                cfg.seed,
            )
        dist.barrier()
        return str(path)

    def _ds_config(self) -> dict[str, Any]:
        cfg = self.cfg
        return {
            "train_micro_batch_size_per_gpu": cfg.micro_batch_size,
            "gradient_accumulation_steps": self.grad_accum,
            "gradient_clipping": cfg.grad_clip,
            "zero_optimization": {"stage": cfg.zero_stage},
            "bf16": {"enabled": self.dtype == torch.bfloat16},
            "steps_per_print": 10**9,
            "wall_clock_breakdown": False,
        }

    def _rollout_engine(self) -> Any:
        cfg = self.cfg
        if cfg.rollout_engine == "vllm":
            from hgpo.train.vllm_engine import VLLMEngine

            return VLLMEngine(self.model_path, self.tok, cfg, self.actor.module)
        if self.sharded:
            # A full copy of the actor to sample from: generating on the sharded module would
            # gather every layer for every token, in lockstep over the ranks.
            full = load_causal_lm(self.model_path, self.dtype, self.device).eval()
            full.requires_grad_(False)
            return HFEngine(full, self.tok, cfg.rollout_batch_size, self.device, copy=True)
        return HFEngine(self.actor.module, self.tok, cfg.rollout_batch_size, self.device)

    # -- checkpoints ---------------------------------------------------------------------------
    def _save(self, iteration: int) -> None:
        root = self.out / "checkpoints"
        if self.rank == 0:
            ckpt.tmp_dir(root, iteration)
        dist.barrier()
        tmp = root / f".tmp-iter_{iteration:06d}"
        self.actor.save_checkpoint(str(tmp), tag="actor")
        if self.critic is not None:
            self.critic.save_checkpoint(str(tmp), tag="critic")
        save_hf_model(self.actor.module, self.tok, tmp / HF_MODEL_DIR, self.rank == 0)
        if self.rank == 0:
            state = {
                "iteration": iteration,
                "model_path": self.model_path,
                "world_size": self.world,
            }
            (tmp / "trainer_state.json").write_text(json.dumps(state) + "\n")
        _maybe_die("save", iteration)
        dist.barrier()
        if self.rank == 0:
            ckpt.commit(root, tmp, iteration, self.cfg.keep_checkpoints)
        dist.barrier()

    def _load(self) -> None:
        path = ckpt.latest(self.out / "checkpoints")
        if path is None:
            log.info("resume: no checkpoint in %s, starting from iteration 1", self.out)
            return
        state = json.loads((path / "trainer_state.json").read_text())
        saved_world = int(state.get("world_size", self.world))
        if saved_world != self.world and self.cfg.zero_stage > 0:
            # DeepSpeed partitions ZeRO-1/2/3 optimizer states by rank and cannot re-partition
            # them; ZeRO-0 checkpoints resume on any number of ranks
            raise TrainConfigError(
                f"--resume: {path} was written by {saved_world} ranks under "
                f"TrainConfig.zero_stage={self.cfg.zero_stage}, this run has {self.world}; "
                f"resume with {saved_world} ranks, or start a new run from its weights with "
                f"--model {path / HF_MODEL_DIR}"
            )
        self.actor.load_checkpoint(str(path), tag="actor")
        if self.critic is not None:
            self.critic.load_checkpoint(str(path), tag="critic")
        # the optimizer states bring back the saved learning rates; the run's config (where
        # flags given with --resume may change them) decides
        set_lr(self.actor.optimizer, self.cfg.lr, self.cfg.weight_decay)
        if self.critic is not None:
            set_lr(self.critic.optimizer, self.cfg.critic_lr, self.cfg.weight_decay)
        self.start = int(state["iteration"]) + 1
        self.engine_sync()
        log.info("resumed from %s: next iteration %d", path, self.start)

    def engine_sync(self) -> None:
        """Push the actor's current weights to the rollout engine."""
        self.engine.sync(self.actor.module)

    # -- one iteration -------------------------------------------------------------------------
    def _tasks(self, iteration: int) -> list[int]:
        cfg = self.cfg
        n = self.train_envs.num_tasks
        if cfg.train_tasks:
            n = min(n, cfg.train_tasks)
        rng = np.random.default_rng([cfg.seed, iteration])
        tasks = rng.choice(n, size=cfg.groups_per_iter, replace=n < cfg.groups_per_iter)
        g = self.groups_per_rank
        return [int(t) for t in tasks[self.rank * g : (self.rank + 1) * g]]

    @torch.no_grad()
    def _score(self, roll: Rollout) -> dict[str, torch.Tensor]:
        """Old log-probs (actor), reference log-probs and values of every step sample."""
        cfg = self.cfg
        pad = self.tok.pad_token_id
        old, ref, val = [], [], []
        self.actor.module.eval()
        mb = cfg.micro_batch_size
        n_mb = math.ceil(len(roll) / mb)
        if self.sharded:  # ZeRO-3 forwards are collectives: every rank runs as many
            n_mb = dist.all_max(n_mb)
        for m in range(n_mb):
            extra = m * mb >= len(roll)  # a forward to keep in step, its result dropped
            sl = slice(0, 1) if extra else slice(m * mb, (m + 1) * mb)
            b = pack(roll.prompt_ids[sl], roll.response_ids[sl], pad, self.device)
            lp, _ = response_logprobs(self.actor.module, b)
            rl = response_logprobs(self.ref, b)[0] if self.ref is not None else None
            v = self.critic.module(b) if self.critic is not None else None
            if extra:
                continue
            old.extend(lp.float().cpu())
            if rl is not None:
                ref.extend(rl.float().cpu())
            if v is not None:
                val.extend(v.float().cpu())
        self.actor.module.train()
        out = {"old": old, "ref": ref}
        if val:
            out["values"] = val
        return out

    def _update(
        self,
        roll: Rollout,
        adv: np.ndarray,
        scored: dict,
        returns: np.ndarray | None,
        iteration: int,
    ) -> dict[str, float]:
        """One PPO epoch (``ppo_epochs``) over the step samples in mini-batches."""
        cfg = self.cfg
        pad = self.tok.pad_token_id
        n = len(roll)
        per_rank_mb = cfg.micro_batch_size * self.grad_accum
        n_mb = dist.all_max(math.ceil(n / per_rank_mb)) if n else dist.all_max(0)
        rng = np.random.default_rng([cfg.seed, iteration, self.rank, 7])
        sums = {"pg_loss": 0.0, "kl": 0.0, "entropy": 0.0, "clip_frac": 0.0, "tokens": 0.0}
        vsum, vcount, gnorms = 0.0, 0, []
        for _ in range(cfg.ppo_epochs):
            perm = rng.permutation(n) if n else np.zeros(0, dtype=np.int64)
            for m in range(n_mb):
                idx = perm[m * per_rank_mb : (m + 1) * per_rank_mb]
                tokens = max(1, sum(len(roll.response_ids[i]) for i in idx))
                for a in range(self.grad_accum):
                    midx = idx[a * cfg.micro_batch_size : (a + 1) * cfg.micro_batch_size]
                    weight = 1.0
                    if len(midx) == 0:  # keep the collectives in step with the other ranks
                        midx, weight = np.zeros(1, dtype=np.int64), 0.0
                        if n == 0:
                            raise RuntimeError("a rank without any step sample cannot take part")
                    st = self._micro_step(roll, adv, scored, returns, midx, tokens, weight, pad)
                    for k in sums:
                        sums[k] += st[k]
                    if "vf_loss" in st:
                        vsum, vcount = vsum + st["vf_loss"], vcount + 1
                gn = self.actor.get_global_grad_norm()
                gnorms.append(float(gn) if gn is not None else self._grad_norm)
                if iteration and m == 0:
                    _maybe_die("update", iteration)
        t = max(1.0, sums.pop("tokens"))
        out = {k: v / t for k, v in sums.items()}
        out["grad_norm"] = float(np.mean(gnorms)) if gnorms else 0.0
        out["optimizer_steps"] = n_mb * cfg.ppo_epochs
        out["lr"] = float(self.actor.optimizer.param_groups[0]["lr"])
        if vcount:
            out["vf_loss"] = vsum / vcount
        return out

    def _micro_step(
        self, roll, adv, scored, returns, midx, tokens, weight, pad
    ) -> dict[str, float]:
        cfg = self.cfg
        b = pack(
            [roll.prompt_ids[i] for i in midx],
            [roll.response_ids[i] for i in midx],
            pad,
            self.device,
        )
        R = b.response_mask.shape[1]

        def stack(rows: list[torch.Tensor]) -> torch.Tensor:
            out = torch.zeros((len(midx), R), dtype=torch.float32)
            for j, i in enumerate(midx):
                out[j, : rows[i].shape[0]] = rows[i][:R]
            return out.to(self.device)

        mask = b.response_mask
        old = stack(scored["old"])
        a = torch.tensor(adv[midx], dtype=torch.float32, device=self.device)[:, None].expand(-1, R)
        begin_forward(self.actor)
        lp, ent = response_logprobs(self.actor.module, b, with_entropy=True)
        pg, clipped = policy_loss(lp, old, a, cfg.clip_ratio, cfg.dual_clip)
        loss = (pg * mask).sum()
        kl_sum = torch.zeros((), device=self.device)
        if self.ref is not None:
            kl = kl_k3(lp, stack(scored["ref"]))
            kl_sum = (kl * mask).sum()
            loss = loss + cfg.kl_coef * kl_sum
        ent_sum = (ent * mask).sum()
        loss = loss - cfg.entropy_coef * ent_sum
        # DeepSpeed divides by the accumulation steps; undo it so the mini-batch loss is a token mean.
        self.actor.backward(loss / tokens * self.grad_accum * weight)
        if self.actor.is_gradient_accumulation_boundary():
            # DeepSpeed records the norm only on its ZeRO/bf16 paths; read it here otherwise.
            self._grad_norm = grad_norm(self.actor.module)
        self.actor.step()
        pg, kl_sum, ent_sum = pg.detach(), kl_sum.detach(), ent_sum.detach()
        st = {
            "pg_loss": float((pg * mask).sum()) * weight,
            "kl": float(kl_sum) * weight,
            "entropy": float(ent_sum) * weight,
            "clip_frac": float((clipped * mask).sum()) * weight,
            "tokens": float(mask.sum()) * weight,
        }
        if self.critic is not None and returns is not None:
            v = self.critic(b)
            v_old = torch.stack([scored["values"][i] for i in midx]).to(self.device)
            ret = torch.tensor(returns[midx], dtype=torch.float32, device=self.device)
            vl = value_loss(v, v_old, ret, cfg.value_clip).mean()
            self.critic.backward(vl * weight)
            self.critic.step()
            st["vf_loss"] = float(vl.detach()) * weight
        return st

    def iteration(self, it: int) -> dict[str, Any]:
        """Run iteration ``it``; returns its metrics (merged over ranks on rank 0)."""
        cfg = self.cfg
        torch.manual_seed(cfg.seed * 1_000_003 + it * 1_009 + self.rank)
        t0 = time.perf_counter()
        roll = run_episodes(
            self.train_envs,
            self.engine,
            self.tok,
            self._tasks(it),
            cfg.group_size,
            cfg.temperature,
            cfg.top_p,
            cfg.max_response_tokens,
            cfg.max_prompt_tokens,
            cfg.max_steps,
            action_mode=cfg.action_mode,
        )
        t1 = time.perf_counter()
        scored = self._score(roll)
        t_score = time.perf_counter()
        est_cfg = cfg.estimator_config()
        values = None
        if cfg.use_critic:
            values = np.array([float(v) for v in scored["values"]], dtype=np.float64)
        res = compute_advantages(cfg.estimator, roll.step_batch(), est_cfg, values=values)
        adv = res.advantages
        t2 = time.perf_counter()
        truth = {}  # issue 14 hook: before the update, so the truth is of the rollout's weights
        if self.truth is not None and it % cfg.truth_every == 0:
            truth = self.truth.measure(roll, self.engine)
        t_truth = time.perf_counter()
        upd = self._update(roll, adv, scored, res.returns if cfg.use_critic else None, it)
        self.engine_sync()
        t3 = time.perf_counter()
        local = {
            "n_steps": len(roll),
            "adv_sum": float(adv.sum()),
            "adv_sq": float((adv**2).sum()),
            "reward": [
                float(sum(r for r, tr in zip(roll.reward, roll.traj, strict=True) if tr == i))
                for i in sorted(set(roll.traj))
            ],
            "success": roll.success,
            "score": roll.score,
            "length": roll.length,
            "invalid": int(np.sum(roll.invalid)),
            "gen_tokens": roll.gen_tokens,
            "gen_s": roll.gen_seconds,
            "env_s": roll.env_seconds,
            "lp_gap": logprob_gap(roll.engine_logprobs, scored["old"]),
            "levels": [
                (
                    d["level"],
                    d.get("utilisation", 0.0),
                    d.get("mean_group_size", 0.0),
                    d.get("n_groups", 0),
                )
                for d in res.diagnostics.get("levels", [])
            ],
            "upd": upd,
            "times": (t1 - t0, t2 - t_score, t3 - t_truth, t_score - t1),
        }
        parts = dist.gather(local)
        if self.rank != 0:
            return {}
        return {**merge_metrics(parts), **truth}

    # -- validation ----------------------------------------------------------------------------
    def validate(self) -> dict[str, float]:
        """Success (and WebShop score) on held-out tasks at the validation temperature."""
        cfg = self.cfg
        out: dict[str, float] = {}
        for split in val_splits(cfg.env):
            n = min(cfg.val_tasks, split_size(cfg, split))
            mine = list(range(n))[self.rank :: self.world]
            res = {"success": [], "score": [], "task_type": []}
            if mine:
                if split not in self.val_envs:
                    self.val_envs[split] = EnvSet(cfg, split, len(mine))
                roll = run_episodes(
                    self.val_envs[split],
                    self.engine,
                    self.tok,
                    mine,
                    1,
                    cfg.val_temperature,
                    1.0,
                    cfg.max_response_tokens,
                    cfg.max_prompt_tokens,
                    cfg.max_steps,
                    keep_samples=False,
                    action_mode=cfg.action_mode,
                )
                res = {"success": roll.success, "score": roll.score, "task_type": roll.task_type}
            parts = dist.gather(res)
            succ = [s for p in parts for s in p["success"]]
            score = [s for p in parts for s in p["score"]]
            types = [s for p in parts for s in p["task_type"]]
            out[f"val/{split}/success"] = float(np.mean(succ)) if succ else 0.0
            out[f"val/{split}/score"] = float(np.mean(score)) if score else 0.0
            out[f"val/{split}/tasks"] = len(succ)
            for tt in sorted(set(types)):
                sel = [s for s, t in zip(succ, types, strict=True) if t == tt]
                out[f"val/{split}/type/{tt}"] = float(np.mean(sel))
        return out

    # -- the loop ------------------------------------------------------------------------------
    def run(self) -> list[dict[str, Any]]:
        """Train from ``self.start`` to ``cfg.iterations``; returns the logged rows (rank 0)."""
        cfg = self.cfg
        rows: list[dict[str, Any]] = []
        bar = None
        if self.rank == 0 and cfg.progress:
            from tqdm import tqdm

            bar = tqdm(total=cfg.iterations, initial=self.start - 1, desc="hgpo.train", unit="it")
        try:
            for it in range(self.start, cfg.iterations + 1):
                m = self.iteration(it)
                last = it == cfg.iterations
                if cfg.val_every and (it % cfg.val_every == 0 or last):
                    t = time.perf_counter()
                    v = self.validate()
                    if self.rank == 0:
                        m.update(v)
                        m["time/validation"] = time.perf_counter() - t
                if self.rank == 0:
                    self.logger.log(it, m)
                    rows.append({"iteration": it, **m})
                    if bar is not None:
                        bar.update(1)
                        bar.set_postfix(
                            success=f"{m['success_rate']:.2f}", reward=f"{m['reward_mean']:.2f}"
                        )
                if (cfg.save_every and it % cfg.save_every == 0) or last:
                    self._save(it)
        finally:
            if bar is not None:
                bar.close()
        return rows

    def close(self) -> None:
        """Stop env workers and close the logger."""
        self.train_envs.close()
        for e in self.val_envs.values():
            e.close()
        if self.logger is not None:
            self.logger.close()
        close = getattr(self.engine, "close", None)
        if close is not None:
            close()


def merge_metrics(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """Combine the ranks' raw figures into the iteration's metrics."""
    n = sum(p["n_steps"] for p in parts)
    cat = lambda key: [x for p in parts for x in p[key]]  # noqa: E731
    adv_mean = sum(p["adv_sum"] for p in parts) / max(1, n)
    adv_var = sum(p["adv_sq"] for p in parts) / max(1, n) - adv_mean**2
    rollout_s = max(p["times"][0] for p in parts)
    gen_tokens = sum(p["gen_tokens"] for p in parts)
    m: dict[str, Any] = {
        "adv_mean": adv_mean,
        "adv_std": math.sqrt(max(0.0, adv_var)),
        "reward_mean": float(np.mean(cat("reward"))) if cat("reward") else 0.0,
        "success_rate": float(np.mean(cat("success"))) if cat("success") else 0.0,
        "score_mean": float(np.mean(cat("score"))) if cat("score") else 0.0,
        "episode_length": float(np.mean(cat("length"))) if cat("length") else 0.0,
        "invalid_rate": sum(p["invalid"] for p in parts) / max(1, n),
        "n_steps": n,
        "n_trajectories": len(cat("success")),
        "gen_tokens": gen_tokens,
        "tokens_per_s": gen_tokens / max(1e-9, max(p["gen_s"] for p in parts)),
        "time/rollout": rollout_s,
        "time/generate": max(p["gen_s"] for p in parts),
        "time/env": max(p["env_s"] for p in parts),
        "time/advantage": max(p["times"][1] for p in parts),
        "time/update": max(p["times"][2] for p in parts),
        "time/score": max(p["times"][3] for p in parts),
    }
    gap_n = sum(p["lp_gap"][1] for p in parts)
    if gap_n:  # the rollout engine's log-probs (vLLM) against the trainer's: the sync check
        m["rollout/logprob_diff_mean"] = sum(p["lp_gap"][0] for p in parts) / gap_n
        m["rollout/logprob_diff_max"] = max(p["lp_gap"][2] for p in parts)
    upd = [p["upd"] for p in parts]
    for k in upd[0]:
        m[k] = float(np.mean([u[k] for u in upd]))
    by_level: dict[str, list[tuple[float, float, float]]] = {}
    for p in parts:
        for name, util, size, groups in p["levels"]:
            by_level.setdefault(name, []).append((util * p["n_steps"], size * groups, groups))
    for name, rows in by_level.items():
        m[f"level{name}/utilisation"] = sum(r[0] for r in rows) / max(1, n)
        g = sum(r[2] for r in rows)
        m[f"level{name}/mean_group_size"] = sum(r[1] for r in rows) / max(1, g)
        m[f"level{name}/n_groups"] = g
    return m


def train(cfg: TrainConfig) -> list[dict[str, Any]]:
    """Run ``cfg`` end to end; returns the metrics rows (on rank 0; [] elsewhere)."""
    trainer = Trainer(cfg)
    try:
        return trainer.run()
    finally:
        trainer.close()
