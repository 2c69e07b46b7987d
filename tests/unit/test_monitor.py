"""The contract monitor without vLLM: each check fires on a hand-made violating step and
not on a good one, and a monitor told a wrong C(q) reports a violation (so it can fail).
The steps are what ``integration.monitor.step_seen`` reads off vLLM (``StepSeen``);
``step_seen`` itself is run on a stand-in of vLLM's scheduler holding the fields it
reads."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import pytest

from dualbudget.integration.monitor import (
    MONITORED,
    Monitor,
    StepSeen,
    Wanted,
    readable,
    step_seen,
    wanted_before,
)
from dualbudget.spec.config import EngineConfig, SpeculativeConfig
from dualbudget.spec.contract import BOOKS_IDS, CONTRACT_IDS
from dualbudget.spec.methods import layout_named

K = 2


def config(layout: str = "dspark-fill-in", **fields: Any) -> EngineConfig:
    base = EngineConfig(
        max_num_batched_tokens=16,
        max_num_seqs=8,
        max_model_len=256,
        block_size=16,
        num_gpu_blocks=64,
        speculative_config=SpeculativeConfig.for_layout(layout_named(layout), K),
    )
    return replace(base, **fields)


def decoding(computed: int = 8, spec: int = K, placeholders: int = 0) -> Wanted:
    """A running request that wants ``1 + spec`` tokens."""
    return Wanted(computed + 1 + spec, placeholders, computed, running=True, blocks_held=(1,))


def waiting(prompt: int, first: bool = True) -> Wanted:
    return Wanted(prompt, 0, 0, running=False, blocks_held=(), first_waiting=first)


def seen(
    scheduled: dict[str, int],
    wanted: dict[str, Wanted],
    *,
    free_blocks: int | None = 32,
    preempted: tuple[str, ...] = (),
    block_sizes: tuple[int, ...] | None = (16,),
    aligned_split: bool = False,
) -> StepSeen:
    return StepSeen(
        step=3,
        scheduled=scheduled,
        preempted=preempted,
        wanted=wanted,
        free_blocks=free_blocks,
        num_running=sum(w.running for w in wanted.values()),
        block_sizes=block_sizes,
        aligned_split=aligned_split,
    )


def contracts(monitor: Monitor, step: StepSeen) -> list[str]:
    return [v.contract for v in monitor.judge(step)]


def test_the_monitor_checks_contract_items() -> None:
    assert set(MONITORED) <= set(CONTRACT_IDS + BOOKS_IDS)
    assert set(BOOKS_IDS) <= set(MONITORED)


# -- C3 ------------------------------------------------------------------------------------
def test_c3_holds_on_a_step_within_the_buffer() -> None:
    # DSpark fill-in: C(q) = K + 1 = 3 per request; 4 decodes: T = 12, D = 12 <= B = 16.
    step = seen({str(i): 1 + K for i in range(4)}, {str(i): decoding() for i in range(4)})
    assert contracts(Monitor(config()), step) == []


def test_c3_fires_on_draft_rows_over_the_buffer() -> None:
    # Six one-token prefill chunks: T = 6, but D = 6 * (K + 1) = 18 > B = 16.
    wanted = {str(i): waiting(1) for i in range(6)}
    step = seen(dict.fromkeys(wanted, 1), wanted)
    monitor = Monitor(config())
    found = monitor.judge(step)
    assert [v.contract for v in found] == ["C3"]
    assert "D=18" in found[0].message and monitor.violations == found


def test_c3_fires_on_target_rows_over_the_cap() -> None:
    wanted = {"a": waiting(20)}
    step = seen({"a": 12}, wanted)
    assert "C3" in contracts(Monitor(config(max_num_scheduled_tokens=10)), step)
    assert "C3" not in contracts(Monitor(config()), step)


def test_a_monitor_told_a_wrong_c_of_q_reports_a_violation() -> None:
    step = seen({str(i): 1 + K for i in range(4)}, {str(i): decoding() for i in range(4)})
    assert contracts(Monitor(config()), step) == []
    wrong = Monitor(config(), draft_rows=lambda q: q + 3)  # 4 * (3 + 3) = 24 > 16
    assert contracts(wrong, step) == ["C3"]


# -- C4 ------------------------------------------------------------------------------------
def test_c4_fires_on_an_empty_step_while_a_waiting_request_fits_the_pool() -> None:
    monitor = Monitor(config())
    found = monitor.judge(seen({}, {"a": waiting(5)}, free_blocks=4))
    assert [v.contract for v in found] == ["C4"]
    assert "waiting request a" in found[0].message


def test_c4_fires_on_an_empty_step_while_a_running_request_fits_its_blocks() -> None:
    assert contracts(Monitor(config()), seen({}, {"a": decoding()}, free_blocks=0)) == ["C4"]


def test_c4_is_not_judged_where_vllm_could_not_run_anything() -> None:
    monitor = Monitor(config(), num_lookahead_tokens=K)
    # No free block for a waiting request (it needs one), none for the running one's
    # next token past its block: an empty step is right.
    assert contracts(monitor, seen({}, {"a": waiting(5)}, free_blocks=0)) == []
    assert contracts(monitor, seen({}, {"a": decoding(computed=15)}, free_blocks=0)) == []
    # Output in flight (async scheduling), a step that preempted, an unreadable pool.
    assert contracts(monitor, seen({}, {"a": decoding(placeholders=1)})) == []
    assert contracts(monitor, seen({}, {"a": waiting(5)}, preempted=("b",))) == []
    assert contracts(monitor, seen({}, {"a": waiting(5)}, free_blocks=None)) == []
    # A waiting request while max_num_seqs run.
    full = {str(i): decoding(placeholders=1) for i in range(8)} | {"w": waiting(5)}
    assert contracts(monitor, seen({}, full)) == []
    # Async scheduling, the last step's output still in flight; judged once it came.
    async_monitor = Monitor(config(async_scheduling=True))
    assert "C4" not in contracts(async_monitor, seen({"a": 1}, {"a": waiting(5)}))
    assert contracts(async_monitor, seen({}, {"a": waiting(5)})) == []
    assert contracts(async_monitor, seen({}, {"a": waiting(5)})) == ["C4"]
    # Chunked prefill off: a prompt longer than the step's cap never runs; nor does a
    # request on a config where one token breaks a hard limit (B below C(1)).
    assert (
        contracts(Monitor(config(enable_chunked_prefill=False)), seen({}, {"a": waiting(17)})) == []
    )
    assert contracts(
        Monitor(config(enable_chunked_prefill=False)), seen({}, {"a": waiting(5)})
    ) == ["C4"]
    assert contracts(Monitor(config(max_num_batched_tokens=2)), seen({}, {"a": waiting(1)})) == []
    # A waiting request behind the queue's first: vLLM's loop stops at the first.
    behind = {"a": waiting(17), "b": waiting(5, first=False)}
    assert contracts(Monitor(config(enable_chunked_prefill=False)), seen({}, behind)) == []
    # A step that schedules something is progress.
    assert "C4" not in contracts(monitor, seen({"a": 1}, {"a": waiting(5)}))


# -- C5 ------------------------------------------------------------------------------------
def test_c5_fires_on_a_request_cut_though_one_more_token_fits() -> None:
    # A 12-token prompt alone, granted 4: T = 5 and D = 3 + 3 = 6 would fit B = 16.
    found = Monitor(config()).judge(seen({"a": 4}, {"a": waiting(12)}))
    assert [v.contract for v in found] == ["C5"]
    assert "granted 4 of the 12" in found[0].message


def test_c5_holds_where_one_more_token_breaks_a_hard_limit() -> None:
    monitor = Monitor(config())
    # T = 16 = B: one more token breaks C3.
    assert contracts(monitor, seen({"a": 16}, {"a": waiting(40)})) == []
    # Four fill-in requests: D = 4 * 3 + 3 = 15 <= 16 but one more row of a fifth would
    # not; for a request already scheduled, D stays (C(q) is K + 1 for every q) and T
    # grows: 13 + 1 <= 16 fits, so a cut request of those four fires.
    wanted = {str(i): waiting(10) for i in range(4)}
    assert contracts(monitor, seen({"0": 10, "1": 1, "2": 1, "3": 1}, wanted)) == ["C5"] * 3
    # Granted all it wanted.
    assert contracts(monitor, seen({"a": 1 + K}, {"a": decoding()})) == []


def test_c5_is_not_judged_where_the_cut_is_not_the_budgets() -> None:
    # A cut at the long-prefill threshold, at a Mamba block boundary, in a step that
    # preempted, or near max_model_len (its margin is 1 or 1 + K by release).
    wanted = {"a": waiting(12)}
    assert contracts(Monitor(config(long_prefill_token_threshold=4)), seen({"a": 4}, wanted)) == []
    assert contracts(Monitor(config()), seen({"a": 4}, wanted, aligned_split=True)) == []
    # A step that preempted: the victim's refund came after the cut.
    assert contracts(Monitor(config()), seen({"a": 4}, wanted, preempted=("b",))) == []
    near = {"a": decoding(computed=256 - 1 - K - 1)}
    assert contracts(Monitor(config()), seen({"a": 1}, near)) == []


# -- several KV groups ---------------------------------------------------------------------
def test_c4_on_several_groups_sums_each_groups_blocks() -> None:
    # Full attention of 16-token blocks and a window of 32: a 20-token prompt needs
    # cdiv(21, 16) + cdiv(21, 32) = 3 blocks at most.
    groups = (16, 32)
    monitor = Monitor(config())
    assert contracts(monitor, seen({}, {"a": waiting(20)}, free_blocks=2, block_sizes=groups)) == []
    found = monitor.judge(seen({}, {"a": waiting(20)}, free_blocks=3, block_sizes=groups))
    assert [v.contract for v in found] == ["C4"] and "at most 3 blocks" in found[0].message
    # On one group of 16 the same pool of 2 would have been enough: the groups count.
    assert contracts(monitor, seen({}, {"a": waiting(20)}, free_blocks=2)) == ["C4"]
    # A running request holding 1 block of each: its 9th token fits both; its 17th
    # needs a second block of the full-attention group only.
    held = replace(decoding(computed=8, spec=0), blocks_held=(1, 1))
    assert contracts(monitor, seen({}, {"r": held}, free_blocks=0, block_sizes=groups)) == ["C4"]
    past = replace(decoding(computed=16, spec=0), blocks_held=(1, 1))
    assert contracts(monitor, seen({}, {"r": past}, free_blocks=0, block_sizes=groups)) == []
    assert contracts(monitor, seen({}, {"r": past}, free_blocks=1, block_sizes=groups)) == ["C4"]


def test_c4_on_several_groups_counts_a_partial_prefix_hit_and_skips_unbounded_groups() -> None:
    # With prefix caching on several groups, a hit ending inside a block costs one more
    # block per group (vLLM's copy on write): 3 + 2 for the 20-token prompt.
    groups, prompt = (16, 32), {"a": waiting(20)}
    caching = Monitor(config(enable_prefix_caching=True))
    assert contracts(caching, seen({}, prompt, free_blocks=4, block_sizes=groups)) == []
    assert contracts(caching, seen({}, prompt, free_blocks=5, block_sizes=groups)) == ["C4"]
    # A group whose blocks the monitor cannot bound (Mamba's): C4 is not judged.
    assert contracts(Monitor(config()), seen({}, prompt, free_blocks=64, block_sizes=None)) == []


def test_c5_on_several_groups_is_judged_unless_vllm_splits_at_mamba_blocks() -> None:
    # A 12-token prompt granted 4 while one more fits: the KV groups do not cut grants.
    wanted = {"a": waiting(12)}
    several = seen({"a": 4}, wanted, block_sizes=(16, 32))
    assert contracts(Monitor(config()), several) == ["C5"]
    mamba = seen({"a": 4}, wanted, block_sizes=None, aligned_split=True)
    assert contracts(Monitor(config()), mamba) == []


def test_a_planted_c_of_q_is_caught_on_several_groups() -> None:
    step = seen(
        {str(i): 1 + K for i in range(4)},
        {str(i): replace(decoding(), blocks_held=(1, 1)) for i in range(4)},
        block_sizes=(16, 32),
    )
    assert contracts(Monitor(config()), step) == []
    assert contracts(Monitor(config(), draft_rows=lambda q: q + 3), step) == ["C3"]


# -- reading vLLM ----------------------------------------------------------------------------
class FullAttentionManager(SimpleNamespace):
    """Stands in for vLLM's manager of that name (the monitor reads its class name)."""

    def __init__(self, block_size: int) -> None:
        super().__init__(block_size=block_size)


