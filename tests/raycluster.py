"""A 2-node Ray cluster on this machine, started once per test session for the Ray tests.

Every node is a separate set of Ray processes (``ray.cluster_utils.Cluster``), so work placed
on "another node" really runs in another raylet; traffic stays on this machine. The cluster's
processes are children of the test process, not threads in it, and the test process itself is
connected only for the length of one test module (fixture ``ray_cluster`` in tests/conftest.py),
so the other tests' forked workers never inherit a live Ray connection.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

NODES = 2
CPUS_PER_NODE = 2
"""Logical CPUs: the tiny trainer's 2 training and 2 validation env actors fit at once."""


@contextmanager
def started_cluster() -> Iterator[Any]:
    """Start the nodes (no driver connection); shut every one down at the end."""
    pytest.importorskip("ray", reason="needs Ray (the [ray] extra)")
    from ray.cluster_utils import Cluster

    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": CPUS_PER_NODE, "include_dashboard": False},
    )
    try:
        for _ in range(NODES - 1):
            cluster.add_node(num_cpus=CPUS_PER_NODE)
        cluster.wait_for_nodes()
        yield cluster
    finally:
        cluster.shutdown()


@contextmanager
def connected(cluster: Any) -> Iterator[Any]:
    """The test process joined to ``cluster`` for the ``with`` block."""
    import ray

    ray.init(address=cluster.address, logging_level="WARNING")
    try:
        yield cluster
    finally:
        ray.shutdown()
