import os

import pytest
from hypothesis import HealthCheck, settings

# DeepSpeed logs "Setting accelerator to CPU. If you have GPU or other accelerator, we were
# unable to detect it." on import wherever it finds no CUDA device: a logging WARNING from its
# accelerator auto-detection, not a Python warning, so pytest's filterwarnings cannot catch it.
# Naming the accelerator skips the detection. Only where no NVIDIA driver is loaded, so the GPU
# tests keep CUDA; a DS_ACCELERATOR set by the user wins. Subprocesses (the launcher tests)
# inherit it.
if not os.path.exists("/dev/nvidiactl"):
    os.environ.setdefault("DS_ACCELERATOR", "cpu")

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
