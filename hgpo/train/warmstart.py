"""Supervised warm start on the environments' expert trajectories (for the CPU learning demo).

``python -m hgpo.train.warmstart --env webshop --tasks 8 --epochs 3 --out runs/warm`` replays the
scripted expert (WebShop ``expert_actions``, ALFWorld ``run_expert``, a toy POMDP's shortest
plan) on the first ``--tasks`` training tasks through the trainer's own prompt path (memory
module + paper template + chat template), and fine-tunes a model on the responses
``<think>...</think><action>{a}</action>`` (cross-entropy on the response tokens only). The
result is a model folder for ``--model``. With ``--model tiny`` a tiny model and tokenizer are
built first (as the trainer does); ``--model smollm2-135m`` fine-tunes the real SmolLM2 (its
converted cache folder, docs/real_model.md).

``--eval-tasks N`` also plays ``--eval-repeats`` free-text (generate-mode) episodes of each of
the first N tasks of ``--eval-split`` (default: the benchmark's first held-out split) before and
after the fine-tuning, and prints the valid-step and success counts with 95% Wilson intervals.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from agentenvs.registry import BENCHMARKS, benchmark
from hgpo.atomic import atomic_write_text
from hgpo.extras import exit_on_missing_extras
from hgpo.options import ArgumentParser, bad, check_int, check_number, check_writable_dir
from hgpo.train.envs import TRAIN_SPLIT, EnvSet, split_size, val_splits
from hgpo.train.logs import configure_logging
from hgpo.train.tiny import build_tiny
from hgpo.train.train_config import TINY_MODEL, TrainConfig, parse_options, resolve
from hgpo.train.warm_eval import evaluate, table

log = logging.getLogger(__name__)

THINK = "<think>I follow the plan.</think>"

EXPERT_ENVS = tuple(
    sorted((b.usage or n for n, b in BENCHMARKS.items() if b.expert_plans), reverse=True)
)
"""The benchmarks with a scripted expert, as ``--env`` names them (reverse name order, so that
--help lists webshop, the default, first, as it always has)."""


def expert_plans(cfg: TrainConfig, tasks: list[int]) -> list[list[str]]:
    """The scripted expert's actions for each training task (``Benchmark.expert_plans``)."""
    plans = benchmark(cfg.env).expert_plans
    if plans is None:
        raise bad("--env", "a benchmark with a scripted expert: " + ", ".join(EXPERT_ENVS), cfg.env)
    return plans(cfg, tasks)


def check_env(env: str) -> None:
    """A named error for an ``--env`` that is no benchmark, or one without a scripted expert
    (before any work)."""
    found = benchmark(env, "--env")
    if found.expert_plans is None:
        raise bad("--env", "a benchmark with a scripted expert: " + ", ".join(EXPERT_ENVS), env)
    found.check(env, "--env")


