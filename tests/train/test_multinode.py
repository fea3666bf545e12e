"""A 2-node Ray cluster on this machine: the tiny trainer with its env workers as Ray actors,
and a train_toy sweep, each with work on both nodes (asserted through Ray node ids)."""

from __future__ import annotations

import logging

import pytest

from hgpo.train.run_metrics import read_metrics
from hgpo.train.train_config import TrainConfig
from studies import train_toy as tt
from tests.train.conftest import run_cli

ray = pytest.importorskip("ray", reason="needs Ray (the [ray] extra)")


def _node_ids(cluster) -> set[str]:
    return {n.node_id for n in cluster.list_all_nodes()}


def _env_actors() -> dict[str, str]:
    """Actor id -> Ray node of every EnvWorker actor the cluster has run (alive or finished)."""
    from ray._private.state import actors  # GCS's actor table: no dashboard needed

    return {
        actor_id: a["Address"]["NodeID"]
        for actor_id, a in actors().items()
        if a["ActorClassName"].endswith("EnvWorker")
    }


def test_tiny_trainer_with_env_actors_on_both_nodes(ray_cluster, tmp_path):
    out = tmp_path / "ws"
    args = ["--preset", "tiny", "--env", "webshop", "--env-backend", "ray", "--env-workers", "2",
            "--out-dir", str(out)]  # fmt: skip
    before = _env_actors()  # the session's cluster may have run other tests' actors
    r = run_cli(args, extra_env={"RAY_ADDRESS": ray_cluster.address})
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-5000:]}"
    rows = read_metrics(out)
    assert [row["iteration"] for row in rows] == [1, 2]
    assert rows[-1]["n_trajectories"] == 4 and "val/eval/success" in rows[-1]
    nodes = [node for actor, node in _env_actors().items() if actor not in before]
    assert len(nodes) >= 4  # 2 training + 2 validation env actors
    assert set(nodes) == _node_ids(ray_cluster)


def test_train_toy_sweep_on_both_nodes(ray_cluster, tmp_path, caplog):
    cfg = tt.TrainToyConfig(
        envs=("tmaze:length=2",), settings=("grpo", "hgpo"), seeds=2, iterations=2, eval_every=1,
        eval_rollouts=4, backend="ray", out=str(tmp_path),
    )  # fmt: skip
    with caplog.at_level(logging.INFO, logger="studies.backend"):
        summary = tt.run_study(cfg, progress=False)
    assert len(summary["final"]) == 4
    assert "4 tasks ran on 2 Ray nodes" in caplog.text


def test_env_backend_is_validated_and_needs_ray(monkeypatch):
    with pytest.raises(ValueError, match="env_backend: must be one of"):
        TrainConfig(env_backend="threads")
    monkeypatch.setitem(__import__("sys").modules, "ray", None)
    with pytest.raises(
        ValueError,
        match=r"env_backend='ray' needs ray \(the \[ray\] extra\).*pip install -e \"\.\[ray\]\"",
    ):
        TrainConfig(env_backend="ray")
