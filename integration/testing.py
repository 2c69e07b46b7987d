"""Test support for the live checks: without vLLM a live test skips (and under ``CI=true``
tests/conftest.py turns that skip into a failure)."""

from __future__ import annotations


def require_live_vllm() -> str:
    """The installed vLLM's version; without vLLM, ``pytest.skip``."""
    import pytest

    from .live import installed_vllm_version

    version = installed_vllm_version()
    if version is not None:
        return version
    reason = (
        "vLLM is not installed in this environment; build one with"
        " scripts/install-vllm.sh (docs/vllm-environments.md)"
    )
    pytest.skip(reason)


def live_profile_name() -> str:
    """The profile detected for the installed vLLM, with vLLM's logging quieted; skips as
    ``require_live_vllm`` does when vLLM is missing."""
    import logging

    from .detect import detect

    require_live_vllm()
    logging.getLogger("vllm").setLevel(logging.ERROR)
    found = detect()
    assert found.profile is not None, found.report()
    return found.profile