def expert_samples(
    cfg: TrainConfig, tok, tasks: list[int], plans: list[list[str]] | None = None
) -> tuple[list[tuple[list[int], list[int]]], float]:
    """(prompt ids, response ids) of every expert step, and the experts' success rate.
    ``plans``: the expert's actions of each task (default: :func:`expert_plans`)."""
    from hgpo.train.model import encode_prompt

    plans = expert_plans(cfg, tasks) if plans is None else plans
    envs = EnvSet(cfg, TRAIN_SPLIT, len(tasks))
    try:
        obs, infos = envs.reset(tasks, 1)
        samples = []
        won = np.zeros(len(tasks), dtype=bool)
        for step in range(max(len(p) for p in plans)):
            actions = [""] * len(tasks)
            for i, plan in enumerate(plans):
                if step >= len(plan) or envs.done(i):
                    continue
                text = envs.prompt(i, obs[i], infos[i])
                prompt = encode_prompt(tok, text, cfg.max_prompt_tokens, cfg.enable_thinking)
                text = f"{THINK}<action>{plan[step]}</action>"
                resp = tok(text, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
                samples.append((prompt, resp))
                envs.remember(i, obs[i], plan[step])
                actions[i] = plan[step]
            obs, _, _, infos = envs.step(actions)
            won |= np.array([bool(x.get("won")) for x in infos])
    finally:
        envs.close()
    return samples, float(won.mean())


def finetune(
    model,
    samples,
    epochs: int,
    lr: float,
    batch: int,
    pad_id: int,
    seed: int,
    on_epoch=None,
    micro_batch: int = 0,
) -> list[float]:
    """Cross-entropy on the response tokens; returns the mean loss of each epoch.

    Each optimizer step takes ``batch`` samples; their forward and backward run ``micro_batch``
    samples at a time (0: all at once), the gradients summed, so the step is the same (to
    float32 rounding) and the peak memory scales with ``micro_batch``.
    on_epoch: optional callable(epoch, model) run after each epoch (saving snapshots).
    Raises NonFiniteError at a non-finite loss, or weights after an epoch, before ``on_epoch``.
    """
    import torch

    from hgpo.train.trainer import NonFiniteError

    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    rng = np.random.default_rng(seed)
    model.train()
    losses = []
    for _ in range(epochs):
        perm, tot = rng.permutation(len(samples)), []
        for s in range(0, len(perm), batch):
            chunk = [samples[i] for i in perm[s : s + batch]]
            opt.zero_grad()
            loss = _backward(model, chunk, pad_id, micro_batch or len(chunk))
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            tot.append(loss)
            if not np.isfinite(tot[-1]):  # before any snapshot or model is written
                raise NonFiniteError(
                    f"warm start epoch {len(losses) + 1}: the loss is {tot[-1]} (lower --lr?); "
                    "nothing more saved"
                )
        if not all(bool(torch.isfinite(w).all()) for w in model.parameters()):
            raise NonFiniteError(
                f"warm start epoch {len(losses) + 1}: a weight is not finite after the last step "
                "(lower --lr?); nothing more saved"
            )
        losses.append(float(np.mean(tot)))
        log.info("warm start epoch %d: loss %.4f", len(losses), losses[-1])
        if on_epoch is not None:
            on_epoch(len(losses), model)
    return losses


def _backward(model, chunk, pad_id: int, micro: int) -> float:
    """Accumulate the gradient of the mean response-token cross-entropy of ``chunk`` (one
    optimizer step's samples), ``micro`` samples per forward; returns the loss."""
    from hgpo.train.model import pack, response_logprobs

    tokens = sum(len(c[1]) for c in chunk)
    total = 0.0
    for m in range(0, len(chunk), micro):
        part = chunk[m : m + micro]
        b = pack([c[0] for c in part], [c[1] for c in part], pad_id, "cpu")
        lp, _ = response_logprobs(model, b)
        loss = -(lp * b.response_mask).sum() / tokens
        loss.backward()
        total += float(loss.detach())
    return total


def check_args(args: argparse.Namespace) -> set[int]:
    """Named errors for ``--env``, the numeric flags, an unwritable ``--out`` and a ``--model``
    that is neither a model folder nor in the Hugging Face cache, before any work; the epochs of
    ``--save-epochs``."""
    check_env(args.env)
    check_int("--tasks", args.tasks, lo=1)
    check_int("--epochs", args.epochs, lo=1)
    check_number("--lr", args.lr, lo=0.0, lo_open=True)
    check_int("--batch", args.batch, lo=1)
    check_int("--micro-batch", args.micro_batch, lo=0, hi=args.batch)
    check_int("--eval-tasks", args.eval_tasks, lo=0)
    check_int("--eval-repeats", args.eval_repeats, lo=1, hi=1024)
    snapshots = set()
    for item in filter(None, (x.strip() for x in args.save_epochs.split(","))):
        if not item.isdigit() or not 1 <= int(item) <= args.epochs:
            raise bad("--save-epochs", f"comma-separated epochs in 1..{args.epochs}", item)
        snapshots.add(int(item))
    check_writable_dir("--out", args.out, "--out")
    if args.model != TINY_MODEL:
        from hgpo.train.model import check_model

        check_model(args.model, "--model")
    return snapshots


def _parser() -> argparse.ArgumentParser:
    ap = ArgumentParser(
        prog="python -m hgpo.train.warmstart",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--env", default="webshop", help="one of: " + ", ".join(EXPERT_ENVS))
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--model", default=TINY_MODEL)
    ap.add_argument("--tasks", type=int, default=8, help="the first N training tasks")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--batch", type=int, default=8, help="samples per optimizer step")
    ap.add_argument(
        "--micro-batch",
        type=int,
        default=0,
        help="samples per forward and backward, gradients summed over the --batch (0: the whole "
        "batch at once); bounds the memory: long prompts (ALFWorld, WebShop) need 1-2 on 23 GiB",
    )
    ap.add_argument("--out", default="runs/warm")
    ap.add_argument(
        "--save-epochs", default="", help="also save model_e{N} after these epochs, e.g. 4,8"
    )
    ap.add_argument(
        "--override",
        action="append",
        default=[],
        help="TrainConfig field=value (the same as the RL run's, e.g. max_prompt_tokens=1024)",
    )
    ap.add_argument(
        "--eval-tasks",
        type=int,
        default=0,
        help="evaluate generate mode on the first N tasks of --eval-split before and after (0: no)",
    )
    ap.add_argument("--eval-repeats", type=int, default=1, help="episodes per evaluated task")
    ap.add_argument(
        "--eval-before",
        choices=("yes", "no"),
        default="yes",
        help="no: evaluate only after (the base model's figures do not depend on the fine-tuning)",
    )
    ap.add_argument(
        "--eval-split",
        default="",
        help="the split evaluated (default: the benchmark's first held-out split with tasks, "
        "else the training split)",
    )
    return ap


def _config(args: argparse.Namespace) -> tuple[TrainConfig, str]:
    """The RL run's config of these flags (named errors), ``--tasks`` within its training
    tasks; the evaluated split (``--eval-tasks`` within its tasks)."""
    overrides = parse_options(",".join(args.override), where="--override")
    cfg = resolve(
        args.env, args.preset, {"model": args.model, "out_dir": str(Path(args.out)), **overrides}
    )
    n_train = split_size(cfg, TRAIN_SPLIT)
    if args.tasks > n_train:
        raise bad("--tasks", f"an integer in 1..{n_train} (the training tasks)", args.tasks)
    splits = (*val_splits(cfg.env), TRAIN_SPLIT)
    split = args.eval_split or next(s for s in splits if split_size(cfg, s) > 0)
    if split not in splits:
        raise bad("--eval-split", "one of " + ", ".join(splits), split)
    n_eval = split_size(cfg, split)
    if args.eval_tasks > n_eval:
        raise bad("--eval-tasks", f"an integer in 0..{n_eval} (the {split} tasks)", args.eval_tasks)
    return cfg, split


def _initial_model(cfg: TrainConfig, out: Path) -> str:
    """The folder of the model to fine-tune: ``--model`` (a named or GGUF model: its converted
    cache folder), or a tiny model built as the trainer builds it (under ``out/init``)."""
    if cfg.model != TINY_MODEL:
        from hgpo.train.pretrained import model_folder

        return model_folder(cfg.model, "--model")
    from hgpo.train.trainer import tiny_corpus

    return str(
        build_tiny(
            out / "init", tiny_corpus(cfg.env), cfg.tiny_vocab, cfg.tiny_hidden, cfg.tiny_layers,
            cfg.seed, arch=cfg.tiny_arch,
        )
    )  # fmt: skip


def _machine() -> dict[str, Any]:
    """Peak RSS of this process and the load average now (the report's machine figures)."""
    import os
    import resource

    return {
        "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
        "load_average": list(os.getloadavg()),
        "cpus": os.cpu_count(),
    }


def main(argv: list[str] | None = None) -> int:
    """Command line: collect the expert samples, (evaluate,) fine-tune, (evaluate,) save."""
    ap = _parser()
    args = ap.parse_args(argv)
    try:
        snapshots = check_args(args)
        cfg, split = _config(args)
    except ValueError as e:
        ap.error(str(e))
    extras = ("llm", *benchmark(cfg.env).extras)
    exit_on_missing_extras(f"python -m hgpo.train.warmstart --env {cfg.env}", *extras)
    try:  # a toy spec with slip has no expert: refused here, before the model is loaded
        plans = expert_plans(cfg, list(range(args.tasks)))
    except ValueError as e:
        ap.error(str(e))
    configure_logging(rank0=True, fmt="%(asctime)s %(message)s")
    import torch
    from transformers import AutoModelForCausalLM

    from hgpo.train.model import check_thinking_switch, load_tokenizer
    from hgpo.train.trainer import NonFiniteError

    out = Path(args.out)
    path = _initial_model(cfg, out)
    torch.manual_seed(cfg.seed)
    tok = load_tokenizer(path)
    check_thinking_switch(tok, cfg.enable_thinking)
    t0 = time.perf_counter()
    samples, expert_success = expert_samples(cfg, tok, list(range(args.tasks)), plans)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    report: dict[str, Any] = {"machine_start": _machine()}
    before = None
    if args.eval_tasks and args.eval_before == "yes":
        before = evaluate(cfg, model, tok, split, args.eval_tasks, args.eval_repeats)
        log.info("before the warm start: %s", before)

    def save(m: Any, name: str) -> None:
        m.save_pretrained(str(out / name))
        tok.save_pretrained(str(out / name))

    def snapshot(epoch: int, m: Any) -> None:
        if epoch in snapshots:
            save(m, f"model_e{epoch}")

    t1 = time.perf_counter()
    try:
        losses = finetune(
            model, samples, args.epochs, args.lr, args.batch, tok.pad_token_id, cfg.seed, snapshot,
            args.micro_batch,
        )  # fmt: skip
    except NonFiniteError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    train_s = time.perf_counter() - t1
    save(model, "model")
    report.update(
        samples=len(samples), expert_success=expert_success, epoch_losses=losses,
        finetune_seconds=train_s, model=str(out / "model"),
    )  # fmt: skip
    if args.eval_tasks:
        after = evaluate(cfg, model, tok, split, args.eval_tasks, args.eval_repeats)
        log.info("after the warm start: %s", after)
        report["eval"] = {"before": before and before.as_dict(), "after": after.as_dict()}
        report["eval_table"] = table(cfg.env, before, after)
    report.update(seconds=time.perf_counter() - t0, machine_end=_machine())
    atomic_write_text(out / "warmstart.json", json.dumps(report, indent=2) + "\n")
    if args.eval_tasks:
        print(report["eval_table"])
    shown = {k: v for k, v in report.items() if k not in ("eval_table", "eval")}  # long
    print(json.dumps(shown))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
