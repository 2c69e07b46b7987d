"""A test run once per release record (``spec/releases.py``), so that a release added as
one record is worked by every test that holds of every release, with no list to edit."""

from __future__ import annotations

import pytest

from dualbudget.spec.releases import RELEASES

RELEASE_PROFILES = tuple(release.profile_name for release in RELEASES.values())
"""Each release's profile, oldest first."""

every_release = pytest.mark.parametrize("profile", RELEASE_PROFILES)
"""Parametrizes a test's ``profile`` with each release's profile."""