class MambaManager(FullAttentionManager):
    """Stands in for vLLM's Mamba manager, whose blocks the monitor does not bound."""


def test_block_sizes_are_read_off_vllms_own_managers() -> None:
    from dualbudget.integration.monitor import block_sizes

    def scheduler(*managers: object) -> Any:
        coordinator = SimpleNamespace(single_type_managers=managers)
        return SimpleNamespace(kv_cache_manager=SimpleNamespace(coordinator=coordinator))

    assert block_sizes(scheduler(FullAttentionManager(16), FullAttentionManager(64))) == (16, 64)
    assert block_sizes(scheduler(FullAttentionManager(16), MambaManager(1024))) is None


def _request(rid: str, computed: int, with_spec: int, finished: bool = False) -> Any:
    return SimpleNamespace(
        request_id=rid,
        num_computed_tokens=computed,
        num_tokens_with_spec=with_spec,
        num_output_placeholders=0,
        is_finished=lambda: finished,
    )


def test_step_seen_reads_what_each_request_wanted_before_the_step() -> None:
    running, new, done = _request("r", 8, 11), _request("w", 0, 12), _request("f", 3, 3, True)
    blocks = {"r": ([1],)}
    scheduler = SimpleNamespace(
        running=[running],
        waiting=[new],
        requests={"r": running, "w": new, "f": done},
        kv_cache_manager=SimpleNamespace(
            get_block_ids=lambda rid: blocks.get(rid, ([],)),
            block_pool=SimpleNamespace(get_num_free_blocks=lambda: 5),
            coordinator=SimpleNamespace(single_type_managers=(FullAttentionManager(16),)),
        ),
    )
    assert readable(scheduler) and not readable(SimpleNamespace(requests={}))
    before = wanted_before(scheduler)
    assert set(before) == {"r", "w"}
    assert before["r"] == Wanted(11, 0, 8, running=True, blocks_held=(1,))
    assert before["w"].first_waiting and not before["r"].first_waiting
    # vLLM's schedule(): "w" hit 4 cached tokens and was granted 4 more, "r" its 3.
    new.num_computed_tokens, running.num_computed_tokens = 8, 11
    step = step_seen(scheduler, 0, {"r": 3, "w": 4}, [], before)
    assert step.wanted["w"].num_computed_tokens == 4
    assert step.wanted["r"].num_computed_tokens == 8
    assert (step.free_blocks, step.num_running, step.block_sizes) == (5, 1, (16,))
    assert not step.aligned_split
    found = Monitor(config()).judge(step)
    assert [v.contract for v in found] == ["C5"]  # "w" wanted 8, got 4: T = 7, D = 6


