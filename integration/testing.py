"""Test support for the live checks: without vLLM a live test skips (and under ``CI=true``
tests/conftest.py turns that skip into a failure)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dualbudget.reference.formats.scenario import Scenario


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


def installed_layouts() -> tuple[str, ...]:
    """The method-table rows the installed vLLM's release builds (``Release.layouts``),
    for a live test's parameters at collection; every row without vLLM or for a release
    without a record, whose tests then skip or fail as they would anyway."""
    from dualbudget.spec.methods import LAYOUT_NAMES
    from dualbudget.spec.releases import release_of

    from .live import installed_vllm_version

    version = installed_vllm_version()
    release = release_of(version) if version is not None else None
    return release.layouts if release is not None else LAYOUT_NAMES


def differing_release_profile(profile: str) -> str:
    """A release profile deciding otherwise than ``profile``'s release on DFlash (its
    slots: K in 0.32, 0 from 0.33 on), for live tests that plant a difference."""
    from dualbudget.spec.profiles import profile_named
    from dualbudget.spec.releases import RELEASES

    own = profile_named(profile).release
    layout = "dflash"
    for release in RELEASES.values():
        if release.slots[layout] != own.slots[layout]:
            return release.profile_name
    raise AssertionError(f"no release reserves other DFlash slots than {own.version}")


def built_by_the_release(scenario: Scenario, profile: str) -> Scenario:
    """``scenario`` under ``profile``, its drafter a sequential one of the same K where
    the profile's release builds no drafter of its layout (a preset's P-EAGLE under a
    release that drafts in parallel only for DFlash and DSpark)."""
    import dataclasses

    from dualbudget.spec.config import SpeculativeConfig
    from dualbudget.spec.profiles import profile_named

    config, layout = scenario.config, scenario.config.layout
    spec = config.speculative_config
    release = profile_named(profile).release
    if spec is not None and layout is not None and not release.builds(layout):
        sequential = SpeculativeConfig(spec.method, spec.num_speculative_tokens)
        config = dataclasses.replace(config, speculative_config=sequential)
    return dataclasses.replace(scenario, config=config).with_profile(profile)
