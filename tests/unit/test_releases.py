"""The release records: a release is one record, every branch reads it, and a release
that differs from 0.33 in one field changes exactly the decisions that field governs.

Each fictitious release below is vLLM 0.33's record with one field changed, run by the
reference under ``additive`` (0.33's own budget policy); each hand-worked case is written
out in its comment, and the two releases' decisions are asserted step by step.
"""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path
from typing import Any

import pytest

from dualbudget.reference.async_scheduler import AsyncScheduler, make_scheduler
from dualbudget.reference.events import (
    AddRequest,
    DraftProposals,
    Event,
    ModelOutput,
    ScheduleStep,
)
from dualbudget.reference.scheduler import Scheduler
from dualbudget.spec.config import ConfigError, EngineConfig, SpeculativeConfig
from dualbudget.spec.methods import LAYOUT_NAMES, NO_SPECULATION, PerK
from dualbudget.spec.policies import Additive
from dualbudget.spec.profiles import PROFILES, PROPOSAL_NAMES, Profile, release_profile
from dualbudget.spec.releases import (
    RELEASE_VERSIONS,
    RELEASES,
    VLLM_0_33,
    VLLM_0_34,
    Release,
    UnknownRelease,
    release_named,
    release_of,
)
from tests.paths import REPO
from tests.planted import planted_rules
from tests.prefix_cases import P_FORK, STEP, A, P, add, sample
from tests.prefix_cases import config as prefix_config

S = ScheduleStep()


def fictitious(**changed: Any) -> Profile:
    """vLLM 0.33's own profile on a release that differs from 0.33 in ``changed``."""
    release = dataclasses.replace(VLLM_0_33, version="9.99", **changed)
    return Profile("fictitious", Additive(release), "0.33 with one field changed")


def decisions(config: EngineConfig, profile: Profile, events: tuple[Event, ...]) -> list[Any]:
    """(num_scheduled_tokens, scheduled_spec_tokens, preempted) of every step."""
    scheduler = make_scheduler(config, profile)
    out = []
    for event in events:
        record = scheduler.handle(event)
        if record is not None:
            out.append(
                (record.num_scheduled_tokens, record.scheduled_spec_tokens, record.preempted)
            )
    return out


VLLM_0_33_PROFILE = release_profile(VLLM_0_33)


# -- the records ------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("installed", "version"),
    [
        ("0.32.0", "0.32"),
        ("0.33.1", "0.33"),
        ("0.33.0rc1.dev5+g1234abc", "0.33"),
        ("0.32.0+cpu", "0.32"),
        ("0.34.0", "0.34"),
        ("0.35.0", None),
        ("0.3", None),
        ("dev", None),
    ],
)
def test_an_installed_version_maps_to_its_release(installed: str, version: str | None) -> None:
    release = release_of(installed)
    assert (release.version if release else None) == version


def test_an_unknown_release_is_refused_naming_the_known_ones() -> None:
    with pytest.raises(UnknownRelease, match=r"'0\.35' \(known: 0\.32, 0\.33, 0\.34\)"):
        release_named("0.35")
    assert [release_named(v) for v in RELEASE_VERSIONS] == list(RELEASES.values())


def test_every_release_has_both_columns_for_every_layout() -> None:
    for release in RELEASES.values():
        for column in (release.slots, release.lookahead):
            assert set(column) == {NO_SPECULATION.name, *LAYOUT_NAMES}, release.version
            assert all(isinstance(value, PerK) for value in column.values())


def test_each_release_names_its_own_profile_and_every_profile_its_release() -> None:
    for release in RELEASES.values():
        profile = PROFILES[release.profile_name]
        assert profile.release is release and profile.vllm_version == release.version
        assert profile.policy.name == release.budget_policy
    for profile in PROFILES.values():
        # The proofs' numbers and the scheduler's behaviour come from the one record.
        assert profile.policy.release is profile.release
        if profile.vllm_version is None:
            assert profile.release_reason, f"{profile.name}: why it runs on its release"
    for name in PROPOSAL_NAMES:
        assert PROFILES[name].thread is not None


def test_the_reference_runs_on_its_profiles_release() -> None:
    config = prefix_config(12, "eagle3")
    for profile in PROFILES.values():
        scheduler = make_scheduler(config, profile)
        assert scheduler.release is profile.release


def test_make_scheduler_picks_the_async_class() -> None:
    config = prefix_config(12, "eagle3")
    assert type(make_scheduler(config, VLLM_0_33_PROFILE)) is Scheduler
    asynchronous = dataclasses.replace(config, async_scheduling=True)
    assert type(make_scheduler(asynchronous, VLLM_0_33_PROFILE)) is AsyncScheduler
    with pytest.raises(ValueError, match="make_scheduler picks the class"):
        Scheduler(asynchronous, VLLM_0_33_PROFILE)
    with pytest.raises(ValueError, match="make_scheduler picks the class"):
        AsyncScheduler(config, VLLM_0_33_PROFILE)