@pytest.mark.parametrize(
    ("profile", "layout", "batched", "model_len", "k"),
    [
        # The configs the long fuzz campaigns stalled on (the manifest's row says so).
        ("vllm-0.33", "ngram-parallel", 48, 48, 3),
        ("vllm-0.32", "dspark-anchor", 64, 64, 5),
        ("vllm-0.32", "dflash", 14, 12, 4),
        ("vllm-0.32", "ngram-parallel", 64, 64, 4),
    ],
)
def test_a_stall_on_a_prompt_that_never_fits_whole_is_known_only_with_chunking_off(
    profile: str, layout: str, batched: int, model_len: int, k: int
) -> None:
    from dualbudget.integration.outcome import known_as

    key = (profile, layout, "C4")
    unchunked = replace(
        config(layout, max_num_batched_tokens=batched, max_model_len=model_len, max_num_seqs=2),
        enable_chunked_prefill=False,
        speculative_config=SpeculativeConfig.for_layout(layout_named(layout), k),
    )
    assert known_as(key, unchunked, frozenset({key})) == "outside_model.unchunked-prompt-stall"
    # Chunked prefill on: the prompt is cut to fit, so a stall there would be new.
    assert known_as(key, replace(unchunked, enable_chunked_prefill=True), frozenset({key})) is None
    # A budget that takes the longest prompt vLLM accepts and the slots: new too.
    slots = _slots(profile, unchunked)
    roomy = replace(unchunked, max_num_batched_tokens=model_len - 1 + slots)
    assert known_as(key, roomy, frozenset({key})) is None


