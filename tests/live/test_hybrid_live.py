"""KV cache groups against the live vLLM (needs vLLM; docs/vllm-environments.md): vLLM's
scheduler built on multi-group ``KVCacheConfig``s (``live.kv_cache_config_of``), the
cases worked by hand from vLLM's managers (``tests/kv_group_cases.py``) run in lockstep
with the reference, each worked step, the pool's free blocks and the reference's group
counters pinned. Without vLLM these tests fail under CI=true, else skip.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest

from dualbudget.integration.aims import AIMS
from dualbudget.integration.live import installed_vllm_version
from dualbudget.integration.lockstep import DivergenceFound, Lockstep, MirroredCrash
from dualbudget.integration.testing import installed_layouts
from dualbudget.reference.events import AddRequest, ModelOutput, ScheduleStep, StepRecord
from dualbudget.reference.formats.deployments import DEPLOYMENTS
from dualbudget.reference.formats.scenario import Scenario
from dualbudget.reference.formats.settings import first_unreplayed
from dualbudget.reference.kv import coordinator as kv_coordinator
from dualbudget.reference.kv.coordinator import lookup_types
from dualbudget.reference.kv.hybrid import HybridKVCacheManager
from dualbudget.reference.kv.hybrid_caching import HybridPrefixCachingKVCacheManager
from dualbudget.reference.kv.sliding_window import SlidingWindowManager
from dualbudget.reference.scheduler import KV_GROUP_OBSERVED
from dualbudget.spec.config import EngineConfig, KVGroup, SpeculativeConfig
from dualbudget.spec.methods import layout_named
from dualbudget.spec.profiles import profile_named
from tests import kv_group_cases
from tests.planted_scenario import planted_divergence, planted_scenario

pytestmark = pytest.mark.live


def _cases_of_the_installed_release() -> list[kv_group_cases.Case]:
    """The cases worked for the installed vLLM's release (all of them without vLLM, where
    each fails or skips as ``require_live_vllm`` says)."""
    version = installed_vllm_version()
    if version is None:
        return list(kv_group_cases.CASES)
    release = ".".join(version.split(".")[:2])
    return [case for case in kv_group_cases.CASES if release in case.releases]


INSTALLED_CASES = _cases_of_the_installed_release()


@pytest.mark.parametrize("case", INSTALLED_CASES, ids=[c.name for c in INSTALLED_CASES])
def test_a_hand_worked_kv_group_case_agrees_live(case: kv_group_cases.Case, profile: str) -> None:
    """Each event to both schedulers (``Lockstep`` compares every step's decisions); the
    steps worked by hand and vLLM's free blocks after each, as the case has them, and the
    reference's group counters at the end."""
    # The cases' pools are smaller than one request of their max_model_len, which the
    # lockstep's validation refuses; their requests never come near it.
    config = case.config
    usable = (config.num_gpu_blocks - 1) * min(group.block_size for group in config.groups)
    lock = Lockstep(
        dataclasses.replace(config, max_model_len=min(config.max_model_len, usable)), profile
    )
    pool = lock.live.scheduler.kv_cache_manager.block_pool
    records: list[StepRecord] = []
    free: list[int] = []
    for event in case.events:
        if lock.handle(event) is not None:
            assert lock.last_live is not None
            records.append(lock.last_live)
            free.append(pool.get_num_free_blocks())
    for step, (scheduled, spec, preempted) in case.decisions.items():
        record = records[step]
        assert (record.num_scheduled_tokens, record.scheduled_spec_tokens) == (scheduled, spec), (
            step
        )
        assert sorted(record.preempted) == preempted, step
    assert {step: free[step] for step in case.free_blocks} == case.free_blocks
    observed = lock.reference.observed
    for name in KV_GROUP_OBSERVED:
        assert observed[name] == case.observed.get(name, 0), name


def test_a_coarser_group_keys_the_prompt_tail_as_vllm_does(profile: str) -> None:
    """``kv_group_cases.PROMPT_TAIL``: the tail block of the group of 8 is keyed as the
    release has it in both schedulers, and once r0 is aborted both free queues hold the
    same blocks in the same order."""
    config = dataclasses.replace(kv_group_cases.PROMPT_TAIL, max_model_len=36)
    lock = Lockstep(config, profile)
    add, step, abort = kv_group_cases.PROMPT_TAIL_EVENTS
    lock.handle(add)
    lock.handle(step)
    coordinator = lock.live.scheduler.kv_cache_manager.coordinator
    live_tail = coordinator.single_type_managers[1].req_to_blocks["r0"][2]
    reference_pool = lock.reference.state.block_pool
    assert reference_pool is not None
    reference_tail = lock.reference.state.requests["r0"].kv_groups[1].block_ids[2]
    keyed = kv_group_cases.PROMPT_TAIL_KEYED[profile.removeprefix("vllm-")]
    assert (live_tail.block_hash is not None) == keyed
    assert (reference_pool.block_hash[reference_tail] is not None) == keyed
    lock.handle(abort)
    live_queue = lock.live.scheduler.kv_cache_manager.block_pool.free_block_queue
    assert [block.block_id for block in live_queue.get_all_free_blocks()] == list(
        reference_pool.free_queue
    )


SEARCHED_PLACES = 4
"""Places of a group's blocks the exhaustive search test caches every subset of."""


@pytest.mark.parametrize(
    "group",
    [
        KVGroup("sliding_window", 4, sliding_window=4),
        KVGroup("sliding_window", 4, sliding_window=12),
        KVGroup("full_attention", 4),
        KVGroup("full_attention", 8),
    ],
    ids=["window of 4 in blocks of 4", "window of 12 in blocks of 4", "blocks of 4", "blocks of 8"],
)
def test_a_group_beside_another_block_size_finds_the_hit_vllm_finds(
    group: KVGroup, profile: str
) -> None:
    """One group's ``find_longest_cache_hit`` beside a group of the other block size (4
    and 8: hashes of 4 tokens, hits on 8), the reference's against vLLM's own on one pool:
    every subset of its first places cached, every length searched within, the last
    block dropped or not."""
    import itertools

    from vllm.v1.core import single_type_kv_cache_manager as managers
    from vllm.v1.core.block_pool import BlockPool
    from vllm.v1.core.kv_cache_utils import make_block_hash_with_group_id

    from dualbudget.integration.live import kv_cache_spec_of
    from dualbudget.reference.async_scheduler import make_scheduler
    from dualbudget.reference.kv.blocks import group_key

    other = KVGroup("full_attention", 8 if group.block_size == 4 else 4)
    config = kv_group_cases.config(40, group, other, enable_prefix_caching=True)
    spec = kv_cache_spec_of(group, config)
    windowed = group.kind == "sliding_window"
    finder = managers.SlidingWindowManager if windowed else managers.FullAttentionManager
    span = group.block_size // 4
    hashes = [f"h{index}" for index in range(SEARCHED_PLACES * span)]
    fine = [index.to_bytes(8, "little") for index in range(len(hashes))]
    for cached in itertools.chain.from_iterable(
        itertools.combinations(range(SEARCHED_PLACES), n) for n in range(SEARCHED_PLACES + 1)
    ):
        scheduler = make_scheduler(config, profile_named(profile))
        manager = scheduler.kv
        assert isinstance(manager, HybridPrefixCachingKVCacheManager)
        reference_pool = manager.pool(scheduler.state)
        pool = BlockPool(40, True, 4)
        for place in cached:
            key = (place + 1) * span - 1
            reference_pool.cache(place + 1, group_key(hashes[key], 0))
            pool.cached_block_hash_to_block.insert(
                make_block_hash_with_group_id(fine[key], 0), pool.blocks[place + 1]
            )
        for max_length, drop in itertools.product(
            range(0, SEARCHED_PLACES * group.block_size + 1, 4), (False, True)
        ):
            found, length = manager._find(reference_pool, hashes, (0,), max_length, drop)
            live_found, live_length = finder.find_longest_cache_hit(
                block_hashes=fine,
                max_length=max_length,
                kv_cache_group_ids=[0],
                block_pool=pool,
                kv_cache_spec=spec,
                drop_eagle_block=drop,
                alignment_tokens=8,
            )
            where = f"cached {cached}, max_length {max_length}, drop {drop}"
            assert length == live_length, where
            assert found[0] == [block.block_id for block in live_found[0]], where


def test_vllm_fails_its_assertion_on_a_checkpoint_past_a_padded_prompt(profile: str) -> None:
    """Where the reference raises ``UnmirroredVllmCrash`` (a padded request's Mamba
    checkpoint past its prompt), vLLM's scheduler fails too: the lockstep calls it a
    mirrored crash."""
    config, events = kv_group_cases.MAMBA_CHECKPOINT_PAST_THE_PROMPT
    lock = Lockstep(config, profile)
    # vLLM's assertion: BlockPool._get_partial_block_hash, the checkpoint's hash.
    with pytest.raises(
        MirroredCrash, match=r"past its 3 block hashes; live: AssertionError: \(at block_pool"
    ) as crashed:
        for event in events:
            lock.handle(event)
    assert crashed.value.crash == "mamba-checkpoint-past-block-hashes"


def _no_checkpoint_without_caching(
    original: Callable[..., bool],
) -> Callable[..., bool]:
    """``_reserve_checkpoint`` as if the coordinator without caching never reserved one
    (the split still leaves the chunk whole)."""

    def reserve(self: HybridKVCacheManager, *args: object) -> bool:
        return original(self, *args) if self.enable_caching else False

    return reserve


def test_a_block_the_reference_does_not_take_is_a_free_blocks_divergence(
    profile: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The lockstep compares the pools too: with the checkpoint's place left out of the
    reference's allocation, step 1 of the hand-worked checkpoint case without caching
    schedules the same 12 tokens on both sides, but the reference keeps one block more
    free than vLLM (10, vLLM 9)."""
    case = next(c for c in kv_group_cases.CASES if c.name.endswith("without prefix caching"))
    monkeypatch.setattr(
        HybridKVCacheManager,
        "_reserve_checkpoint",
        _no_checkpoint_without_caching(HybridKVCacheManager._reserve_checkpoint),
    )
    lock = Lockstep(case.config, profile)
    with pytest.raises(DivergenceFound) as found:
        for event in case.events:
            lock.handle(event)
    divergence = found.value.divergence
    assert (divergence.kind, divergence.step) == ("free_blocks", 1)
    assert (divergence.reference, divergence.live) == (10, 9)
    assert lock.last_live is not None and lock.last_live.num_scheduled_tokens == {"r0": 12}


FAMILIES: dict[str, tuple[KVGroup, ...]] = {
    # gpt-oss + EAGLE3: sliding-window and full attention, the drafter's layers in the
    # full-attention group.
    "sliding window + full": (
        KVGroup("sliding_window", 4, sliding_window=8),
        KVGroup("full_attention", 4, is_eagle_group=True),
    ),
    # Llama 4 + EAGLE: chunked local attention beside full attention, the drafter's
    # layers in the full-attention group.
    "chunked local + full": (
        KVGroup("chunked_local_attention", 4, attention_chunk_size=8),
        KVGroup("full_attention", 4, is_eagle_group=True),
    ),
    # DeepSeek V3 + MTP: one MLA group.
    "MLA": (KVGroup("mla_attention", 4),),
    # DeepSeek V4: its compressor's sliding-window MLA beside MLA.
    "sliding-window MLA + MLA": (
        KVGroup("sliding_window_mla", 4, sliding_window=8),
        KVGroup("mla_attention", 4),
    ),
    # Groups of one spec, looked up together: gpt-oss with a one-layer drafter (its
    # full-attention group twice, the drafter's marked), Llama 4's three chunked-local
    # groups per full-attention one, MLA twice (the drafter's marked).
    "sliding window + full twice": (
        KVGroup("sliding_window", 4, sliding_window=8),
        KVGroup("full_attention", 4),
        KVGroup("full_attention", 4, is_eagle_group=True),
    ),
    "chunked local thrice + full": (
        *[KVGroup("chunked_local_attention", 4, attention_chunk_size=8)] * 3,
        KVGroup("full_attention", 4, is_eagle_group=True),
    ),
    "MLA twice": (KVGroup("mla_attention", 4), KVGroup("mla_attention", 4, is_eagle_group=True)),
    # DeepSeek's compressed MLA beside MLA of another head size: specs of one kind vLLM
    # looks up apart, the drafter's layers in the second.
    "MLA + MLA of another spec": (
        KVGroup("mla_attention", 4),
        KVGroup("mla_attention", 4, is_eagle_group=True, spec_variant=1),
    ),
    # A drafter's full-attention layers whose page vLLM matches to the target's by
    # doubling their block (unify_kv_cache_spec_page_size): two block sizes, hits on
    # their LCM.
    "full + drafter's full at twice the block": (
        KVGroup("full_attention", 4),
        KVGroup("full_attention", 8, is_eagle_group=True),
    ),
    # Gemma-like: a sliding window beside full attention of another page, whose block
    # vLLM doubled; the window's runs start only where a hit ends on the LCM.
    "sliding window + full at twice the block": (
        KVGroup("sliding_window", 4, sliding_window=8),
        KVGroup("full_attention", 8, is_eagle_group=True),
    ),
    # Qwen3-Next: Mamba (gated delta net) beside full attention, in align mode.
    "Mamba align + full": (
        KVGroup("mamba", 8, mamba_cache_mode="align"),
        KVGroup("full_attention", 4),
    ),
}
COORDINATORS = {
    # vLLM's get_kv_cache_coordinator: without prefix caching one that caches nothing;
    # with it, the unitary coordinator for one group, the hybrid one for several.
    (False, False): "KVCacheCoordinatorNoPrefixCache",
    (False, True): "KVCacheCoordinatorNoPrefixCache",
    (True, False): "UnitaryKVCacheCoordinator",
    (True, True): "HybridKVCacheCoordinator",
}


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("caching", [False, True], ids=["no-caching", "caching"])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_vllm_schedules_on_each_family_layout(
    family: str, caching: bool, async_scheduling: bool, profile: str
) -> None:
    """vLLM's scheduler, sync and async, caching on and off, builds on each family's
    groups with vLLM's own coordinator, and its first step schedules every prompt's
    first chunk within the groups' shared pool."""
    from dualbudget.integration.live import LiveScheduler

    groups = FAMILIES[family]
    config = EngineConfig(
        max_num_batched_tokens=64,
        max_num_seqs=4,
        max_model_len=64,
        block_size=4,
        num_gpu_blocks=80,
        speculative_config=SpeculativeConfig("eagle3", 2),
        async_scheduling=async_scheduling,
        enable_prefix_caching=caching,
        kv_groups=groups,
    )
    live = LiveScheduler(config)
    coordinator = live.scheduler.kv_cache_manager.coordinator
    assert type(coordinator).__name__ == COORDINATORS[caching, len(groups) > 1]
    assert len(coordinator.single_type_managers) == len(groups)
    if caching and len(groups) > 1:
        # vLLM looks up together the groups the reference looks up together.
        found = [tuple(group.group_ids) for group in coordinator.attention_groups]
        assert found == list(lookup_types(groups))
    for index in range(3):
        live.handle(AddRequest(f"r{index}", 20, 4))
    record = live.handle(ScheduleStep())
    assert record is not None and record.num_scheduled_tokens.get("r0", 0) > 0
    assert sum(record.num_scheduled_tokens.values()) <= config.max_num_batched_tokens
    # A token sampled where the prompt is done (Mamba's align split may stop short of it).
    live.handle(ModelOutput({rid: int(n == 20) for rid, n in record.num_scheduled_tokens.items()}))
    assert live.handle(ScheduleStep()) is not None


CACHING_FAMILIES = [family for family in FAMILIES if "Mamba" not in family]
"""The families whose prefix caching the reference models (the Mamba family's groups are
of two block sizes, which the reference models with caching only for full attention)."""


def family_config(family: str, caching: bool, async_scheduling: bool = False) -> EngineConfig:
    """A small engine config on ``family``'s groups, EAGLE3 K=2, a pool of 32 blocks a
    group."""
    return EngineConfig(
        max_num_batched_tokens=24,
        max_num_seqs=4,
        max_model_len=64,
        block_size=4,
        num_gpu_blocks=len(FAMILIES[family]) * 32 + 1,
        speculative_config=SpeculativeConfig("eagle3", 2),
        async_scheduling=async_scheduling,
        enable_prefix_caching=caching,
        kv_groups=FAMILIES[family],
    )


def run_a_crowd(
    lock: Lockstep, prompts: list[tuple[int, ...]], steps: int, turn: tuple[int, ...]
) -> None:
    """``prompts`` arrive at once; then, every sixth step, a repeat of one of them and a
    later turn of one (``turn`` more tokens) by turns; two drafts a step, half accepted."""
    for prompt in prompts:
        lock.add(len(prompt), 6 + 2 * len(prompt) % 7, prompt_token_ids=prompt)
    for step in range(steps):
        if step % 6 == 5:
            earlier = prompts[step % len(prompts)]
            again = earlier if step % 12 == 5 else (*earlier, *turn)
            lock.add(len(again), 5, prompt_token_ids=again)
        lock.run_step(lambda rid, drafts: drafts // 2, lambda rid: 2)


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("caching", [False, True], ids=["no-caching", "caching"])
@pytest.mark.parametrize("family", CACHING_FAMILIES)
def test_each_family_runs_in_lockstep(
    family: str, caching: bool, async_scheduling: bool, profile: str
) -> None:
    """The reference and vLLM agree step by step on each family's groups, sync and
    async, caching on and off: a crowd of prompts sharing a system prompt, then repeats
    and later turns of them arriving as the pool (two requests of every group) evicts
    the blocks of those that finished; with caching on, some are admitted on a hit."""
    lock = Lockstep(family_config(family, caching, async_scheduling), profile)
    system = tuple(range(1000, 1012))
    prompts = [system + tuple(range(100 * n, 100 * n + 4 + 3 * n)) for n in range(4)]
    run_a_crowd(lock, prompts, 48, (7,) * 5)
    observed = lock.reference.observed
    assert (observed["prefix_hit"] > 0) == caching
    if any(group.kind not in ("full_attention", "mla_attention") for group in FAMILIES[family]):
        assert observed["window_blocks_freed"] > 0


def deepseek_v4_config(caching: bool, async_scheduling: bool) -> EngineConfig:
    """The deployment table's DeepSeek V4 groups at their own block sizes (4 to 256), the
    MTP layers in the first compressed-MLA group, MTP K=2 on a pool of 330 blocks."""
    (row,) = [d for d in DEPLOYMENTS if d.family.startswith("DeepSeek V4 ")]
    first, *others = (group for _, group in row.groups)
    groups = (dataclasses.replace(first, is_eagle_group=True), *others)
    return EngineConfig(
        max_num_batched_tokens=384,
        max_num_seqs=6,
        max_model_len=2048,
        block_size=first.block_size,
        num_gpu_blocks=330,
        speculative_config=SpeculativeConfig("mtp", 2),
        async_scheduling=async_scheduling,
        enable_prefix_caching=caching,
        kv_groups=groups,
    )


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("caching", [False, True], ids=["no-caching", "caching"])
def test_deepseek_v4s_groups_run_in_lockstep(
    caching: bool, async_scheduling: bool, profile: str
) -> None:
    """The reference and vLLM agree step by step on DeepSeek V4's groups, four block sizes
    and two specs of compressed MLA looked up apart: prompts sharing a system prompt of
    two scheduler blocks, then repeats and longer turns of them; with caching on, hits
    land on the 256-token LCM across every group."""
    lock = Lockstep(deepseek_v4_config(caching, async_scheduling), profile)
    system = tuple(range(10_000, 10_520))
    prompts = [system + tuple(range(1000 * n, 1000 * n + 30 + 97 * n)) for n in range(4)]
    run_a_crowd(lock, prompts, 80, tuple(range(7, 47)))
    observed = lock.reference.observed
    assert observed["window_blocks_freed"] > 0
    assert (observed["hit_across_block_sizes"] > 0) == caching


def test_a_group_told_apart_by_a_field_that_decides_no_blocks_is_looked_up_apart(
    profile: str,
) -> None:
    """Two groups of one spec class that differ only in a field that decides no blocks
    (here the head size): vLLM looks them up apart, so the recorder gives the second its
    own ``spec_variant`` and the reference looks them up apart too; MLA twice at one head
    size is one spec, looked up together. Both replay."""
    from dualbudget.integration.live import LiveScheduler
    from dualbudget.integration.recorder import kv_cache_group_names, kv_groups_of

    config = family_config("MLA twice", caching=True)
    live = LiveScheduler(config)
    assert kv_groups_of(live.vllm_config, live.kv_cache_config) == FAMILIES["MLA twice"]
    mla, drafter = live.kv_cache_config.kv_cache_groups
    indexer = dataclasses.replace(
        drafter, kv_cache_spec=dataclasses.replace(drafter.kv_cache_spec, head_size=16)
    )
    apart = dataclasses.replace(live.kv_cache_config, kv_cache_groups=[mla, indexer])
    groups = kv_groups_of(live.vllm_config, apart)
    assert groups == FAMILIES["MLA + MLA of another spec"]
    assert lookup_types(groups) == ((0,), (1,))
    assert lookup_types(FAMILIES["MLA twice"]) == ((0, 1),)
    names = kv_cache_group_names(apart)
    assert names == ["MLAAttentionSpec"] * 2
    replayed = dataclasses.replace(config, kv_groups=groups)
    assert first_unreplayed({"kv_cache_groups": names}, replayed, profile_named(profile)) is None


@pytest.mark.parametrize("family", ["MLA twice", "MLA + MLA of another spec"])
def test_groups_of_one_spec_or_two_find_the_hit_vllm_finds(family: str, profile: str) -> None:
    """The blocks of ``tests/worked/test_kv_groups_reference.py``'s hand-worked lookups: the
    first group holds the prompt's first 3 blocks cached, the drafter's its first 5.
    vLLM's own coordinator finds the reference's hit, for groups of one spec (looked up
    together) and of two (apart); where EAGLE's hit drops its last block (0.32) the two
    come out apart: 2 blocks together, 3 apart."""
    from vllm.v1.core.kv_cache_utils import make_block_hash_with_group_id

    from dualbudget.integration.live import LiveScheduler
    from dualbudget.reference.async_scheduler import make_scheduler

    config = family_config(family, caching=True)
    coordinator = LiveScheduler(config).scheduler.kv_cache_manager.coordinator
    scheduler = make_scheduler(config, profile_named(profile))
    manager = scheduler.kv
    assert isinstance(manager, HybridPrefixCachingKVCacheManager)
    request = kv_group_cases.cache_two_lookups(manager.pool(scheduler.state), config.block_size)
    places = kv_group_cases.TWO_LOOKUPS_PLACES
    hashes = [place.to_bytes(8, "little") for place in range(places)]
    for group, place, block in kv_group_cases.two_lookups_cached():
        coordinator.block_pool.cached_block_hash_to_block.insert(
            make_block_hash_with_group_id(hashes[place], group),
            coordinator.block_pool.blocks[block],
        )
    _, length = manager.get_computed_blocks(scheduler.state, request)
    _, live_length, *_ = coordinator.find_longest_cache_hit(hashes, places * config.block_size)
    assert length == live_length
    drops = profile_named(profile).release.drops_last_hit_block("eagle3")
    together = len(lookup_types(FAMILIES[family])) == 1
    assert length == (2 if drops and together else 3) * config.block_size


def test_a_bounded_replay_window_changes_what_vllm_schedules(
    profile: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DeepSeek V4.1's sliding-window MLA layers replay a prefix hit's last window
    (``bounded_replay``): the group takes no part in the lookup, and the scheduler
    recomputes the window's tokens. A second prompt sharing three blocks with a finished
    one starts 48 tokens in beside a plain window (the reference agrees) and 16 tokens in
    beside a replaying one, so the recorder writes the window and replay refuses it."""
    from dualbudget.integration import live as live_module
    from dualbudget.integration.recorder import settings_of

    config = EngineConfig(
        max_num_batched_tokens=64,
        max_num_seqs=4,
        max_model_len=128,
        block_size=16,
        num_gpu_blocks=64,
        speculative_config=SpeculativeConfig("ngram", 2),
        enable_prefix_caching=True,
        kv_groups=(
            KVGroup("sliding_window_mla", 16, sliding_window=32),
            KVGroup("mla_attention", 16),
        ),
    )
    first = tuple(range(64))
    second = first[:48] + tuple(range(100, 116))
    events = (
        kv_group_cases.add("a", first, 1),
        ScheduleStep(),
        kv_group_cases.sample_ids(a=(7,)),
        kv_group_cases.add("b", second, 1),
        ScheduleStep(),
    )

    def second_prompt_start(handle: Callable[[object], StepRecord | None]) -> int:
        records = [record for event in events if (record := handle(event)) is not None]
        return 64 - records[-1].num_scheduled_tokens["b"]

    lock = Lockstep(config, profile)
    assert second_prompt_start(lock.handle) == 48  # type: ignore[arg-type]
    plain_spec_of = live_module.kv_cache_spec_of

    def replaying(group: KVGroup, engine: EngineConfig) -> object:
        spec = plain_spec_of(group, engine)
        if group.kind == "sliding_window_mla":
            spec = dataclasses.replace(spec, bounded_replay=True)
        return spec

    monkeypatch.setattr(live_module, "kv_cache_spec_of", replaying)
    bounded = live_module.LiveScheduler(config)
    assert second_prompt_start(bounded.handle) == 16  # type: ignore[arg-type]
    recorded = settings_of(bounded.vllm_config, bounded.kv_cache_config)
    assert recorded["prefix_replay_tokens"] == 32
    found = first_unreplayed(recorded, config, profile_named(profile))
    assert found is not None and found[0].name == "prefix_replay_tokens"


def _deepseek_v32_layers(block_size: int) -> dict[str, object]:
    # MLA latents (576 wide) and the indexer's keys: an MLA spec of another head size.
    import torch
    from vllm.v1 import kv_cache_interface as kv

    shape = {"block_size": block_size, "num_kv_heads": 1, "dtype": torch.bfloat16}
    latent = kv.MLAAttentionSpec(head_size=576, **shape)
    keys = kv.MLAAttentionSpec(head_size=132, cache_role=kv.SparseCacheRole.INDEXER, **shape)
    layers: dict[str, object] = {}
    for layer in range(3):
        layers[f"model.layers.{layer}.self_attn.attn"] = latent
        layers[f"model.layers.{layer}.self_attn.indexer.k_cache"] = keys
    return layers


def _dflash_drafter_of_another_head_size(block_size: int) -> dict[str, object]:
    # The target's full attention and a drafter's of fewer, narrower heads, marked as the
    # drafter's own where the release's KVCacheSpec has the field (0.33).
    import dataclasses

    import torch
    from vllm.v1 import kv_cache_interface as kv

    target = kv.FullAttentionSpec(block_size, num_kv_heads=8, head_size=128, dtype=torch.bfloat16)
    drafter = kv.FullAttentionSpec(block_size, num_kv_heads=4, head_size=64, dtype=torch.bfloat16)
    if "is_draft" in {field.name for field in dataclasses.fields(drafter)}:
        drafter = dataclasses.replace(drafter, is_draft=True)
    layers: dict[str, object] = {f"model.layers.{layer}.attn": target for layer in range(4)}
    layers |= {f"drafter.layers.{layer}.attn": drafter for layer in range(2)}
    return layers


ONE_GROUP_LAYERS = {
    "DeepSeek V3.2 + MTP (indexer layers in the MLA group)": _deepseek_v32_layers,
    "Qwen3 dense + DFlash (drafter layers in the target's group)": (
        _dflash_drafter_of_another_head_size
    ),
}
"""Families whose layers' specs differ, as their models give them, yet are one group at
the scheduler: what each family's layers are."""


@pytest.mark.parametrize("family", ONE_GROUP_LAYERS)
def test_layers_of_one_kind_at_one_block_size_make_one_group(family: str, profile: str) -> None:
    """A family's layer specs, grouped by vLLM's own ``get_kv_cache_groups`` and reduced to
    the scheduler's ``KVCacheConfig`` as its engine does (the first layer's spec of the
    ``UniformTypeKVCacheSpecs`` group), are one group: the recorder names it as the
    deployment table's row has it, and that row replays."""
    from vllm.v1 import kv_cache_interface as kv
    from vllm.v1.core.kv_cache_utils import generate_scheduler_kv_cache_config

    from dualbudget.integration.live import LiveScheduler
    from dualbudget.integration.recorder import kv_cache_group_names

    try:
        from vllm.v1.core.kv_cache_planning import get_kv_cache_groups  # 0.33
    except ImportError:
        from vllm.v1.core.kv_cache_utils import get_kv_cache_groups  # 0.32
    (row,) = [d for d in DEPLOYMENTS if d.family == family]
    ((name, group),) = row.groups
    release = profile_named(profile).release
    config = dataclasses.replace(row.config(release), max_model_len=64, num_gpu_blocks=80)
    vllm_config = LiveScheduler(config).vllm_config
    groups = get_kv_cache_groups(vllm_config, ONE_GROUP_LAYERS[family](group.block_size))
    assert [type(g.kv_cache_spec).__name__ for g in groups] == ["UniformTypeKVCacheSpecs"]
    worker = kv.KVCacheConfig(num_blocks=80, kv_cache_tensors=[], kv_cache_groups=groups)
    scheduler_config = generate_scheduler_kv_cache_config([worker])
    assert kv_cache_group_names(scheduler_config) == [name]
    assert scheduler_config.kv_cache_groups[0].kv_cache_spec.block_size == group.block_size
    assert row.verdict(release.version) == "replays"


def test_a_layout_vllm_refuses_is_unsupported_with_its_reason(profile: str) -> None:
    """Mamba outside align mode with prefix caching: both releases refuse it (0.32 by its
    hash block size, 0.33 by name), and the adapter passes vLLM's reason on."""
    from dualbudget.integration.live import LiveScheduler, Unsupported

    config = EngineConfig(
        max_num_batched_tokens=64,
        max_num_seqs=4,
        max_model_len=64,
        block_size=4,
        num_gpu_blocks=80,
        speculative_config=SpeculativeConfig("ngram", 2),
        enable_prefix_caching=True,
        kv_groups=(KVGroup("mamba", 8), KVGroup("full_attention", 4)),
    )
    with pytest.raises(Unsupported) as refused:
        LiveScheduler(config)
    assert "hash_block_size" in refused.value.reason or "align" in refused.value.reason


# Every method the installed release builds (tests/live/test_facts_live.py: vLLM refuses the
# others as the release's policy does).
@pytest.mark.parametrize("layout", installed_layouts())
def test_every_method_builds_the_hybrid_aims_layouts(layout: str, profile: str) -> None:
    """What the hybrid coverage rows' ``reached`` claims (``coverage.COVERAGE``): vLLM
    builds every layout the hybrid aim draws with every method of the table, and steps."""
    from dualbudget.integration.live import LiveScheduler

    for shapes in AIMS["hybrid"].configs.kv_layouts:
        config = EngineConfig(
            max_num_batched_tokens=64,
            max_num_seqs=4,
            max_model_len=64,
            block_size=4,
            num_gpu_blocks=80,
            speculative_config=SpeculativeConfig.for_layout(layout_named(layout), 2),
            kv_groups=tuple(shape.at(4) for shape in shapes),
        )
        live = LiveScheduler(config)
        live.handle(AddRequest("r0", 9, 4))
        record = live.handle(ScheduleStep())
        assert record is not None and record.num_scheduled_tokens["r0"] > 0, shapes


def _planted_is_found(
    name: str, profile: str, plant: Callable[[], None], kind: str, step: int
) -> Scenario:
    """The scenario of ``name`` (``planted_scenario``), which agrees with vLLM, diverges
    on ``kind`` at ``step`` once ``plant`` makes its difference in the reference."""
    scenario = planted_scenario(name, profile)
    found = planted_divergence(scenario, plant)
    assert found is not None, f"{name}: the planted difference went unnoticed"
    assert (found.kind, found.step) == (kind, step), found.report()
    return scenario


def _window_one_token_longer(self: SlidingWindowManager, num_computed_tokens: int) -> int:
    return max(0, num_computed_tokens - self.sliding_window)


def test_a_planted_sliding_window_difference_is_found_on_its_scenario(
    profile: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reference's sliding-window group keeping one token more than vLLM's (so a block
    leaves the window a token late) is found."""

    def plant() -> None:
        monkeypatch.setattr(SlidingWindowManager, "num_skipped_tokens", _window_one_token_longer)

    found = _planted_is_found("sliding-window-late", profile, plant, "free_blocks", 6)
    assert found.config.kv_groups


def _each_group_apart(groups: tuple[KVGroup, ...]) -> tuple[tuple[int, ...], ...]:
    """``lookup_types`` as if no two groups were of one spec: each looked up on its own."""
    return tuple((index,) for group_ids in lookup_types(groups) for index in group_ids)


def test_groups_of_one_spec_looked_up_apart_are_found_where_a_hit_drops_a_block(
    profile: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reference looking each group of one spec up on its own, as vLLM looks up groups
    of different specs. Where EAGLE's hit drops its last block (0.32), the group beside
    the drafter's of its spec no longer drops with it and a hit comes out a block longer:
    found. Where none drops (0.33's lookahead hashes), the two lookups decide alike: the
    full-attention group leads the lookup, so every later hit and the junction are
    bounded by its own, and its scenario agrees both ways."""

    def plant() -> None:
        monkeypatch.setattr(kv_coordinator, "lookup_types", _each_group_apart)

    # Two groups of one spec beside the drafter's, whose hits differ where EAGLE drops.
    if profile_named(profile).release.drops_last_hit_block("eagle"):
        found = _planted_is_found("looked-up-apart", profile, plant, "decision", 38)
        assert any(len(group_ids) > 1 for group_ids in lookup_types(found.config.groups))
    else:
        assert planted_divergence(planted_scenario("looked-up-apart", profile), plant) is None


def _every_block_retained(self: SlidingWindowManager, *args: object) -> list[bool] | None:
    return None


def test_a_planted_dense_retention_is_found_on_its_scenario(
    profile: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reference's sliding-window group caching every block whatever the config's
    ``prefix_cache_retention_interval`` (vLLM's engine default 0 keeps only the blocks a
    replay or a junction resumes at) is found."""

    def plant() -> None:
        monkeypatch.setattr(SlidingWindowManager, "reachable_block_mask", _every_block_retained)

    # A shared prefix cached under retention 0.
    found = _planted_is_found("dense-retention", profile, plant, "decision", 5)
    assert found.config.prefix_cache_retention_interval == 0


def test_a_planted_missing_checkpoint_block_is_found_on_its_scenario(
    profile: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reference's coordinator without caching reserving no Mamba prefill checkpoint
    block (a block fewer than vLLM takes, no decision changed that step) is found, by the
    pools' free blocks."""

    def plant() -> None:
        monkeypatch.setattr(
            HybridKVCacheManager,
            "_reserve_checkpoint",
            _no_checkpoint_without_caching(HybridKVCacheManager._reserve_checkpoint),
        )

    # Mamba align with checkpoint blocks and caching off.
    found = _planted_is_found("missing-checkpoint", profile, plant, "free_blocks", 0)
    assert not found.config.enable_prefix_caching
    assert found.config.mamba_prefill_checkpoint_blocks == 1
