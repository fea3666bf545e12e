"""Prompts per second of the exact truth's scoring: HFEngine.score (one prompt at a time)
against hgpo.train.batched_score (prompts batched by length, shared prefixes computed once).

    python -m benchmarks.bench_truth            # the whole chain of keydoor 4x4, K = 2
    python -m benchmarks.bench_truth --quick    # every 8th prompt of it
    python -m benchmarks.bench_truth --quick --threads 2 --new-only

The chain is the one ``--truth-every`` scores for ``--env`` with ``--history-length`` and
``--max-steps`` (keydoor 4x4, K = 2, horizon 20: 4,757 prompts x 5 actions), the model the
trainer's ``--preset tiny`` builds (a 2-layer Qwen2, hidden 64, a 1,024-token BPE trained on
the env's text), float32 on the CPU with ``--threads`` torch threads. Each scorer gets the
same (prompt, action response) pairs, in the order the truth pass sends them (by prompt
length, then tokens); the figures are compared (max |difference| of the summed log-probs).
Printed per scorer: prompts per wall-second and per CPU-second of this process
(``time.process_time``), and the load average before and after: the machine may be shared.
"""

from __future__ import annotations

import os
import tempfile
import time

from hgpo.options import ArgumentParser


def _parser() -> ArgumentParser:
    p = ArgumentParser(prog="python -m benchmarks.bench_truth", description=__doc__.split("\n")[0])
    p.add_argument("--env", default="toy:keydoor:size=4", help="a toy env spec")
    p.add_argument("--history-length", type=int, default=2, help="K of the prompts")
    p.add_argument("--max-steps", type=int, default=20, help="the chain runs to this horizon")
    p.add_argument("--quick", action="store_true", help="every 8th prompt of the chain only")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    p.add_argument("--new-only", action="store_true", help="time the new scorer only")
    return p


def _timed(fn) -> tuple[object, float, float]:
    """(fn(), wall seconds, CPU seconds of this process)."""
    w, c = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - w, time.process_time() - c


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.threads < 1:
        _parser().error(f"--threads: must be >= 1, got {args.threads}")
    import numpy as np
    import torch

    from hgpo.train.hf_engine import HFEngine
    from hgpo.train.model import load_causal_lm, load_tokenizer
    from hgpo.train.tiny import build_tiny
    from hgpo.train.train_config import TrainConfig
    from hgpo.train.trainer import tiny_corpus
    from hgpo.train.truth_monitor import TruthMonitor

    torch.set_num_threads(args.threads)
    cfg = TrainConfig(env=args.env, action_mode="score", history_length=args.history_length,
                      max_steps=args.max_steps, truth_every=1, max_prompt_tokens=512,
                      env_workers=1, progress=False)  # fmt: skip  # the tiny preset's 512
    load0 = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        path = str(build_tiny(f"{tmp}/tiny", tiny_corpus(cfg.env), 1024, 64, 2, 0))
        tok = load_tokenizer(path)
        model = load_causal_lm(path, torch.float32, torch.device("cpu")).eval()
    engine = HFEngine(model, tok, 64, torch.device("cpu"))
    mon = TruthMonitor(cfg, tok)
    _, enc_s, _ = _timed(mon.prompt_ids)
    pairs: dict[str, list] = {"p": [], "r": []}

    def record(p, r):
        pairs["p"] += p
        pairs["r"] += r
        return [0.0] * len(p)

    mon.policy_table(record)  # the pairs in the truth pass's order
    A = mon.env.n_actions
    step = 8 if args.quick else 1
    keep = [i for k in range(0, len(pairs["p"]) // A, step) for i in range(k * A, (k + 1) * A)]
    P, R = [pairs["p"][i] for i in keep], [pairs["r"][i] for i in keep]
    n = len(P) // A
    print(f"chain {cfg.env} K={cfg.history_length} horizon {mon.env.horizon}: "
          f"{mon.row_code.size:,} prompts x {A} actions; scoring {n:,} of them "
          f"(prompts of {min(map(len, P))}-{max(map(len, P))} tokens), {args.threads} torch "
          f"thread(s); encoding all prompts took {enc_s:.1f} s")  # fmt: skip
    print(f"load average before: {load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f} "
          f"({os.cpu_count()} CPUs)")  # fmt: skip
    new, new_w, new_c = _timed(lambda: engine.score_batched(P, R))
    if args.new_only:
        print(f"batched_score (new)    {n / new_w:8.1f} prompts/s wall ({new_w:6.1f} s)   "
              f"{n / new_c:8.1f} prompts/CPU-s ({new_c:6.1f} s)")  # fmt: skip
        load1 = os.getloadavg()
        print(f"load average after: {load1[0]:.2f} {load1[1]:.2f} {load1[2]:.2f}")
        return 0
    old, old_w, old_c = _timed(lambda: engine.score(P, R))
    diff = float(np.max(np.abs(np.asarray(old) - np.asarray(new))))
    for name, w, c in (("HFEngine.score (old)", old_w, old_c), ("batched_score (new)", new_w,
                                                                   new_c)):  # fmt: skip
        print(f"{name:22s} {n / w:8.1f} prompts/s wall ({w:6.1f} s)   {n / c:8.1f} prompts/"
              f"CPU-s ({c:6.1f} s)")  # fmt: skip
    print(f"speed-up: {old_w / new_w:.2f}x wall, {old_c / new_c:.2f}x CPU;  max |old - new| = "
          f"{diff:.2e} (summed log-probs up to {float(np.max(np.abs(old))):.0f})")  # fmt: skip
    full = mon.row_code.size / (n / new_w)
    print(f"a whole pass ({mon.row_code.size:,} prompts) at the new rate: about {full:.0f} s "
          f"scoring + {enc_s:.0f} s encoding")  # fmt: skip
    load1 = os.getloadavg()
    print(f"load average after: {load1[0]:.2f} {load1[1]:.2f} {load1[2]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
