"""Qwen3: the tiny Qwen3 model and tokenizer (``--tiny-arch qwen3``), the chat template's thinking
switch (``--enable-thinking``), loading a Qwen3 model folder by path, the Qwen3 presets, and the
loop end to end on a CPU. The real Qwen3 checkpoints cannot be downloaded here; a tiny Qwen3 saved
to a folder stands in for them (same architecture class, same tokenizer conventions)."""

from __future__ import annotations

import json

import pytest
import torch

from hgpo.train.model import (
    Critic,
    check_model,
    check_thinking_switch,
    encode_prompt,
    gathered_named_parameters,
    load_causal_lm,
    load_tokenizer,
    save_hf_model,
)
from hgpo.train.run_metrics import read_metrics
from hgpo.train.tiny import build_tiny
from hgpo.train.train_config import PRESETS, TrainConfig, parse_args, resolve
from tests.train.conftest import GAMES, run_cli

CPU = torch.device("cpu")
EMPTY_THINK = "<think>\n\n</think>\n\n"
"""What Qwen3's template appends to the generation prompt when thinking is switched off."""


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory):
    path = build_tiny(tmp_path_factory.mktemp("q3") / "m", ["go to fridge 1"], 400, arch="qwen3")
    return path, load_tokenizer(str(path))


def _render(tok, **kw) -> str:
    msgs = [{"role": "user", "content": "task: go to fridge 1"}]
    return tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True, **kw)


def test_qwen3_template_thinking_switch(qwen3):
    """As in Qwen3's real template: off adds an empty think block, on (or not given) adds
    nothing; the trainer's default (off) is what the paper's own <think> format needs."""
    _, tok = qwen3
    head = "<|im_start|>user\ntask: go to fridge 1<|im_end|>\n<|im_start|>assistant\n"
    assert _render(tok) == head
    assert _render(tok, enable_thinking=True) == head
    assert _render(tok, enable_thinking=False) == head + EMPTY_THINK
    on = encode_prompt(tok, "task: go to fridge 1", 1000, enable_thinking=True)
    off = encode_prompt(tok, "task: go to fridge 1", 1000)
    block = tok(EMPTY_THINK, add_special_tokens=False)["input_ids"]
    assert off == on + block
    think, end = tok.convert_tokens_to_ids(["<think>", "</think>"])
    assert block[0] == think and end in block  # one token each, as in Qwen3's tokenizer
    check_thinking_switch(tok, True)


