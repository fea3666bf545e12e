"""The mini-batch plan: every sample once per epoch, token counts per mini-batch, rank padding."""

from __future__ import annotations

import numpy as np
import pytest

from hgpo.train.update import count_minibatches, plan_epoch


def test_every_sample_once_with_its_minibatch_token_count():
    lengths = [3, 1, 4, 1, 5, 9, 2]  # 7 samples, micro 2 x accum 2 = 4 per mini-batch
    plan = plan_epoch(lengths, count_minibatches(7, 4), 2, 2, np.random.default_rng(0))
    assert len(plan) == 2 and all(len(mb) == 2 for mb in plan)
    real = [m for mb in plan for m in mb if m.weight == 1.0]
    assert sorted(int(i) for m in real for i in m.rows) == list(range(7))
    for mb in plan:
        rows = [int(i) for m in mb if m.weight for i in m.rows]
        assert {m.tokens for m in mb} == {sum(lengths[i] for i in rows)}
    # the second mini-batch has 3 samples: micro-batches of 2 and 1, no padding needed
    assert [len(m.rows) for m in plan[1]] == [2, 1]


def test_a_rank_with_fewer_samples_pads_with_weight_zero():
    # the busiest rank needs 2 mini-batches; this one has 2 samples (one mini-batch's worth)
    plan = plan_epoch([5, 6], 2, 2, 2, np.random.default_rng(0))
    assert [[m.weight for m in mb] for mb in plan] == [[1.0, 0.0], [0.0, 0.0]]
    assert [len(m.rows) for mb in plan for m in mb] == [2, 1, 1, 1]


def test_no_minibatch_and_no_sample():
    assert plan_epoch([], 0, 2, 2, np.random.default_rng(0)) == []
    with pytest.raises(RuntimeError, match="without any step sample"):
        plan_epoch([], 1, 2, 2, np.random.default_rng(0))
