"""Test support for the live checks: vLLM missing is a failure under CI, a skip elsewhere."""

from __future__ import annotations

import os


def require_live_vllm() -> str:
    """The installed vLLM's version; without vLLM, ``pytest.fail`` when ``CI=true`` (the
    live suite must never be skipped in CI) and ``pytest.skip`` otherwise."""
    import pytest

    from .live import installed_vllm_version

    version = installed_vllm_version()
    if version is not None:
        return version
    reason = (
        "vLLM is not installed in this environment; build one with"
        " scripts/install-vllm.sh (docs/vllm-environments.md)"
    )
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"CI=true: {reason}", pytrace=False)
    pytest.skip(reason)


def live_profile_name() -> str:
    """The profile detected for the installed vLLM, with vLLM's logging quieted; fails or
    skips as ``require_live_vllm`` does when vLLM is missing."""
    import logging

    from .detect import detect

    require_live_vllm()
    logging.getLogger("vllm").setLevel(logging.ERROR)
    return detect().profile
