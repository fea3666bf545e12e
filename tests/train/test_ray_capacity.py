"""``--env-backend ray`` checks that the Ray cluster has a free CPU for every env actor the run
will hold (training and validation sets) before any work (issue 27 item 8: with more actors
than CPUs the run trained iteration 1, then waited for a CPU at validation and failed after
145 s, neither logged nor saved)."""

from __future__ import annotations

import time
from dataclasses import replace

import pytest

from hgpo.train.envs import env_actors
from hgpo.train.train_config import TrainConfig

ray = pytest.importorskip("ray", reason="needs Ray (the [ray] extra)")

TOY = "toy:keydoor:size=4"


def test_env_actors_counts_every_set_the_run_holds():
    cfg = TrainConfig(env=TOY, groups_per_iter=2, group_size=2, env_workers=2, val_tasks=2)
    assert env_actors(cfg) == {"train": 2, "heldout": 2}
    assert env_actors(replace(cfg, env_workers=8)) == {"train": 4, "heldout": 2}  # <= slots
    assert env_actors(replace(cfg, val_every=0)) == {"train": 2}
    # 2 ranks: 2 training slots each; the split's 2 held-out tasks, 1 on each rank
    assert env_actors(cfg, world=2) == {"train": 4, "heldout": 2}
    four = replace(cfg, val_tasks=4)  # the split has 2 tasks only
    assert env_actors(four) == {"train": 2, "heldout": 2}


@pytest.fixture
def two_cpu_ray():
    """A private Ray of 2 logical CPUs in this process, shut down after the test."""
    ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level="WARNING")
    try:
        yield
    finally:
        ray.shutdown()


def test_more_env_actors_than_cpus_is_one_line_exit_2_before_the_model(
    two_cpu_ray, tmp_path, capsys
):
    from hgpo.train.__main__ import main

    out = tmp_path / "run"
    argv = ["--preset", "tiny", "--env", TOY, "--env-backend", "ray", "--env-workers", "2",
            "--out-dir", str(out)]  # fmt: skip
    t = time.monotonic()
    assert main(argv) == 2
    took = time.monotonic() - t
    err = capsys.readouterr().err
    assert err == (
        "error: TrainConfig.env_workers: 2 per env set makes 4 Ray env actors (2 train, "
        "2 heldout; 1 CPU each), but the Ray cluster has 2 of 2 CPUs free; lower "
        "--env-workers, set --val-every 0 (no validation sets), or give the cluster more CPUs\n"
    )
    assert took < 30 and not (out / "tiny_model").exists()


def test_env_actors_that_fit_pass(two_cpu_ray, tmp_path, monkeypatch):
    import hgpo.train.trainer as trainer
    from hgpo.train.__main__ import main

    monkeypatch.setattr(trainer, "train", lambda cfg: [])  # stop before any heavy work
    base = ["--preset", "tiny", "--env", TOY, "--env-backend", "ray", "--out-dir", str(tmp_path)]
    assert main([*base, "--env-workers", "1"]) == 0  # 1 train + 1 heldout
    assert main([*base, "--env-workers", "2", "--val-every", "0"]) == 0  # 2 train
