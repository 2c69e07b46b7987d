"""Which profile the installed vLLM follows: by version, and by decisions."""

from __future__ import annotations

import logging

import pytest

from dualbudget.integration.detect import detect, detect_by_decisions
from dualbudget.integration.testing import require_live_vllm


@pytest.mark.live
def test_version_and_decisions_agree_on_the_installed_vllm() -> None:
    version = require_live_vllm()
    logging.getLogger("vllm").setLevel(logging.ERROR)
    by_version = detect()
    assert by_version.how == "version"
    assert by_version.profile == "vllm-" + ".".join(version.split(".")[:2])
    by_decisions = detect_by_decisions(version + ".dev0")
    assert by_decisions.matches == (by_version.profile,), by_decisions.report()
    # Every other profile is named with the scenario it fails first.
    assert set(by_decisions.failures) == {
        name for name in by_decisions.failures if name != by_version.profile
    }
    assert len(by_decisions.failures) >= 5, by_decisions.report()
