"""LoRA (--lora-rank): the reference is the base model with the adapters off, merged weights
equal the adapted model, checkpoints hold the adapters, runs at ZeRO 0 and 2, resume."""

from __future__ import annotations

import subprocess
from types import SimpleNamespace

import pytest
import torch

from hgpo.train.lora import add_adapters, merged_named_parameters
from hgpo.train.model import load_named, pack, response_logprobs
from hgpo.train.run_metrics import read_metrics
from hgpo.train.tiny import build_tiny
from tests.train.conftest import run_cli

LORA = SimpleNamespace(
    lora_rank=4, lora_alpha=8.0, lora_dropout=0.0, lora_targets="all-linear", lora_top_layers=0
)


def _ok(r: subprocess.CompletedProcess) -> None:
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stderr[-5000:]}"


def _load(path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()


def _logprobs(model, batch):
    with torch.no_grad():
        return response_logprobs(model, batch)[0]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = build_tiny(tmp_path_factory.mktemp("lora") / "m", ["go to fridge 1, open it"], 400)
    batch = pack([[5, 6, 7, 8], [9, 10]], [[11, 12, 13], [14]], 0, "cpu")
    return path, batch


def test_reference_is_the_base_model_and_merged_weights_equal_the_adapters(tiny):
    path, batch = tiny
    torch.manual_seed(0)
    model = add_adapters(_load(path), LORA)
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    with torch.no_grad():  # B = 0 at the start; make the adapters do something
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.5)
    base = _logprobs(_load(path), batch)
    adapted = _logprobs(model, batch)
    with model.disable_adapter():
        off = _logprobs(model, batch)
    assert torch.allclose(off, base, atol=1e-6)  # the reference: no second copy needed
    assert (adapted - base).abs().max() > 1e-3
    merged = _load(path)
    load_named(merged, merged_named_parameters(model))
    assert torch.allclose(_logprobs(merged, batch), adapted, atol=1e-5)


def _run(out, stage, iterations, *extra):
    args = ["--preset", "tiny", "--env", "webshop", "--lora-rank", "4", "--val-every", "0"]
    args += ["--zero-stage", str(stage), "--iterations", str(iterations), "--out-dir", str(out)]
    _ok(run_cli([*args, *extra]))
    return read_metrics(out)


@pytest.mark.parametrize("stage", [0, 2])
def test_lora_run_checkpoints_adapters_and_a_merged_model(stage, tmp_path, tiny):
    from peft import PeftModel

    _, batch = tiny
    out = tmp_path / f"zero{stage}"
    rows = _run(out, stage, 2)
    assert rows[-1]["kl"] > 0 and rows[-1]["grad_norm"] > 0
    ck = out / "checkpoints" / "iter_000002"
    # the DeepSpeed checkpoint leaves the frozen base out (DeepSpeed keeps the tied head)
    states = next((ck / "actor").glob("mp_rank_00_model_states.pt"))
    module = torch.load(states, map_location="cpu", weights_only=False)["module"]
    assert module and all("lora_" in k or k.endswith("lm_head.weight") for k in module)
    # hf_model/ is the base model with the adapters merged in
    adapted = PeftModel.from_pretrained(_load(out / "tiny_model"), str(ck / "adapter")).eval()
    want = _logprobs(adapted, batch)
    assert torch.allclose(_logprobs(_load(ck / "hf_model"), batch), want, atol=1e-5)
    assert not torch.allclose(_logprobs(_load(out / "tiny_model"), batch), want, atol=1e-5)


def test_lora_resume_ends_where_a_straight_run_ends(tmp_path):
    straight = _run(tmp_path / "straight", 2, 3)
    _run(tmp_path / "resumed", 2, 2)
    resumed = _run(tmp_path / "resumed", 2, 3, "--resume")
    assert [r["iteration"] for r in resumed] == [1, 2, 3]
    for k in ("pg_loss", "kl", "entropy", "grad_norm", "adv_mean"):
        assert resumed[-1][k] == pytest.approx(straight[-1][k], rel=1e-6, abs=1e-9), k


def test_targets_are_checked_name_by_name_on_a_meta_skeleton():
    """peft drops a name that matches nothing when another name matches: the preflight check
    names it. GPT-2's linear layers are transformers' Conv1D, which LoRA wraps too."""
    from transformers import AutoModelForCausalLM, GPT2Config

    from hgpo.train.lora import check_targets
    from hgpo.train.tiny import tiny_config

    with torch.device("meta"):
        qwen = AutoModelForCausalLM.from_config(tiny_config(100, arch="qwen3"))
        gpt2 = AutoModelForCausalLM.from_config(GPT2Config(n_layer=1, n_embd=64, n_head=2))
    check_targets(qwen, "all-linear")
    check_targets(qwen, "q_proj, v_proj")
    check_targets(gpt2, "c_attn,c_proj")
    with pytest.raises(ValueError, match="'v_prj' matches no module of the model; the layers"):
        check_targets(qwen, "q_proj,v_prj")
    with pytest.raises(ValueError, match="'self_attn' names a Qwen3Attention, which LoRA cannot"):
        check_targets(qwen, "self_attn")
