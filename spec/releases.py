"""The vLLM releases this project mirrors, one record each.

A release is more than its budget rule. Inside the subset the reference covers, vLLM
0.32 and 0.33 also differ in the numbers their method table derives per drafter (the
slots a request reserves for drafting and the KV lookahead past its scheduled tokens),
in the admission cap 0.33 puts on DFlash and DSpark, in which drafters may run under
``async_scheduling``, in how long a prefix-cache hit may be, in how a stop inside a
step resolves the output placeholders of async scheduling, in when a finished block is
cached, and in what the waiting and running loops do when a request cannot be
scheduled. Each of those is one field of ``Release`` below, named after the vLLM
behaviour it stands for, and every branch of the spec, the reference and the harness
reads that field, never the version string: a release is one more record (and the
install pins that build it), and it gets exactly the behaviour its fields say. A release
whose behaviour no field names yet needs that field and the code that reads it too, and
the proofs' manifest needs the verdicts of its profile (0.34 added four fields).

A profile (``spec.profiles``) is a budget policy run on one release's behaviour: the
release profiles are the records' own ``profile_name`` with the record's
``budget_policy``; each proposal names the release it is checked on.

The install scripts build one vLLM environment per ``requirements/vllm-<version>.lock``;
tests/unit/test_packaging.py checks that those lock files name exactly these records.
``python -m dualbudget.spec.releases`` prints the known versions, one a line.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from .arith import Num
from .errors import BadInput
from .methods import (
    K_MINUS_1,
    K_PLUS_1,
    LAYOUT_NAMES,
    LAYOUTS,
    ONE,
    ZERO,
    K,
    MethodLayout,
    PerK,
)


@dataclass(frozen=True)
class Release:
    """One vLLM release (``major.minor``): every behaviour of it that the spec, the
    reference scheduler or the harness distinguishes."""

    version: str
    """``major.minor``, as ``vllm.__version__`` starts (``0.33`` for ``0.33.1``)."""
    budget_policy: str
    """The name of the budget policy (``spec.policies.POLICIES``) the release ships."""
    summary: str
    """One line on the release's budget, for the profile list."""
    slots: Mapping[str, PerK]
    """Per layout name, vLLM's ``max_num_new_slots_for_drafting``: the rows its budget
    adds per scheduled request on top of the target tokens."""
    lookahead: Mapping[str, PerK]
    """Per layout name, vLLM's ``num_lookahead_tokens``: KV slots reserved past the
    scheduled tokens (and the divisor of ``caps_own_pass_admission``'s cap)."""
    caps_own_pass_admission: bool
    """``VllmConfig._set_max_num_scheduled_tokens`` checks ``max_num_batched_tokens``
    against ``num_lookahead_tokens`` (not the slots) and caps the running requests of a
    drafter with its own query pass (DFlash, DSpark) at
    ``max_num_batched_tokens // num_lookahead_tokens``."""
    async_methods: tuple[str, ...]
    """The drafters ``VllmConfig`` lets ``async_scheduling`` run with under model runner
    V1 (the runner the live adapter builds every method but DSpark with)."""
    async_runner_v2_methods: tuple[str, ...]
    """The further drafters run async only under model runner V2, and only without
    ``parallel_drafting`` (V2 refuses that but for DFlash/DSpark)."""
    block_drop_methods: tuple[str, ...]
    """The drafters whose prefix-cache hit drops its last block (vLLM's
    ``use_eagle_block_drop``), so that the drafter recomputes its hidden states."""
    hash_lookahead_methods: tuple[str, ...]
    """The drafters whose block hashes cover one token past the block
    (``num_hash_lookahead_tokens``): a hash exists only once that token does."""
    requeues_unscheduled_waiting: bool
    """A waiting request granted no tokens goes back to the queue and the loop goes on
    (True), or the waiting loop stops (False)."""
    continues_after_priority_self_preemption: bool
    """Under priority scheduling, a running request that preempted itself to make room
    lets the running loop go on to the requests after it (True), or stops it (False)."""
    resolves_placeholders_of_sampled: bool
    """``AsyncScheduler._update_request_with_output`` resolves the placeholders of every
    token returned, and only while some are held (True); or of the tokens kept after a
    stop trims the output, always (False)."""
    caches_verified_output: bool
    """A running request's blocks are cached as its output arrives, up to its verified
    tokens less those a stop trims, with spec tokens or async scheduling (True); or only
    under async scheduling, up to its output placeholders (False)."""
    caps_hits_for_routed_experts: bool
    """With ``enable_return_routed_experts`` on, the waiting loop cuts a prefix-cache hit
    at what the routed-experts output connector holds (``max_cache_hit``: True); or the
    setting changes no scheduling decision (False)."""
    eagle_groups_drop_without_use_eagle: bool
    """With prefix caching on several KV groups, a group marked ``is_eagle_group`` drops
    its last hit block whatever the drafter (True: the coordinator's ``eagle_group_ids``);
    or only where the drafter's ``use_eagle_block_drop`` holds (False:
    ``drop_eagle_group_ids``)."""
    retains_block_below_junction: bool
    """Under sparse prefix-cache retention a sliding-window group that drops its last
    hit block also keeps the tail ending one block below a shared-prefix junction, where
    a sibling diverging right after the junction lands its hit (True); or only the tail
    ending at the junction (False)."""
    rekeys_cached_mamba_tail: bool
    """A Mamba group in ``align`` mode marks the prompt's last reusable state as cached
    this step again at every step whose cacheable tokens end on it, though it is keyed
    there already, so a sibling's hit on it waits (True); or only in the step that keys it
    (False)."""

    parallel_drafting_methods: tuple[str, ...]
    """The drafters whose ``parallel_drafting`` vLLM's ``SpeculativeConfig`` accepts (for
    DFlash and DSpark it is forced on): a layout of another drafter that drafts in
    parallel (P-EAGLE, PARD, parallel ngram) is refused by the release."""
    threshold_needs_chunked_prefill: bool
    """``long_prefill_token_threshold`` cuts a prefill only with chunked prefill on (True);
    or whenever some other request could be starved (False)."""
    caches_output_beside_mamba: bool
    """With a Mamba group and prefix caching on, synchronous scheduling caches a running
    request's verified blocks as its output arrives even without spec tokens (True:
    vLLM publishes the Mamba states a request finalised before it retires); or only with
    spec tokens or output placeholders (False)."""
    has_cache_aware_admission: bool
    """The scheduler has ``cache_aware_admission_window`` (off by default): set, it
    admits the waiting requests of a window in the order of their cached prefixes."""

    def __hash__(self) -> int:
        # The tables are mappings: a release is known by its version.
        return hash(self.version)

    @property
    def profile_name(self) -> str:
        """The profile that runs this release's own budget policy on its behaviour."""
        return f"vllm-{self.version}"

    def draft_slots(self, layout: MethodLayout, k: Num) -> Num:
        """vLLM's ``max_num_new_slots_for_drafting`` for ``layout`` with ``K = k``."""
        return self.slots[layout.name].at(k)

    def num_lookahead_tokens(self, layout: MethodLayout, k: Num) -> Num:
        """vLLM's ``num_lookahead_tokens`` for ``layout`` with ``K = k``."""
        return self.lookahead[layout.name].at(k)

    def builds_parallel_drafting(self, method: str) -> bool:
        """Whether the release accepts ``parallel_drafting`` with ``method``."""
        return method in self.parallel_drafting_methods

    def builds(self, layout: MethodLayout) -> bool:
        """Whether the release builds a drafter of ``layout`` (``check_parallel_drafting``
        refuses the others)."""
        return layout.parallel_drafting is not True or self.builds_parallel_drafting(
            layout.speculative_method
        )

    @property
    def layouts(self) -> tuple[str, ...]:
        """The names of the method-table rows the release builds, in the table's order."""
        return tuple(layout.name for layout in LAYOUTS if self.builds(layout))

    def runs_async(self, method: str, parallel_drafting: bool) -> bool:
        """Whether this release lets ``method``'s drafter run with ``async_scheduling``."""
        if method in self.async_methods:
            return True
        return method in self.async_runner_v2_methods and not parallel_drafting

    def drops_last_hit_block(self, method: str | None) -> bool:
        return method in self.block_drop_methods

    def num_hash_lookahead_tokens(self, method: str | None, prefill_lookahead: int = 1) -> int:
        """vLLM's ``num_hash_lookahead_tokens``: the drafter's prefill lookahead
        (``EngineConfig.num_prefill_lookahead_tokens``, 1 for a single-module drafter)
        where the release hashes ahead for ``method``, else 0."""
        return prefill_lookahead if method in self.hash_lookahead_methods else 0


