"""Which full blocks a sliding-window group caches under vLLM's
``prefix_cache_retention_interval`` (``SlidingWindowManager.reachable_block_mask``,
mirroring vLLM's method of that name), worked by hand; the whole-run
cases are in ``tests/kv_group_cases.py``, live in both releases."""

from __future__ import annotations

import dataclasses
import json

import pytest

from dualbudget.reference.async_scheduler import make_scheduler
from dualbudget.reference.formats.scenario import load_scenario, parse_scenario, scenario_to_json
from dualbudget.reference.kv.coordinator import manager_for
from dualbudget.reference.kv.hybrid_caching import HybridPrefixCachingKVCacheManager
from dualbudget.reference.kv.sliding_window import SlidingWindowManager
from dualbudget.reference.state import RequestState
from dualbudget.spec.config import ConfigError, KVGroup, check_engine_config
from dualbudget.spec.profiles import profile_named
from dualbudget.spec.releases import release_named
from dualbudget.spec.scenario_format import config_to_json
from tests.kv_group_cases import FULL, config, retention_follow_up

WINDOW_8 = KVGroup("sliding_window", 4, sliding_window=8)
"""Blocks of 4: a hit needs cdiv(8 - 1, 4) = 2 contiguous blocks (3 where it drops one)."""


def manager(
    retention: int | None, method: str | None = None, release: str = "0.32"
) -> tuple[HybridPrefixCachingKVCacheManager, SlidingWindowManager]:
    built = manager_for(
        config(
            40,
            WINDOW_8,
            FULL,
            method=method,
            enable_prefix_caching=True,
            prefix_cache_retention_interval=retention,
        ),
        release_named(release),
        0,
        {},
    )
    assert isinstance(built, HybridPrefixCachingKVCacheManager)
    window = built.groups[0]
    assert isinstance(window, SlidingWindowManager)
    return built, window


def kept(mask: list[bool] | None, start: int = 0) -> list[int] | None:
    return None if mask is None else [start + i for i, keep in enumerate(mask) if keep]


def test_dense_retention_caches_every_block() -> None:
    hybrid, window = manager(None)
    assert window.reachable_block_mask(hybrid, RequestState("r", 30, 1), 0, 0, 7) is None


def test_retention_0_keeps_the_tail_a_resend_hits() -> None:
    """No drafter drop: the one replay boundary is 30 - 1 = 29, in block 7; the 2 blocks
    before it, 5 and 6, are the run a resend's hit ends on."""
    hybrid, window = manager(0)
    request = RequestState("r", 30, 1)
    assert hybrid.replay_boundaries(30) == (29,)
    assert kept(window.reachable_block_mask(hybrid, request, 0, 0, 7)) == [5, 6]
    # A later call caches from where the last one stopped.
    assert kept(window.reachable_block_mask(hybrid, request, 0, 6, 7), start=6) == [6]


def test_retention_0_with_a_drop_keeps_the_tails_one_block_on() -> None:
    """EAGLE in 0.32 drops the last hit block of every group: a resend of a 30-token
    prompt lands at 28 - 4 = 24, a longer sibling at 28 - 4 = 24 too; the 3 blocks a
    dropping window needs end one block past 24 // 4 = 6: blocks 4, 5 and 6."""
    hybrid, window = manager(0, method="eagle")
    assert hybrid.drop_groups == (True, True)
    assert hybrid.replay_boundaries(30) == (24,)
    # 32 tokens: a resend lands at 28 - 4 = 24, a sibling at 32 - 4 = 28.
    assert hybrid.replay_boundaries(32) == (24, 28)
    request = RequestState("r", 32, 1)
    assert kept(window.reachable_block_mask(hybrid, request, 0, 0, 8)) == [4, 5, 6, 7]


def test_a_positive_interval_keeps_one_tail_per_segment() -> None:
    """16 tokens a segment: 4 blocks, the last 2 of each (2, 3, 6, 7, ...), and the
    replay boundary's tail (blocks 7, 8 for a 37-token prompt: 36 // 4 = 9)."""
    hybrid, window = manager(16)
    request = RequestState("r", 37, 1)
    assert kept(window.reachable_block_mask(hybrid, request, 0, 0, 9)) == [2, 3, 6, 7, 8]


