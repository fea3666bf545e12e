import os

import pytest
from hypothesis import HealthCheck, settings

# numba compiles on first call, so no deadline; CI derandomizes for reproducible runs.
settings.register_profile(
    "ci",
    deadline=None,
    derandomize=True,
    max_examples=200,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "dev", deadline=None, max_examples=100, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile(
    "thorough", deadline=None, max_examples=2000, suppress_health_check=list(HealthCheck)
)
settings.load_profile("ci" if os.environ.get("CI") else os.environ.get("HYPOTHESIS_PROFILE", "dev"))


@pytest.fixture(scope="session")
def _ray_nodes():
    """The Ray tests' 2-node cluster (tests/raycluster.py), started at its first use."""
    from tests.raycluster import started_cluster

    with started_cluster() as cluster:
        yield cluster


@pytest.fixture(scope="module")
def ray_cluster(_ray_nodes):
    """The 2-node cluster with this test process connected for the module, then disconnected."""
    from tests.raycluster import connected

    with connected(_ray_nodes) as cluster:
        yield cluster