def _slots(profile: str, config: EngineConfig) -> int:
    from dualbudget.proofs.causes import SETTINGS

    return SETTINGS["max_num_new_slots_for_drafting"](profile, config)


# -- the fallback -------------------------------------------------------------------------
def test_no_matching_profile_fails_unless_the_monitor_alone_is_asked_for(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from dualbudget.integration import commands, detect

    scenario = detect.DETECTION_SCENARIOS[3].name
    unknown = detect.Detection(
        profile=None,
        vllm_version="0.35.0.dev7",
        how="decisions",
        failures={"vllm-0.34": detect.Failure(scenario, "decision at step 2")},
    )
    monkeypatch.setattr(detect, "detect", lambda: unknown)
    options = commands.FuzzOptions(known_findings=frozenset({("vllm-0.33", "eagle", "C5")}))
    # The scheduler departs from every profile: the verdict names the nearest.
    with pytest.raises(commands.NoProfileMatches) as differs:
        commands.fuzz_profile(options, "0.35.0.dev7")
    assert differs.value.verdict == (
        "FAIL: vLLM 0.35.0.dev7 decides as no profile; nearest vllm-0.34, which it first"
        f" departs from on {scenario}: decision at step 2"
    )
    # Asked for the monitor alone: the newest release's configs, no finding of the
    # manifest's taken as this one's.
    alone = replace(options, monitor_only=True)
    profile, how, known = commands.fuzz_profile(alone, "0.35.0.dev7")
    assert (profile, how, known) == ("vllm-0.34", commands.MONITOR_ALONE, frozenset())
    out = capsys.readouterr().out
    assert "no profile matches its decisions" in out and "--monitor-only" in out
    # A given profile is kept, with its known findings.
    given = replace(options, profile="vllm-0.32")
    assert commands.fuzz_profile(given, "0.35.0.dev7") == (
        "vllm-0.32",
        "--profile",
        options.known_findings,
    )


# -- known findings, by cause ---------------------------------------------------------------
def test_multi_module_mtps_reserve_and_stall_are_known_only_under_multi_module_mtp() -> None:
    """The lookahead reserve's cut grants (C5) need K > 1 modules; its stall (C4) also a
    long-prefill threshold below K. One module, or EAGLE, reads one token: neither."""
    from dualbudget.integration.outcome import known_as

    mtp = replace(
        config("eagle", max_num_batched_tokens=32, max_num_seqs=2),
        speculative_config=SpeculativeConfig("mtp", 3),
        num_nextn_predict_layers=3,
        long_prefill_token_threshold=2,
    )
    one_module = replace(mtp, num_nextn_predict_layers=1)
    for profile in ("vllm-0.32", "vllm-0.33"):
        c4, c5 = ((profile, "eagle", item) for item in ("C4", "C5"))
        known = frozenset({c4, c5})
        assert known_as(c5, mtp, known) == "outside_model.prefill-lookahead-reserve"
        assert known_as(c4, mtp, known) == "outside_model.prefill-lookahead-stall"
        at_k = replace(mtp, long_prefill_token_threshold=3)
        assert known_as(c4, at_k, known) is None
        assert known_as(c5, one_module, known) is None
        assert known_as(c4, one_module, known) is None


def test_a_break_is_labelled_with_the_finding_whose_cause_its_config_meets() -> None:
    from dualbudget.integration.outcome import known_as

    key = ("vllm-0.33", "ngram-parallel", "C4")
    known = frozenset({key})
    ngram = config("ngram-parallel", max_num_batched_tokens=32, max_num_seqs=4)
    k = ngram.num_speculative_tokens
    # B <= K - 1: 0.33's budget deadlock, the proofs' finding.
    deadlock = replace(ngram, max_num_batched_tokens=k - 1, max_num_seqs=1)
    assert known_as(key, deadlock, known) == "vllm-0.33/ngram-parallel/C4"
    # max_num_scheduled_tokens < 1 + K <= B: vLLM's padding, outside the spec's model.
    padded = replace(ngram, max_num_scheduled_tokens=k)
    assert known_as(key, padded, known) == "outside_model.padding-stall"
    assert known_as(("vllm-0.32", *key[1:]), padded, known | {("vllm-0.32", *key[1:])}) == (
        "outside_model.padding-stall"
    )
    # A config meeting neither cause: the stall is new, though the key has findings.
    assert known_as(key, ngram, known) is None
    # P-EAGLE under 0.33 (4 slots for K = 5): the padded 1 + K rows and the slots
    # exceed B = 8 though S = B >= 1 + K.
    p_eagle = ("vllm-0.33", "p-eagle", "C4")
    padded_charge = replace(
        config("p-eagle", max_num_batched_tokens=8, max_num_seqs=2),
        speculative_config=SpeculativeConfig.for_layout(layout_named("p-eagle"), 5),
    )
    assert known_as(p_eagle, padded_charge, frozenset({p_eagle})) == "outside_model.padding-stall"
    roomy = replace(padded_charge, max_num_batched_tokens=10)
    assert known_as(p_eagle, roomy, frozenset({p_eagle})) is None
    # Not known to the caller (the monitor alone on an unknown version), or known by a
    # caller's own list with no manifest row: as itself.
    assert known_as(key, deadlock, frozenset()) is None
    own = ("vllm-0.33", "pard", "C5")
    assert known_as(own, ngram, frozenset({own})) == "vllm-0.33/pard/C5"


def test_a_cause_condition_reads_vllms_settings_and_refuses_anything_else() -> None:
    from dualbudget.proofs.causes import parse_condition
    from dualbudget.spec.errors import BadInput

    cond = parse_condition(
        "max_num_scheduled_tokens < 1 + num_speculative_tokens or block_size == 8"
    )
    assert cond.holds("vllm-0.33", config(max_num_scheduled_tokens=K))
    assert not cond.holds("vllm-0.33", config(max_num_scheduled_tokens=K + 1))
    assert cond.holds("vllm-0.33", config(block_size=8))
    both = parse_condition("max_num_batched_tokens - 2 >= 14 and max_num_seqs > 7")
    assert both.holds("vllm-0.33", config())
    # The drafting slots are the profile's release's: K - 1 for DSpark under 0.32, 0
    # under 0.33.
    slots = parse_condition("max_num_new_slots_for_drafting == num_speculative_tokens - 1")
    assert slots.holds("vllm-0.32", config()) and not slots.holds("vllm-0.33", config())
    for bad in ("max_num_batched_tokens", "__import__ < 1", "max_num_seqs < 1 2", "1 <"):
        with pytest.raises(BadInput, match="condition"):
            parse_condition(bad)
