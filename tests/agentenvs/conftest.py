"""ALFWorld's engine disk cache goes to a temporary folder during the tests, not to ~/.cache."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True, scope="session")
def _alfworld_disk_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    old = os.environ.get("AGENTENVS_ALFWORLD_CACHE")
    os.environ["AGENTENVS_ALFWORLD_CACHE"] = str(tmp_path_factory.mktemp("alfworld_engine"))
    yield
    if old is None:
        os.environ.pop("AGENTENVS_ALFWORLD_CACHE", None)
    else:
        os.environ["AGENTENVS_ALFWORLD_CACHE"] = old
