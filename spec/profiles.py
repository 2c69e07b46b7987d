"""Profiles: the policy a scheduler follows, named the way users ask for it."""

from __future__ import annotations

from dataclasses import dataclass

from .errors import BadInput
from .policies import POLICIES, Policy


@dataclass(frozen=True)
class Profile:
    name: str
    policy: Policy
    vllm_version: str | None
    """The vLLM release this profile mirrors, or None for a policy no release ships."""
    summary: str


PROFILES: dict[str, Profile] = {
    profile.name: profile
    for profile in (
        Profile(
            "global-reserve",
            POLICIES["global-reserve"],
            None,
            "target cap B - max_num_seqs * slots fixed at config time (0.32 slot table)",
        ),
        Profile(
            "vllm-0.32",
            POLICIES["additive"],
            "0.32",
            "vLLM 0.32: each scheduled request charged q + slots of one input budget",
        ),
        Profile(
            "vllm-0.33",
            POLICIES["static-cap"],
            "0.33",
            "vLLM 0.33: additive with DFlash/DSpark slots 0 and their admission capped",
        ),
        Profile(
            "dual",
            POLICIES["dual"],
            None,
            "target budget charged q, draft budget B charged the true draft rows C(q)",
        ),
    )
}
PROFILE_NAMES = tuple(PROFILES)


class UnknownProfile(BadInput):
    pass


def profile_named(name: str) -> Profile:
    try:
        return PROFILES[name]
    except KeyError:
        raise UnknownProfile(
            f"unknown profile {name!r} (known: {', '.join(PROFILE_NAMES)})"
        ) from None