def test_the_junction_tail_is_kept_and_0_33_keeps_the_one_below_too() -> None:
    """A 40-token prompt, its replay boundaries 32 and 36 (tails ending at blocks 9 and
    10 for a dropping group: blocks 6-9), and a shared-prefix junction at 20 tokens (a
    lookup cut another group's longer hit there): its tail ends at block 20 // 4 + 1 = 6,
    blocks 3-5. 0.33 also keeps the tail one block lower (16: blocks 2-4); 0.32 does not.
    0.33 drops a hit block only with its lookahead hashes off (refused in a trace), so its
    groups are made dropping here."""
    request = RequestState("r", 40, 1)
    for release, expected in (("0.32", [3, 4, 5, 6, 7, 8, 9]), ("0.33", [2, 3, 4, 5, 6, 7, 8, 9])):
        hybrid, window = manager(0, method="eagle", release=release)
        hybrid = dataclasses.replace(hybrid, drop_groups=(True, True))
        hybrid.junctions["r"] = 20
        assert kept(window.reachable_block_mask(hybrid, request, 0, 0, 10)) == expected, release


@pytest.mark.parametrize(("retention", "junction"), [(None, 0), (0, 16)])
def test_a_lookup_cut_by_another_group_sets_the_junction(
    retention: int | None, junction: int
) -> None:
    """``get_computed_blocks``' ``shared_prefix_boundary``, in the follow-up case of
    ``kv_group_cases``: at 0 full attention's 16-token hit is cut to 12 by the window
    group, whose block 3 is uncached, so the junction is 16; at None no group cuts."""
    case = retention_follow_up(retention)
    scheduler = make_scheduler(case.config, profile_named("vllm-0.32"))
    for event in case.events:
        scheduler.handle(event)
    hybrid = scheduler.kv
    assert isinstance(hybrid, HybridPrefixCachingKVCacheManager)
    assert hybrid.junctions == {"r0": 0, "r1": junction}


@pytest.mark.parametrize(
    ("groups", "value", "words"),
    [
        ((WINDOW_8, FULL), -4, "(-4) must be >= 0 and a multiple of the scheduler block size (4)"),
        ((WINDOW_8, FULL), 6, "(6) must be >= 0 and a multiple of the scheduler block size (4)"),
        ((FULL,), 8, "is 8, but no kv_group is sliding-window or Mamba: set it to 0"),
    ],
)
def test_values_vllm_refuses_are_refused_by_name(
    groups: tuple[KVGroup, ...], value: int, words: str
) -> None:
    with pytest.raises(ConfigError, match=r"prefix_cache_retention_interval: ") as err:
        check_engine_config(config(40, *groups, prefix_cache_retention_interval=value))
    assert words in str(err.value)


def test_0_without_a_sliding_window_group_is_accepted() -> None:
    check_engine_config(config(40, FULL, prefix_cache_retention_interval=0))


def test_the_scenario_format_reads_and_writes_the_retention() -> None:
    """Absent (every scenario written before the field) is None; a value is written and
    read back; one vLLM refuses is refused naming the field."""
    scenario = load_scenario("examples/kv-pressure.json")
    assert scenario.config.prefix_cache_retention_interval is None
    assert "prefix_cache_retention_interval" not in config_to_json(scenario.config)
    obj = scenario_to_json(scenario)
    obj["config"]["kv_groups"] = [
        {"kind": "sliding_window", "block_size": 16, "sliding_window": 32},
        {"kind": "full_attention", "block_size": 16},
    ]
    obj["config"]["enable_prefix_caching"] = True
    obj["config"]["prefix_cache_retention_interval"] = 0
    read = parse_scenario(json.loads(json.dumps(obj)))
    assert read.config.prefix_cache_retention_interval == 0
    assert scenario_to_json(read)["config"]["prefix_cache_retention_interval"] == 0
    obj["config"]["prefix_cache_retention_interval"] = 8
    with pytest.raises(ValueError, match=r"prefix_cache_retention_interval: \(8\) must be"):
        parse_scenario(obj)