# -- one field at a time ----------------------------------------------------------------
def test_a_drafter_the_release_does_not_run_async_is_refused() -> None:
    # 0.33 runs async ngram (model runner V2); without ngram among its V2 methods the
    # config is refused, by the async check and nothing else: synchronous, both agree.
    profile = fictitious(async_runner_v2_methods=())
    config = EngineConfig(64, 4, 64, 16, 64, speculative_config=SpeculativeConfig("ngram", 2))
    events: tuple[Event, ...] = (AddRequest("r", 4, 3), S, ModelOutput({"r": 1}), S)
    assert decisions(config, profile, events) == decisions(config, VLLM_0_33_PROFILE, events)
    asynchronous = dataclasses.replace(config, async_scheduling=True)
    assert make_scheduler(asynchronous, VLLM_0_33_PROFILE).config.async_scheduling
    with pytest.raises(ConfigError, match=r"vLLM 9\.99 refuses async scheduling with 'ngram'"):
        make_scheduler(asynchronous, profile)


def test_parallel_drafting_only_for_the_drafters_the_release_names() -> None:
    # P-EAGLE (eagle3 drafting in parallel) builds where the release accepts parallel
    # drafting for eagle3 (0.32, 0.33), and is refused, by name, where only DFlash and
    # DSpark draft in parallel (0.34); DFlash, whose parallel drafting is forced, builds.
    p_eagle = EngineConfig(
        64, 4, 64, 16, 64, speculative_config=SpeculativeConfig("eagle3", 2, True)
    )
    make_scheduler(p_eagle, VLLM_0_33_PROFILE)
    only_own_pass = fictitious(parallel_drafting_methods=("dflash", "dspark"))
    with pytest.raises(
        ConfigError,
        match=r"vLLM 9\.99 supports parallel_drafting only for dflash, dspark, not 'eagle3'",
    ):
        make_scheduler(p_eagle, only_own_pass)
    dflash = dataclasses.replace(p_eagle, speculative_config=SpeculativeConfig("dflash", 2, True))
    make_scheduler(dflash, only_own_pass)
    assert "p-eagle" in VLLM_0_33.layouts and "p-eagle" not in VLLM_0_34.layouts
    assert set(VLLM_0_33.layouts) - set(VLLM_0_34.layouts) == {"ngram-parallel", "p-eagle", "pard"}


def test_the_long_prefill_threshold_with_chunked_prefill_off() -> None:
    # Chunked prefill off, threshold 4, B = 64: prompts of 10 and 3 tokens. 0.33 cuts the
    # first to the threshold (another request could be starved) and admits the second; a
    # release that applies the threshold only to chunked prefill gives the first all 10.
    config = EngineConfig(
        64, 4, 64, 16, 32, speculative_config=SpeculativeConfig("eagle3", 2),
        enable_chunked_prefill=False, long_prefill_token_threshold=4,
    )  # fmt: skip
    events: tuple[Event, ...] = (AddRequest("0", 10, 3), AddRequest("1", 3, 3), S)
    assert decisions(config, VLLM_0_33_PROFILE, events) == [({"0": 4, "1": 3}, {}, [])]
    needs_chunking = fictitious(threshold_needs_chunked_prefill=True)
    assert decisions(config, needs_chunking, events) == [({"0": 10, "1": 3}, {}, [])]
    chunked = dataclasses.replace(config, enable_chunked_prefill=True)
    assert decisions(chunked, needs_chunking, events) == [({"0": 4, "1": 3}, {}, [])]


def test_a_hit_rule_that_drops_the_last_block() -> None:
    # Blocks of 4, eagle3 K = 2, P = 9 ids. r0 = P computes P0 P1; r1 = P then hits both
    # (0.33's lookahead hashes: (9 - 1) // 4 = 2), a full hit: one token, padded to
    # 1 + K = 3 with 2 spec tokens. Dropping eagle3's last hit block leaves P0: 4 tokens
    # hit, the other 5 scheduled, unpadded. Only r1's step differs.
    events = (add("r0", P, 1), STEP, sample(r0=(500,)), add("r1", P, 3), STEP)
    config = prefix_config(12, "eagle3")
    assert decisions(config, VLLM_0_33_PROFILE, events) == [
        ({"r0": 9}, {}, []),
        ({"r1": 3}, {"r1": 2}, []),
    ]
    assert decisions(config, fictitious(block_drop_methods=("eagle3",)), events) == [
        ({"r0": 9}, {}, []),
        ({"r1": 5}, {}, []),
    ]


