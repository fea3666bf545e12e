"""vLLM rollout engine: log-probs match the trainer's after a weight sync (tied and untied
embeddings). Needs a CUDA GPU and the ``[gpu]`` extra; skipped with the reason otherwise."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU (vLLM rollout engine)", allow_module_level=True)
vllm = pytest.importorskip("vllm", reason="needs vllm (pip install -e .[gpu])")


@pytest.mark.parametrize("tied", [True, False])
def test_vllm_logprobs_match_trainer_after_sync(tmp_path, tied):
    from hgpo.train.config import resolve
    from hgpo.train.model import encode_prompt, load_tokenizer, pack, response_logprobs
    from hgpo.train.tiny import tiny_model, train_tokenizer
    from hgpo.train.vllm_engine import VLLMEngine

    tok = train_tokenizer(tmp_path, ["go to fridge 1", "open drawer 2"], 512)
    model = tiny_model(len(tok), hidden=128, layers=2, tie_embeddings=tied)
    model.config.eos_token_id = tok.convert_tokens_to_ids("<|im_end|>")
    model.save_pretrained(str(tmp_path))
    tok = load_tokenizer(str(tmp_path))
    model = model.to("cuda", torch.bfloat16).eval()
    cfg = resolve(preset="tiny", overrides={"max_prompt_tokens": 256, "max_response_tokens": 16})
    eng = VLLMEngine(str(tmp_path), tok, cfg, model)
    # a training step changes every weight: the engine must follow
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    eng.sync(model)
    prompts = [encode_prompt(tok, f"task {i}: go to fridge {i}", 256) for i in range(8)]
    ids, lps = eng.logprobs(prompts, 16)
    b = pack(prompts, ids, tok.pad_token_id, "cuda")
    with torch.no_grad():
        ours, _ = response_logprobs(model, b)
    diffs = [
        (ours[i, : len(r)].float().cpu() - torch.tensor(lps[i])).abs().max().item()
        for i, r in enumerate(ids)
    ]
    assert max(diffs) < 0.1, diffs  # bf16 on both sides; a stale layer gives errors of order 1
