"""What every test run shares: under ``CI=true`` (set by .ci/run) a skipped test is a
failure; the profile detected for the installed vLLM, which the live tests run against;
the test scheduler plugin, importable by its path as a user's plugin is; each test
module's group for pytest-xdist; and Hypothesis derandomized, so that a property test
draws the same examples on every run (a rare draw that breaks one fails every run, or
none).

A skip says a check did not run: a live test without vLLM, a test whose module could not
be collected. Outside CI that is a fair answer on a machine without vLLM; in CI it would
count as a pass for a check that never ran, so every skip, at collection or in a test, is
turned into a failure that keeps its reason. An expected failure (``xfail``) is reported
as pytest reports it.
"""

from __future__ import annotations

import os
from collections.abc import Generator
from pathlib import Path

import pytest
from hypothesis import settings

settings.register_profile("derandomized", derandomize=True, database=None)
settings.load_profile("derandomized")


def _in_ci() -> bool:
    return os.environ.get("CI", "").lower() == "true"


def _as_failure(report: pytest.TestReport | pytest.CollectReport) -> None:
    if not (_in_ci() and report.skipped) or hasattr(report, "wasxfail"):
        return
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
    report.outcome = "failed"
    report.longrepr = f"CI=true: a skipped test fails the run. Skipped because: {reason}"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    _as_failure(report)
    return report


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(
    collector: pytest.Collector,
) -> Generator[None, pytest.CollectReport, pytest.CollectReport]:
    report = yield
    _as_failure(report)
    return report


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Under pytest-xdist's ``--dist loadgroup`` (scripts/test.sh) a group runs in one
    worker: each module is a group of its own, so a module's fixtures (a planted tree
    fuzzed, the proofs run once) are built once, unless the module names another group
    (the tests that share the one local Ray, tests/ray_support.py). First, so that xdist
    reads these marks when it names the groups."""
    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(item.path.stem))


@pytest.fixture
def scheduler_plugin(monkeypatch: pytest.MonkeyPatch) -> str:
    """The ``--scheduler-cls`` path of tests/scheduler_plugin.py's ``OneAtATime``. The
    checkout's root goes on ``sys.path``, as a user's plugin folder would: the tests are
    no installed package, and the fuzz's worker processes import the class by its path
    (they inherit ``sys.path``)."""
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parent.parent))
    return "tests.scheduler_plugin:OneAtATime"


@pytest.fixture(scope="session")
def profile() -> str:
    """The profile detected for the installed vLLM (``live_profile_name``): detection
    drives vLLM's scheduler, so a session detects once for every live test that asks.
    Without vLLM the asking test skips, which under ``CI=true`` fails it. A test module
    whose ``profile`` means something else defines its own, which takes precedence."""
    from dualbudget.integration.testing import live_profile_name

    return live_profile_name()
