"""The batch tests' local Ray (one per test module that asks for it)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def ray_cluster():
    ray = pytest.importorskip("ray")
    from streamstudio.app.ray_connect import connect_ray

    assert connect_ray(None, num_cpus=2)  # a local Ray on 127.0.0.1 only
    yield ray
    ray.shutdown()