def test_a_hit_rule_without_lookahead_hashes() -> None:
    # P_FORK shares P's 8 first ids, then differs. 0.33's eagle hash of P1 covers P's 9th
    # id, where the two differ: P_FORK hits P0 alone and is scheduled its other 8. With
    # no lookahead, P1's hash is P_FORK's too: 8 hit, 4 scheduled.
    events = (add("r0", P, 1), STEP, sample(r0=(500,)), add("r1", P_FORK, 3), STEP)
    config = prefix_config(12, "eagle3")
    assert decisions(config, VLLM_0_33_PROFILE, events)[1] == ({"r1": 8}, {}, [])
    assert decisions(config, fictitious(hash_lookahead_methods=()), events)[1] == (
        {"r1": 4},
        {},
        [],
    )


def test_caching_the_verified_output_as_it_comes() -> None:
    # Blocks of 4, draft_model K = 2 (no hit rule of either kind). r0 = A[:5]: step 0
    # computes 5 (caches block 0); it samples 500 and proposes 2 drafts; step 1 verifies
    # 1 + 2 (the allocation caches up to its 6 tokens: still block 0 alone); all 3 are
    # accepted (501, 502, 503), which completes block 1 (A[4], 500, 501, 502) and r0's
    # 4 tokens: done.
    # 0.33 caches block 1 as that output comes, before r0's blocks are freed; without
    # that, block 1 goes back to the pool with no hash. r1 = block 0, block 1, 2 more:
    # 8 of its 10 tokens hit, 2 scheduled; or 4 hit, 6 scheduled.
    r1 = (*A[:5], 500, 501, 502, 900, 901)
    events: tuple[Event, ...] = (
        add("r0", A[:5], 4),
        STEP,
        sample(r0=(500,)),
        DraftProposals({"r0": 2}),
        STEP,
        sample(r0=(501, 502, 503)),
        add("r1", r1, 3),
        STEP,
    )
    config = prefix_config(12, "draft_model")
    first: list[Any] = [({"r0": 5}, {}, []), ({"r0": 3}, {"r0": 2}, [])]
    assert decisions(config, VLLM_0_33_PROFILE, events) == [*first, ({"r1": 2}, {}, [])]
    assert decisions(config, fictitious(caches_verified_output=False), events) == [
        *first,
        ({"r1": 6}, {}, []),
    ]


def test_the_own_pass_admission_cap() -> None:
    # DSpark fill-in, K = 1, B = 3, max_num_seqs = 2, two 1-token prompts. 0.33 caps the
    # running requests at B // num_lookahead_tokens = 3 // 2 = 1: one is admitted. Without
    # the cap both are (0.33 reserves DSpark no slots), and their draft rows 2 + 2 > B
    # break C3, which the collecting check reports.
    config = EngineConfig(
        3, 2, 16, 16, 16, speculative_config=SpeculativeConfig("dspark", 1, True, "fill-in")
    )
    events: tuple[Event, ...] = (AddRequest("0", 1, 2), AddRequest("1", 1, 2), S)
    assert decisions(config, VLLM_0_33_PROFILE, events) == [({"0": 1}, {}, [])]
    uncapped = make_scheduler(config, fictitious(caps_own_pass_admission=False), check="collect")
    for event in events:
        record = uncapped.handle(event)
    assert record is not None and record.num_scheduled_tokens == {"0": 1, "1": 1}
    assert [v.contract for v in uncapped.violations] == ["C3"]


def test_priority_self_preemption_stops_the_running_loop() -> None:
    # Priority scheduling, blocks of 4, 3 blocks (2 lent). L (priority 5, prompt 3) and
    # H (priority 0, prompt 2) hold one block each after step 1. Step 2: L needs a second
    # block for position 5, none is free and L is the lowest priority, so it preempts
    # itself. 0.33 goes on to H (1 token); a release that stops there schedules nothing.
    config = EngineConfig(20, 4, 8, 4, 3, scheduling_policy="priority")
    events: tuple[Event, ...] = (
        AddRequest("L", 3, 4, priority=5),
        S,
        ModelOutput({"L": 1}),
        AddRequest("H", 2, 3, arrival_time=1.0),
        S,
        ModelOutput({"L": 1, "H": 1}),
        S,
    )
    first: list[Any] = [({"L": 3}, {}, []), ({"L": 1, "H": 2}, {}, [])]
    assert decisions(config, VLLM_0_33_PROFILE, events) == [*first, ({"H": 1}, {}, ["L"])]
    stops = fictitious(continues_after_priority_self_preemption=False)
    assert decisions(config, stops, events) == [*first, ({}, {}, ["L"])]


