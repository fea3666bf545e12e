"""The engine-vs-trainer log-prob gap that checks the rollout engine's weight sync each
iteration (``rollout/logprob_diff_*``)."""

from __future__ import annotations

import pytest
import torch

from hgpo.train.episodes import logprob_gap


def test_gap_over_tokens_skipping_samples_without_engine_logprobs():
    trainer = [torch.tensor([-1.0, -2.0, -3.0, 0.0]), torch.tensor([-0.5, 0.0]), [-9.0]]
    engine = [[-1.0, -2.5, -3.0], [-0.25], None]  # responses of 3 and 1 tokens; padded trainer
    total, n, worst = logprob_gap(engine, trainer)
    assert n == 4 and total == pytest.approx(0.75) and worst == pytest.approx(0.5)


def test_gap_is_empty_for_the_hf_engine():
    assert logprob_gap([None, None], [torch.zeros(2), torch.zeros(3)]) == (0.0, 0, 0.0)
