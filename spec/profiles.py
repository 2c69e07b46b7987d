"""Profiles: a budget policy run on one release's behaviour, named the way users ask for it.

Each release's own profile is its record's ``profile_name`` with the record's
``budget_policy``. Every other profile names the release it is checked on, and that one
record gives both the policy's numbers (slots, lookahead, admission) and the reference
scheduler's behaviour around the budget (hit rules, async drafters, stop trimming, ...).
A proposal is checked on the release whose code its thread was written against; the
reason is the profile's ``release_reason``.
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import BadInput
from .policies import (
    POLICY_TYPES,
    DsparkQueryBudget,
    Dual,
    GlobalReserve,
    Policy,
    QueryBudget,
    SplitDraftBudget,
)
from .releases import RELEASES, VLLM_0_32, VLLM_0_33, Release


@dataclass(frozen=True)
class Profile:
    name: str
    policy: Policy
    """The budget rule, on the release the profile runs on (``release``)."""
    summary: str
    thread: str | None = None
    """The upstream pull request a proposal's profile follows (``owner/repo#N``)."""
    release_reason: str | None = None
    """Why a profile no release ships runs on its release."""

    @property
    def release(self) -> Release:
        """The release whose numbers the policy reads and whose behaviour the reference
        scheduler follows around the budget."""
        return self.policy.release

    @property
    def vllm_version(self) -> str | None:
        """The release this profile mirrors (its own profile), or None for a policy no
        release ships."""
        release = self.release
        return release.version if release.profile_name == self.name else None


def _release_profile(release: Release) -> Profile:
    return Profile(
        release.profile_name,
        POLICY_TYPES[release.budget_policy](release),
        f"vLLM {release.version}: {release.summary}",
    )


_THREAD_ON_ADDITIVE_SLOTS = (
    "its thread was written against vLLM's code of the time, whose DFlash/DSpark requests"
    " still reserved additive drafting slots (DSpark q + K - 1, DFlash K): the columns of"
    f" the {VLLM_0_32.version} record; later releases reserve none"
)

PROFILES: dict[str, Profile] = {
    profile.name: profile
    for profile in (
        Profile(
            "global-reserve",
            GlobalReserve(VLLM_0_32),
            f"target cap B - max_num_seqs * slots fixed at config time ({VLLM_0_32.version}"
            " slot table)",
            release_reason="the static reserve vLLM kept before its per-step charge; no"
            " record of that older release is kept, so it runs on the oldest release"
            " recorded, whose slot table it is stated with",
        ),
        *(_release_profile(release) for release in RELEASES.values()),
        Profile(
            "dual",
            Dual(VLLM_0_33),
            "target budget charged q, draft budget B charged the true draft rows C(q)",
            release_reason="this project's proposal, checked on the newest release recorded",
        ),
        Profile(
            "pr-53080",
            SplitDraftBudget(VLLM_0_32),
            "vllm-project/vllm#53080 (proposal): every method, target budget charged q,"
            " draft budget B charged the layout's C(q); the dual rule under its name",
            "vllm-project/vllm#53080",
            release_reason="opened the day after #52996, to fix the same report (DSpark"
            " charged q + K - 1); " + _THREAD_ON_ADDITIVE_SLOTS,
        ),
        Profile(
            "pr-52996",
            DsparkQueryBudget(VLLM_0_32),
            "vllm-project/vllm#52996 (proposal): DSpark charged K query rows of a separate"
            f" draft-input budget B; every other method additive as in {VLLM_0_32.version}",
            "vllm-project/vllm#52996",
            release_reason="it fixes a report that DSpark is charged q + K - 1; "
            + _THREAD_ON_ADDITIVE_SLOTS,
        ),
        Profile(
            "fork-605",
            QueryBudget(VLLM_0_32),
            "local-inference-lab/vllm#605 (fork): #52996 plus DFlash at K+1 query rows of"
            " the separate budget; every other method additive as in"
            f" {VLLM_0_32.version}",
            "local-inference-lab/vllm#605",
            release_reason="it carries #52996 and says the scheduler reserved DFlash's rows"
            " additively; " + _THREAD_ON_ADDITIVE_SLOTS,
        ),
    )
}
PROFILE_NAMES = tuple(PROFILES)
PROPOSAL_NAMES = tuple(p.name for p in PROFILES.values() if p.thread is not None)
"""The profiles of upstream proposals, each following its ``thread``."""


class UnknownProfile(BadInput):
    pass


def profile_named(name: str) -> Profile:
    try:
        return PROFILES[name]
    except KeyError:
        raise UnknownProfile(
            f"unknown profile {name!r} (known: {', '.join(PROFILE_NAMES)})"
        ) from None


def release_profile(release: Release) -> Profile:
    """The profile that mirrors ``release``: its own budget policy on its behaviour."""
    return PROFILES[release.profile_name]
