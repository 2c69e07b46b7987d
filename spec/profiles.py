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
    thread: str | None = None
    """The upstream pull request a proposal's profile follows (``owner/repo#N``)."""


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
        Profile(
            "pr-53080",
            POLICIES["split-draft-budget"],
            None,
            "vllm-project/vllm#53080 (proposal): every method, target budget charged q,"
            " draft budget B charged the layout's C(q); the dual rule under its name",
            "vllm-project/vllm#53080",
        ),
        Profile(
            "pr-52996",
            POLICIES["dspark-query-budget"],
            None,
            "vllm-project/vllm#52996 (proposal): DSpark charged K query rows of a separate"
            " draft-input budget B; every other method additive as in 0.32",
            "vllm-project/vllm#52996",
        ),
        Profile(
            "fork-605",
            POLICIES["query-budget"],
            None,
            "local-inference-lab/vllm#605 (fork): #52996 plus DFlash at K+1 query rows of"
            " the separate budget; every other method additive as in 0.32",
            "local-inference-lab/vllm#605",
        ),
    )
}
PROFILE_NAMES = tuple(PROFILES)
PROPOSAL_NAMES = tuple(p.name for p in PROFILES.values() if p.thread is not None)
"""The profiles of upstream proposals, each following its ``thread``."""

KNOWN_RELEASES: dict[str, str] = {
    p.vllm_version: p.name for p in PROFILES.values() if p.vllm_version is not None
}
"""vLLM release (``major.minor``) -> the profile that mirrors it, from each profile's
``vllm_version``."""


class UnknownProfile(BadInput):
    pass


def profile_named(name: str) -> Profile:
    try:
        return PROFILES[name]
    except KeyError:
        raise UnknownProfile(
            f"unknown profile {name!r} (known: {', '.join(PROFILE_NAMES)})"
        ) from None
