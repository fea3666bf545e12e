"""--lora-top-layers K: adapters only in the last K decoder layers; the layers below them run
without a graph (the update's saving), and the adapted layers' gradients are those of LoRA on
every layer where the lower adapters are still zero; the memory plan counts K layers; a run
checkpoints the adapters and merges them."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch

from hgpo.train.lora import adapted_layers, add_adapters, layer_index, max_rank

LAYERS = 4


def _lora(top: int) -> SimpleNamespace:
    return SimpleNamespace(
        lora_rank=4,
        lora_alpha=8.0,
        lora_dropout=0.0,
        lora_targets="all-linear",
        lora_top_layers=top,
    )


@pytest.fixture(scope="module")
def base():
    from transformers import AutoModelForCausalLM

    from hgpo.train.tiny import tiny_config

    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(tiny_config(64, hidden=64, layers=LAYERS)).float()


def _trainable(model) -> list[str]:
    return [n for n, p in model.named_parameters() if p.requires_grad]


def test_adapters_are_in_every_linear_layer_of_the_last_k_layers_only(base):
    every = add_adapters(copy.deepcopy(base), _lora(0))
    top = add_adapters(copy.deepcopy(base), _lora(2))
    per_layer = 7 * 2  # q k v o gate up down, A and B each
    assert len(_trainable(every)) == LAYERS * per_layer
    assert len(_trainable(top)) == 2 * per_layer
    assert {layer_index(n) for n in _trainable(top)} == {2, 3}
    assert set(_trainable(top)) == {n for n in _trainable(every) if layer_index(n) in (2, 3)}


def test_the_layers_below_run_without_a_graph_and_the_gradients_are_lora_on_every_layer(base):
    torch.manual_seed(1)
    every = add_adapters(copy.deepcopy(base), _lora(0))
    top = add_adapters(copy.deepcopy(base), _lora(2))
    with torch.no_grad():  # the same adapters in layers 2 and 3; B != 0 so they act
        for n, p in every.named_parameters():
            if "lora_B" in n and layer_index(n) in (2, 3):
                p.normal_(0, 0.3)
        mine = dict(top.named_parameters())
        for n, p in every.named_parameters():
            if n in mine:
                mine[n].copy_(p)
    ids = torch.tensor([[3, 5, 7, 9, 11, 13], [2, 4, 6, 8, 10, 12]])
    out_every = every(input_ids=ids, output_hidden_states=True)
    out_top = top(input_ids=ids, output_hidden_states=True)
    # hidden_states[i] is layer i's input (the last: the final norm's output): with K = 2
    # nothing up to layer 2's input needs a gradient
    assert [h.requires_grad for h in out_top.hidden_states] == [False, False, False, True, True]
    assert all(h.requires_grad for h in out_every.hidden_states[1:])
    assert torch.allclose(out_top.logits, out_every.logits, atol=1e-6)
    out_every.logits.log_softmax(-1)[:, :, 7].sum().backward()
    out_top.logits.log_softmax(-1)[:, :, 7].sum().backward()
    grads = {n: p.grad for n, p in every.named_parameters() if p.requires_grad}
    for n, p in top.named_parameters():
        if p.requires_grad:
            assert torch.allclose(p.grad, grads[n], atol=1e-6), n
    assert any(g.abs().max() > 0 for n, g in grads.items() if layer_index(n) in (0, 1))


def test_rank_and_targets_are_read_in_the_last_k_layers(base):
    with torch.device("meta"):
        skeleton = copy.deepcopy(base).to("meta")
    assert {layer_index(k) for k in adapted_layers(skeleton, "q_proj", 1)} == {LAYERS - 1}
    assert max_rank(skeleton, "all-linear", 2)[1].startswith(f"model.layers.{LAYERS - 2}.")
    with pytest.raises(ValueError, match=r"lora_top_layers: must be in \[1, 4\] .* got 5"):
        adapted_layers(skeleton, "all-linear", 5)
    with pytest.raises(ValueError, match="adapts no layer of the model in its last 2 decoder"):
        max_rank(skeleton, "embed_tokens", 2)


def test_the_memory_plan_counts_the_adapted_layers_only():
    from hgpo.train.memory_plan import plan_for_config
    from hgpo.train.train_config import resolve

    def items(**over):
        cfg = resolve("toy:tmaze:length=1", "smol-cpu", {"out_dir": "/tmp/unused", **over})
        plan = plan_for_config(cfg, "smol-cpu")
        return plan, {i.name: i.bytes for i in plan.items}

    plan30, every = items()
    plan8, top = items(lora_top_layers=8)
    assert top["activations"] * 30 == every["activations"] * 8
    assert top["optimizer"] * 30 == every["optimizer"] * 8  # AdamW's states: adapters only
    assert "LoRA rank 8, last 8 layers" in plan8.render()
    assert "last" not in plan30.render()


def test_a_run_trains_the_last_layer_only_and_its_merged_model_equals_the_adapters(tmp_path):
    """The trainer end to end (tiny model, 2 layers, --lora-top-layers 1): the checkpoint's
    adapters lie in layer 1 only, hf_model/ equals base + adapters, and layer 0's weights are
    the base model's."""
    import json

    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from hgpo.train.model import pack, response_logprobs
    from hgpo.train.run_metrics import read_metrics
    from tests.train.conftest import run_cli

    out = tmp_path / "run"
    args = ["--preset", "tiny", "--env", "webshop", "--lora-rank", "4", "--lora-top-layers", "1",
            "--val-every", "0", "--iterations", "2", "--out-dir", str(out)]  # fmt: skip
    r = run_cli(args)
    assert r.returncode == 0, r.stderr[-5000:]
    assert read_metrics(out)[-1]["grad_norm"] > 0
    ck = out / "checkpoints" / "iter_000002"
    assert json.loads((ck / "adapter" / "adapter_config.json").read_text())[
        "layers_to_transform"
    ] == [1]

    def load(path):
        return AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()

    base, merged = load(out / "tiny_model"), load(ck / "hf_model")
    adapted = PeftModel.from_pretrained(load(out / "tiny_model"), str(ck / "adapter")).eval()
    batch = pack([[5, 6, 7, 8], [9, 10]], [[11, 12, 13], [14]], 0, "cpu")
    with torch.no_grad():
        want = response_logprobs(adapted, batch)[0]
        assert torch.allclose(response_logprobs(merged, batch)[0], want, atol=1e-5)
    b, m = dict(base.named_parameters()), dict(merged.named_parameters())
    assert all(torch.equal(b[n], m[n]) for n in b if layer_index(n) != 1)
    assert any(not torch.equal(b[n], m[n]) for n in b if layer_index(n) == 1)
