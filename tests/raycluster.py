"""A Ray cluster of one or more nodes on this machine, for the Ray tests (one per test module).

Every node is a separate set of Ray processes (``ray.cluster_utils.Cluster``), so work placed
on "another node" really runs in another raylet; traffic stays on this machine. The driver
(the test process) is connected for the module and shut down after it, with the cluster.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest


@contextmanager
def local_cluster(nodes: int = 1, cpus_per_node: int = 2) -> Iterator[Any]:
    """Start ``nodes`` Ray nodes here and connect the test process; yields the Cluster."""
    ray = pytest.importorskip("ray", reason="needs Ray (the [ray] extra)")
    from ray.cluster_utils import Cluster

    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": cpus_per_node, "include_dashboard": False},
    )
    try:
        for _ in range(nodes - 1):
            cluster.add_node(num_cpus=cpus_per_node)
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, logging_level="WARNING")
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()
