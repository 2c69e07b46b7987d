"""A local Ray with 2 CPUs, started once per test session and shared by the live tests
that use it (tests/live/test_executor_ray_live.py, tests/live/test_campaign_live.py); they and the
tests that start a Ray of their own (tests/live/test_sweep_ray_live.py) form one xdist group,
``RAY_GROUP``, so that one worker runs them and two Rays never share the machine's CPUs."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.paths import REPO

RAY_GROUP = pytest.mark.xdist_group("ray")


@pytest.fixture(scope="session")
def local_ray() -> Iterator[None]:
    from dualbudget.campaign.ray_executor import start_ray

    # Ray's workers import the units (tests.executor_units) by name, from the checkout.
    paths = [str(REPO), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    os.environ["PYTHONPATH"] = os.pathsep.join(paths)
    ray = start_ray(None, num_cpus=2)
    yield
    ray.shutdown()