def _table(rows: Mapping[str, PerK]) -> Mapping[str, PerK]:
    """A method-table column: one entry per layout and for speculation off."""
    missing = {"none", *LAYOUT_NAMES} - rows.keys()
    assert not missing, f"method-table column lacks {sorted(missing)}"
    return MappingProxyType(dict(rows))


_SLOTS_0_32 = {
    "none": ZERO,
    "ngram": ZERO,
    "ngram-parallel": K_MINUS_1,
    "eagle": ZERO,
    "p-eagle": K_MINUS_1,
    "draft-model": ONE,
    "pard": K,
    "dflash": K,
    "dspark-anchor": K_MINUS_1,
    "dspark-fill-in": K_MINUS_1,
}
_LOOKAHEAD = _table(
    {
        "none": ZERO,
        "ngram": ZERO,
        "ngram-parallel": ZERO,
        "eagle": K,
        "p-eagle": K,
        "draft-model": K,
        "pard": K,
        "dflash": K_PLUS_1,
        "dspark-anchor": K,
        "dspark-fill-in": K_PLUS_1,
    }
)
# ngram_gpu's drafter runs on the device inside the model runner, so vLLM lists it
# with the EAGLE types as async-capable.
_ASYNC_V1 = ("eagle", "eagle3", "mtp", "draft_model", "dflash", "dspark", "ngram_gpu")
_EAGLE_STYLE = ("eagle", "eagle3", "mtp")
_PARALLEL_DRAFTING = ("ngram", "eagle", "eagle3", "draft_model", "dflash", "dspark")
"""The drafters with a parallel-drafting row in the method table, all built by 0.32 and
0.33 (for DFlash and DSpark it is forced on)."""

