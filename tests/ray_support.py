"""A local Ray with 2 CPUs, started once per test session and shared by the live tests
that use it (tests/test_executor_ray_live.py, tests/test_campaign_live.py)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def local_ray() -> Iterator[None]:
    from dualbudget.campaign.ray_executor import start_ray

    # Ray's workers import the units (tests.executor_units) by name, from the checkout.
    paths = [str(ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    os.environ["PYTHONPATH"] = os.pathsep.join(paths)
    ray = start_ray(None, num_cpus=2)
    yield
    ray.shutdown()