def test_qwen3_think_tags_survive_decoding(qwen3):
    """<think> and </think> are added tokens that are not special: decoding a response with
    skip_special_tokens (as the rollout does before parsing the action) keeps them."""
    _, tok = qwen3
    text = "<think>the fridge is closed</think><action>open fridge 1</action>"
    ids = tok(text, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    assert tok.decode(ids, skip_special_tokens=True) == text


def test_qwen2_template_has_no_switch(tmp_path):
    path = build_tiny(tmp_path / "m", ["go to fridge 1"], 400)
    tok = load_tokenizer(str(path))
    assert encode_prompt(tok, "a", 100, enable_thinking=True) == encode_prompt(tok, "a", 100)
    check_thinking_switch(tok, False)
    with pytest.raises(ValueError, match=r"TrainConfig\.enable_thinking: must be false"):
        check_thinking_switch(tok, True)


def test_enable_thinking_refused_for_a_template_without_the_switch(tmp_path):
    """A Qwen2.5-style model folder with --enable-thinking: a one-line error, exit 2, before
    the model is built."""
    path = build_tiny(tmp_path / "m", ["go to fridge 1"], 400)
    args = ["--preset", "tiny", "--env", "webshop", "--model", str(path), "--enable-thinking"]
    r = run_cli([*args, "--out-dir", str(tmp_path / "run")])
    assert r.returncode == 2, r.stderr[-3000:]
    assert "error: TrainConfig.enable_thinking: must be false for this model" in r.stderr
    assert "Traceback" not in r.stderr


def test_qwen3_folder_loads_by_path(qwen3, tmp_path):
    """Nothing Qwen2-specific in loading: the policy, the critic's backbone and the consolidated
    save all go through the Auto classes; tied embeddings stay tied."""
    path, tok = qwen3
    check_model(str(path))
    model = load_causal_lm(str(path), torch.float32, CPU)
    assert type(model).__name__ == "Qwen3ForCausalLM"
    assert model.config.head_dim == 64 and model.config.tie_word_embeddings
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    names = [n for n, _ in gathered_named_parameters(model)]
    assert "model.layers.0.self_attn.q_norm.weight" in names and "lm_head.weight" not in names
    assert type(Critic(str(path), torch.float32).backbone).__name__ == "Qwen3Model"
    with torch.no_grad():
        model.model.norm.weight.mul_(2.0)  # a trained weight, to see it saved
    save_hf_model(model, tok, tmp_path / "hf", write=True)
    again = load_causal_lm(str(tmp_path / "hf"), torch.float32, CPU)
    assert type(again).__name__ == "Qwen3ForCausalLM"
    assert again.lm_head.weight.data_ptr() == again.model.embed_tokens.weight.data_ptr()
    for (n, a), (_, b) in zip(model.named_parameters(), again.named_parameters(), strict=True):
        assert torch.equal(a, b), n
    assert load_tokenizer(str(tmp_path / "hf")).chat_template == tok.chat_template


def test_tiny_folder_of_another_arch_is_refused(qwen3):
    path, _ = qwen3
    with pytest.raises(ValueError, match="model_type"):
        build_tiny(path, arch="qwen2")


def test_rollout_prompts_follow_the_switch(qwen3):
    """The rollout renders every step's prompt with the run's switch."""
    from hgpo.train.envs import EnvSet
    from hgpo.train.episodes import Play, run_episodes

    _, tok = qwen3
    block = tok(EMPTY_THINK, add_special_tokens=False)["input_ids"]
    response = tok("<think>x</think><action>look</action>", add_special_tokens=False)["input_ids"]

    class Fixed:  # an engine that always answers the same
        def generate(self, prompts, temperature, top_p, max_new):
            return [[*response, tok.eos_token_id] for _ in prompts]

        def generated_logprobs(self):
            return None

    cfg = TrainConfig(
        env="alfworld", alfworld_games_dir=str(GAMES), max_steps=2, history_length=1,
        env_workers=1,
    )  # fmt: skip
    envs = EnvSet(cfg, "train", 1)
    try:
        tails = {}
        for on in (False, True):
            play = Play(1, 1.0, 1.0, 16, 2048, 2, enable_thinking=on)
            roll = run_episodes(envs, Fixed(), tok, [0], play)
            assert len(roll) == 2 and not any(roll.invalid)
            tails[on] = {tuple(p[-len(block) :]) == tuple(block) for p in roll.prompt_ids}
    finally:
        envs.close()
    assert tails == {False: {True}, True: {False}}


def test_config_tiny_arch_and_enable_thinking():
    cfg, _ = parse_args(["--preset", "tiny", "--tiny-arch", "qwen3", "--enable-thinking"])
    assert (cfg.tiny_arch, cfg.enable_thinking) == ("qwen3", True)
    assert (TrainConfig().tiny_arch, TrainConfig().enable_thinking) == ("qwen2", False)
    with pytest.raises(ValueError, match=r"tiny_arch: must be one of 'qwen2', 'qwen3'"):
        TrainConfig(tiny_arch="llama")
    with pytest.raises(ValueError, match="enable_thinking: must be false with tiny_arch='qwen2'"):
        TrainConfig(model="tiny", enable_thinking=True)


def test_qwen3_presets_mirror_the_paper_presets():
    for env in ("alfworld", "webshop"):
        for size, model, zero in (
            ("qwen3-1.7b", "Qwen/Qwen3-1.7B", 2),
            ("qwen3-4b", "Qwen/Qwen3-4B", 3),
        ):
            for k in (2, 4):
                q = resolve(preset=f"{env}-{size}-k{k}")
                p = resolve(preset=f"{env}-1.5b-k{k}")
                assert (q.model, q.zero_stage, q.enable_thinking) == (model, zero, False)
                assert q.out_dir == f"runs/{env}-{size}-k{k}"
                same = {
                    f: v
                    for f, v in p.to_dict().items()
                    if f not in ("model", "out_dir", "zero_stage")
                }
                assert {f: q.to_dict()[f] for f in same} == same
    assert {"alfworld-qwen3-1.7b-k2", "webshop-qwen3-4b-k4"} < set(PRESETS)


def test_tiny_qwen3_end_to_end(tmp_path):
    """``--tiny-arch qwen3``: two iterations, validation, checkpoints holding a Qwen3 model."""
    out = tmp_path / "q3"
    r = run_cli(
        ["--preset", "tiny", "--env", "webshop", "--tiny-arch", "qwen3", "--out-dir", str(out)]
    )
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-5000:]}"
    rows = read_metrics(out)
    assert [row["iteration"] for row in rows] == [1, 2]
    for row in rows:
        assert row["n_trajectories"] == 4 and row["n_steps"] >= 4 and row["grad_norm"] > 0
    assert "val/eval/success" in rows[-1]
    saved = json.loads((out / "config.json").read_text())
    assert (saved["tiny_arch"], saved["enable_thinking"]) == ("qwen3", False)
    hf = out / "checkpoints" / "iter_000002" / "hf_model"
    assert json.loads((hf / "config.json").read_text())["architectures"] == ["Qwen3ForCausalLM"]


def test_qwen3_folder_by_path_zero3_with_thinking(qwen3, tmp_path):
    """A Qwen3 model given as a folder (as a hub id resolves to one), trained under ZeRO-3 (the
    reference sharded, the rollout copy synced by gathering) with the template's thinking on."""
    path, _ = qwen3
    out = tmp_path / "run"
    args = ["--preset", "tiny", "--env", "webshop", "--model", str(path), "--zero-stage", "3"]
    r = run_cli([*args, "--enable-thinking", "true", "--iterations", "1", "--out-dir", str(out)])
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-5000:]}"
    (row,) = read_metrics(out)
    assert row["n_steps"] >= 4 and row["grad_norm"] > 0 and row["kl"] == row["kl"]
    hf = out / "checkpoints" / "iter_000001" / "hf_model"
    assert json.loads((hf / "config.json").read_text())["architectures"] == ["Qwen3ForCausalLM"]
