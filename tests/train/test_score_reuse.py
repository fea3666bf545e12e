"""action_mode="score" on the hf engine: the rollout scores every env's candidates in batched
passes and keeps the chosen response's token log-probs; the trainer reuses them as PPO's old
log-probs (and scores the KL reference in batched passes) instead of a second forward. The
figures equal the re-scored ones to float32 rounding, and a whole iteration's figures equal
those of the old path (one prompt at a time, every sample re-scored). action_mode="generate"
likewise reuses the sampling passes' own log-probs (from generate's raw logits)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from hgpo.train.hf_engine import HFEngine
from hgpo.train.train_config import resolve

ENV = "toy:tmaze:length=1"


def _cfg(out, **kw):
    over = {"action_mode": "score", "lora_rank": 4, "kl_coef": 0.05, "iterations": 1,
            "val_every": 0, "save_every": 0, "max_steps": 3, "out_dir": str(out), **kw}  # fmt: skip
    return resolve(ENV, "tiny", over)


def _old_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """The code before the reuse: the rollout scores one prompt at a time (``HFEngine.score``)
    and keeps no token log-probs, so the trainer re-scores every sample."""
    monkeypatch.delattr(HFEngine, "score_tokens")


@pytest.fixture(scope="module")
def trainer(tmp_path_factory):
    from hgpo.train.trainer import Trainer

    t = Trainer(_cfg(tmp_path_factory.mktemp("reuse")))
    yield t
    t.close()


def test_reused_logprobs_equal_the_rescored_ones(trainer):
    """The rollout's token log-probs (the old log-probs) and the batched reference pass equal
    the trainer's packed forwards of the actor and of the LoRA base model."""
    roll = trainer._rollout(1)
    assert len(roll) > 4 and all(lp is not None for lp in roll.score_logprobs)
    reused = trainer._reusable_logprobs(roll)
    assert reused is not None
    new = trainer._score(roll)
    fresh = dataclasses.replace(roll, score_logprobs=[None] * len(roll))
    assert trainer._reusable_logprobs(fresh) is None
    old = trainer._score(fresh)
    assert new.ref is not None and old.ref is not None
    for i, r in enumerate(roll.response_ids):
        n = len(r)
        assert new.old[i].shape == (n,)
        np.testing.assert_allclose(new.old[i], old.old[i][:n], atol=2e-5, err_msg=str(i))
        np.testing.assert_allclose(new.ref[i], old.ref[i][:n], atol=2e-5, err_msg=str(i))


def test_reuse_is_refused_where_it_would_not_be_exact(trainer, monkeypatch):
    """Not reused: a bf16 actor, an engine that holds its own copy of the weights (ZeRO-3),
    a row without its log-probs or with a count unlike its response's."""
    roll = trainer._rollout(1)
    assert trainer._reusable_logprobs(roll) is not None
    cut = [list(lp) for lp in roll.score_logprobs]
    cut[0] = cut[0][:-1]
    assert trainer._reusable_logprobs(dataclasses.replace(roll, score_logprobs=cut)) is None
    assert trainer._reusable_logprobs(dataclasses.replace(roll, score_logprobs=[])) is None
    monkeypatch.setattr(trainer.engine, "copy", True)
    assert trainer._reusable_logprobs(roll) is None
    monkeypatch.setattr(trainer.engine, "copy", False)
    monkeypatch.setattr(trainer, "dtype", torch.bfloat16)
    assert trainer._reusable_logprobs(roll) is None


def _iteration(out, monkeypatch, old: bool, **kw) -> tuple[dict, np.ndarray]:
    from hgpo.train import trainer as trainer_mod

    with monkeypatch.context() as m:
        if old:
            _old_path(m)
            m.setattr(HFEngine, "token_logprobs", lambda self: None)
        seen: list[np.ndarray] = []
        real = trainer_mod.Trainer._estimate

        def spy(self, roll, scored, it):
            est = real(self, roll, scored, it)
            seen.append(est.targets.advantages.copy())
            return est

        m.setattr(trainer_mod.Trainer, "_estimate", spy)
        t = trainer_mod.Trainer(_cfg(out, **kw))
        try:
            got = t.iteration(1)
        finally:
            t.close()
    return got, seen[0]


@pytest.mark.parametrize("mode", ["score", "generate"])
def test_an_iteration_equals_the_old_paths(tmp_path, monkeypatch, mode):
    """Same seed, one tiny iteration (LoRA, KL) in either action mode: the same samples,
    advantages, PPO loss, KL and gradient norm as the old path (every sample re-scored), to
    float32 rounding."""
    kw = {"action_mode": mode, **({"max_response_tokens": 12} if mode == "generate" else {})}
    new, adv_new = _iteration(tmp_path / "new", monkeypatch, old=False, **kw)
    old, adv_old = _iteration(tmp_path / "old", monkeypatch, old=True, **kw)
    assert new["n_steps"] == old["n_steps"]
    np.testing.assert_allclose(adv_new, adv_old, atol=1e-9)
    for key in ("pg_loss", "kl", "grad_norm", "clip_frac", "entropy"):
        assert new[key] == pytest.approx(old[key], rel=1e-4, abs=1e-6), key


def test_generate_mode_reuses_the_sampling_passes_logprobs(tmp_path):
    """action_mode="generate" on the hf engine: generate keeps each sampled token's log-prob
    at temperature 1 from its raw logits (the sampling temperature 0.7 and top-p 0.9 act after
    them), and the trainer reuses them as the old log-probs: the figures of its own packed
    forward to float32 rounding, so the KL to the base model (LoRA's B = 0) is 0."""
    from hgpo.train.trainer import Trainer

    t = Trainer(_cfg(tmp_path, action_mode="generate", max_response_tokens=12, temperature=0.7,
                     top_p=0.9))  # fmt: skip
    try:
        assert t.engine.keep_logprobs
        roll = t._rollout(1)
        assert len(roll) > 4
        assert all(
            len(lp) == len(r) for lp, r in zip(roll.score_logprobs, roll.response_ids, strict=True)
        )
        reused = t._reusable_logprobs(roll)
        assert reused is not None
        new = t._score(roll)
        old = t._score(dataclasses.replace(roll, score_logprobs=[None] * len(roll)))
        for i, r in enumerate(roll.response_ids):
            n = len(r)
            np.testing.assert_allclose(new.old[i], old.old[i][:n], atol=2e-5, err_msg=str(i))
            np.testing.assert_allclose(new.ref[i], old.old[i][:n], atol=2e-5, err_msg=str(i))
        assert max(float(o.abs().max()) for o in new.old) > 0.1  # not trivially zero
    finally:
        t.close()


def test_no_logprobs_kept_past_the_logits_budget(monkeypatch, trainer):
    """A generate chunk whose raw logits would pass MAX_KEPT_LOGITS keeps none (the trainer
    then scores afresh); without keep_logprobs the engine reports None."""
    from hgpo.train import memory_plan

    engine = trainer.engine
    prompt = trainer.tok("hello there", add_special_tokens=False)["input_ids"]
    engine.generate([prompt, prompt], 1.0, 1.0, 4)
    assert all(lp is not None for lp in engine.token_logprobs())
    monkeypatch.setattr(memory_plan, "MAX_KEPT_LOGITS", 2 * 4 * 4 * 100)
    engine.generate([prompt, prompt], 1.0, 1.0, 4)
    assert engine.token_logprobs() == [None, None]
    monkeypatch.setattr(engine, "keep_logprobs", False)
    assert engine.token_logprobs() is None