def test_a_waiting_request_granted_nothing_is_requeued_or_stops_the_loop() -> None:
    # No spec policy grants a waiting request nothing (the loop guard leaves room >= 1):
    # the branch is mirrored from vLLM, where only multi-module MTP's prefill lookahead
    # reaches it. Here rules that grant the 5-token request a nothing reaches it:
    # 0.33 requeues a and schedules b (4 tokens); a release that stops schedules none.
    config = EngineConfig(20, 4, 64, 16, 64)
    events: tuple[Event, ...] = (AddRequest("a", 5, 3), AddRequest("b", 4, 3), S)

    def run(profile: Profile) -> tuple[dict[str, int], list[str]]:
        scheduler = make_scheduler(config, profile)
        grant = scheduler.rules.grant

        def refuses_five(token_budget: int, input_budget: int, need: int) -> int:
            return 0 if need == 5 else grant(token_budget, input_budget, need)

        scheduler.rules = planted_rules(scheduler.rules, grant=refuses_five)
        record = None
        for event in events:
            record = scheduler.handle(event) or record
        assert record is not None
        return record.num_scheduled_tokens, scheduler.state.waiting

    assert run(VLLM_0_33_PROFILE) == ({"b": 4}, ["a"])
    assert run(fictitious(requeues_unscheduled_waiting=False)) == ({}, ["a", "b"])


def test_placeholders_resolved_at_a_stop_change_no_decision() -> None:
    # Async eagle3 K = 2: r's step 1 output stops it at its first of 3 tokens. 0.33
    # resolves the placeholders of the 3 tokens returned, a release that trims resolves
    # those of the 1 kept: 6 - 3 = 3 or 6 - 1 = 5 left. r is finished either way, so no
    # decision differs: the field changes the finished request's placeholders alone.
    config = EngineConfig(
        64, 4, 64, 16, 64, speculative_config=SpeculativeConfig("eagle3", 2), async_scheduling=True
    )
    events: tuple[Event, ...] = (
        AddRequest("r", 4, 20),
        S,
        S,
        ModelOutput({"r": 1}, step=0),
        S,
        ModelOutput({"r": 3}, {"r": 1}, step=1),
        S,
    )
    trims = fictitious(resolves_placeholders_of_sampled=False)
    assert decisions(config, trims, events) == decisions(config, VLLM_0_33_PROFILE, events)
    left = {}
    for profile in (VLLM_0_33_PROFILE, trims):
        scheduler = make_scheduler(config, profile)
        for event in events:
            scheduler.handle(event)
        left[profile.name] = scheduler.state.requests["r"].num_output_placeholders
    assert left == {"vllm-0.33": 3, "fictitious": 5}


# -- no version outside the records -----------------------------------------------------
_SOURCES = ("spec", "reference", "proofs", "integration", "dualbudget")
_VERSION_SHAPED = re.compile(r"\d+\.\d+(?:\.\d+)?(?:[a-z+][\w.+]*)?")


def _docstrings(tree: ast.AST) -> set[int]:
    """The string statements of a module: its docstrings and attribute docstrings."""
    found = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        for statement in body if isinstance(body, list) else ():
            if (
                isinstance(statement, ast.Expr)
                and isinstance(statement.value, ast.Constant)
                and isinstance(statement.value.value, str)
            ):
                found.add(id(statement.value))
    return found


def test_no_release_version_is_written_outside_the_records() -> None:
    """A string that names a recorded release (a key, a comparison, a default) lives in
    ``spec/releases.py`` alone: every other module reads the record. Prose that mentions
    a release (docstrings, messages) and the profile names (``vllm-0.33``) are not a
    version string."""
    offenders = []
    for folder in _SOURCES:
        for path in sorted((REPO / folder).rglob("*.py")):
            relative = path.relative_to(REPO)
            if path.resolve() != path.absolute() or relative == Path("spec/releases.py"):
                continue  # a link to another source folder, or the records themselves
            tree = ast.parse(path.read_text())
            prose = _docstrings(tree)
            for node in ast.walk(tree):
                if (
                    isinstance(node, ast.Constant)
                    and isinstance(node.value, str)
                    and id(node) not in prose
                    and _VERSION_SHAPED.fullmatch(node.value)
                    and release_of(node.value) is not None
                ):
                    offenders.append(f"{relative}:{node.lineno}: {node.value!r}")
    assert offenders == []


def test_the_scan_finds_a_version_string() -> None:
    tree = ast.parse('semantics = profile.vllm_version or "0.33"')
    found = [
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and _VERSION_SHAPED.fullmatch(node.value)
        and release_of(node.value) is not None
    ]
    assert found == ["0.33"]


def test_releases_is_the_records_module() -> None:
    assert {type(r) for r in RELEASES.values()} == {Release}