VLLM_0_32 = Release(
    version="0.32",
    budget_policy="additive",
    summary="each scheduled request charged q + slots of one input budget",
    slots=_table(_SLOTS_0_32),
    lookahead=_LOOKAHEAD,
    caps_own_pass_admission=False,
    async_methods=_ASYNC_V1,
    # Async ngram is refused under either model runner.
    async_runner_v2_methods=(),
    # Every drafter that reads the target's hidden states.
    block_drop_methods=(*_EAGLE_STYLE, "dflash", "dspark"),
    hash_lookahead_methods=(),
    requeues_unscheduled_waiting=False,
    continues_after_priority_self_preemption=False,
    resolves_placeholders_of_sampled=False,
    caches_verified_output=False,
    caps_hits_for_routed_experts=False,
    eagle_groups_drop_without_use_eagle=True,
    retains_block_below_junction=False,
    rekeys_cached_mamba_tail=True,
    parallel_drafting_methods=_PARALLEL_DRAFTING,
    threshold_needs_chunked_prefill=False,
    caches_output_beside_mamba=False,
    has_cache_aware_admission=False,
)
VLLM_0_33 = Release(
    version="0.33",
    budget_policy="additive",
    summary="additive with DFlash/DSpark slots 0 and their admission capped",
    slots=_table({**_SLOTS_0_32, "dflash": ZERO, "dspark-anchor": ZERO, "dspark-fill-in": ZERO}),
    lookahead=_LOOKAHEAD,
    caps_own_pass_admission=True,
    async_methods=_ASYNC_V1,
    # V1 refuses async ngram; V2, the default runner, runs it.
    async_runner_v2_methods=("ngram",),
    block_drop_methods=(),
    # The EAGLE-style drafters, whose draft KV at a position reads the next token.
    hash_lookahead_methods=_EAGLE_STYLE,
    requeues_unscheduled_waiting=True,
    continues_after_priority_self_preemption=True,
    resolves_placeholders_of_sampled=True,
    caches_verified_output=True,
    caps_hits_for_routed_experts=True,
    eagle_groups_drop_without_use_eagle=False,
    retains_block_below_junction=True,
    rekeys_cached_mamba_tail=False,
    parallel_drafting_methods=_PARALLEL_DRAFTING,
    threshold_needs_chunked_prefill=False,
    caches_output_beside_mamba=False,
    has_cache_aware_admission=False,
)
VLLM_0_34 = dataclasses.replace(
    VLLM_0_33,
    version="0.34",
    summary="0.33's budget; parallel drafting only for DFlash/DSpark, every drafter async",
    # Model runner V1 is gone, and with it every async refusal of a drafter.
    async_methods=(*_ASYNC_V1, "ngram"),
    async_runner_v2_methods=(),
    parallel_drafting_methods=("dflash", "dspark"),
    threshold_needs_chunked_prefill=True,
    caches_output_beside_mamba=True,
    has_cache_aware_admission=True,
)

RELEASES: dict[str, Release] = {
    release.version: release for release in (VLLM_0_32, VLLM_0_33, VLLM_0_34)
}
"""The releases, keyed by ``major.minor``, oldest first."""
RELEASE_VERSIONS = tuple(RELEASES)

_MAJOR_MINOR = re.compile(r"(\d+)\.(\d+)(?:\D|$)")


class UnknownRelease(BadInput):
    """A vLLM version this project has no record for."""


def release_named(version: str) -> Release:
    """The record of ``version`` (``major.minor``)."""
    try:
        return RELEASES[version]
    except KeyError:
        raise UnknownRelease(
            f"unknown vLLM release {version!r} (known: {', '.join(RELEASE_VERSIONS)})"
        ) from None


def release_of(vllm_version: str) -> Release | None:
    """The record of an installed ``vllm.__version__`` (``0.33.1``, ``0.33.0rc1.dev5``,
    ``0.32.0+cpu``), None for a release this project does not know."""
    match = _MAJOR_MINOR.match(vllm_version)
    if match is None:
        return None
    return RELEASES.get(f"{match[1]}.{match[2]}")


if __name__ == "__main__":
    print("\n".join(RELEASE_VERSIONS))
