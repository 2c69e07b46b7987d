"""Which profile the installed vLLM follows: by version, by probing, and the failure."""

from __future__ import annotations

import logging

import pytest

from dualbudget.integration import detect as detect_module
from dualbudget.integration.detect import DetectionFailed, detect, detect_by_probe, predicted
from dualbudget.integration.testing import require_live_vllm


def test_the_profiles_predict_different_probes() -> None:
    assert predicted("vllm-0.32") != predicted("vllm-0.33")


def test_no_match_fails_and_prints_what_was_found(monkeypatch: pytest.MonkeyPatch) -> None:
    strange = {name: {"slots": 99, "max_num_active_seqs": 1} for name in detect_module.PROBES}
    monkeypatch.setattr(detect_module, "observe", lambda: strange)
    with pytest.raises(DetectionFailed) as caught:
        detect_by_probe("0.99.0.dev1")
    message = str(caught.value)
    assert "0.99.0.dev1" in message and "'slots': 99" in message
    assert "vllm-0.32 predicts" in message


@pytest.mark.live
def test_version_and_probe_agree_on_the_installed_vllm() -> None:
    version = require_live_vllm()
    logging.getLogger("vllm").setLevel(logging.ERROR)
    by_version = detect()
    assert by_version.how == "version"
    assert by_version.profile == "vllm-" + ".".join(version.split(".")[:2])
    by_probe = detect_by_probe(version + ".dev0")
    assert by_probe.profile == by_version.profile, by_probe.observed
