"""action_mode="score": the rollout samples among the admissible actions' responses."""

from __future__ import annotations

import pytest
import torch

from agentenvs import parse_action
from hgpo.train.episodes import (
    Play,
    candidate_actions,
    response_text,
    run_episodes,
    score_and_sample,
)
from hgpo.train.hf_engine import HFEngine
from hgpo.train.model import pack, response_logprobs
from hgpo.train.run_metrics import read_metrics
from hgpo.train.tiny import build_tiny
from hgpo.train.train_config import TrainConfig
from tests.train.conftest import GAMES, run_cli
from tests.train.tiny_engine import CharTokenizer, FixedScores


def test_sampling_follows_the_softmax_of_the_scores():
    tok = CharTokenizer()
    cands = [["a", "bb", "c"]]
    want = [ord(c) for c in response_text("bb")] + [0]
    torch.manual_seed(0)
    picks = [
        score_and_sample(FixedScores([-50.0, 0.0, -50.0]), tok, [[1]], cands, 1.0)[0]
        for _ in range(20)
    ]
    assert all(p == want for p in picks)
    counts = {}
    for _ in range(2000):  # equal scores: uniform at any temperature
        r = score_and_sample(FixedScores([1.0, 1.0, 1.0]), tok, [[1]], cands, 0.5)[0]
        counts[len(r)] = counts.get(len(r), 0) + 1
    assert len(counts) == 2 and 0.25 < counts[len(want)] / 2000 < 0.42


def test_no_admissible_action_is_a_clear_error():
    with pytest.raises(ValueError, match="no admissible actions"):
        score_and_sample(FixedScores([]), CharTokenizer(), [[1]], [[]], 1.0)


def test_webshop_search_placeholder_becomes_the_task():
    got = candidate_actions("webshop", ["search[<your query>]", "click[search]"], "red shoes")
    assert got == ["search[red shoes]", "click[search]"]
    assert candidate_actions("alfworld", ["look", "look", "go to desk 1"], "") == [
        "look",
        "go to desk 1",
    ]


def test_score_mode_rollout_is_admissible_and_logprobs_match_the_trainer(tmp_path):
    from transformers import AutoModelForCausalLM

    from hgpo.train.envs import EnvSet
    from hgpo.train.model import load_tokenizer

    torch.manual_seed(0)
    path = build_tiny(tmp_path / "m", ["go to fridge 1, take apple 1 from fridge 1"], 400)
    tok = load_tokenizer(str(path))
    model = AutoModelForCausalLM.from_pretrained(str(path)).eval()
    engine = HFEngine(model, tok, 8, torch.device("cpu"))
    cfg = TrainConfig(
        env="alfworld", alfworld_games_dir=str(GAMES), max_steps=3, history_length=1,
        env_workers=1,
    )  # fmt: skip
    envs = EnvSet(cfg, "train", 2)
    try:
        play = Play(2, 1.0, 1.0, 16, 1024, 3, action_mode="score")
        roll = run_episodes(envs, engine, tok, [0], play)
    finally:
        envs.close()
    assert len(roll) == 6 and not any(roll.invalid)
    for p, r in zip(roll.prompt_ids, roll.response_ids, strict=True):
        text = tok.decode(r, skip_special_tokens=True)
        assert text == response_text(parse_action(text, "alfworld").action)
        assert r[-1] == tok.eos_token_id
        # the engine's score of the chosen response is the trainer's summed token log-prob
        b = pack([p], [r], tok.pad_token_id, "cpu")
        with torch.no_grad():
            lp, _ = response_logprobs(model, b)
        assert engine.score([p], [r])[0] == pytest.approx(float(lp.sum()), abs=1e-4)


def test_shared_prompt_scores_equal_the_packed_forward(tmp_path):
    """HFEngine.score runs each prompt once (KV cache) for its consecutive candidates: the
    sums equal those of the trainer's packed forward, across chunks and prompt lengths."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    path = build_tiny(tmp_path / "m", ["go to fridge 1, take apple 1 from fridge 1"], 400)
    from hgpo.train.model import load_tokenizer

    model = AutoModelForCausalLM.from_pretrained(str(path)).eval()
    tok = load_tokenizer(str(path))
    engine = HFEngine(model, tok, 2, torch.device("cpu"))  # 2 per chunk: 3 candidates split
    g = torch.Generator().manual_seed(1)
    rand = lambda n: torch.randint(1, 300, (n,), generator=g).tolist()  # noqa: E731
    p1, p2 = rand(37), rand(5)
    prompts = [p1, p1, p1, p2, p2, p1]
    responses = [rand(9), rand(3), rand(14), rand(1), rand(6), rand(4)]
    got = engine.score(prompts, responses)
    for i, (p, r) in enumerate(zip(prompts, responses, strict=True)):
        with torch.no_grad():
            lp, _ = response_logprobs(model, pack([p], [r], tok.pad_token_id, "cpu"))
        assert got[i] == pytest.approx(float(lp.sum()), abs=1e-4), i
    with pytest.raises(ValueError, match="2 prompts but 1 responses"):
        engine.score([p1, p2], [responses[0]])


def test_score_mode_needs_the_hf_engine():
    with pytest.raises(ValueError, match="action_mode"):
        TrainConfig(action_mode="score", rollout_engine="vllm")
    with pytest.raises(ValueError, match="action_mode"):
        TrainConfig(action_mode="pick")


def test_score_mode_trains_two_iterations(tmp_path):
    out = tmp_path / "sc"
    args = ["--preset", "tiny", "--env", "alfworld", "--alfworld-games-dir", str(GAMES)]
    args += ["--action-mode", "score", "--history-length", "1", "--max-prompt-tokens", "1024"]
    r = run_cli([*args, "--val-every", "0", "--save-every", "0", "--out-dir", str(out)])
    assert r.returncode == 0, r.stderr[-3000:]
    rows = read_metrics(out)
    assert [row["iteration"] for row in rows] == [1, 2]
    assert all(row["invalid_rate"] == 0 and row["grad_norm"] > 0 for row in rows)
