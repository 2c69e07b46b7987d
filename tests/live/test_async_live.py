"""vLLM's ``AsyncScheduler`` in lockstep with the reference: the hand-worked streams of
tests/worked/test_async_reference.py, each decision compared with vLLM's and with the hand-worked
one, then drawn async runs of every method (needs vLLM; see docs/vllm-environments.md)."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from dualbudget.integration.lockstep import ConfigRefused, Lockstep
from dualbudget.integration.testing import (
    installed_layouts,
)
from dualbudget.reference.events import ModelOutput, ScheduleStep
from dualbudget.reference.scheduler import Scheduler
from dualbudget.reference.state import PREEMPTED
from dualbudget.spec.config import EngineConfig, SpeculativeConfig
from dualbudget.spec.methods import LAYOUTS, MethodLayout
from dualbudget.spec.profiles import profile_named
from tests.async_cases import CASES
from tests.planted_scenario import planted_divergence, planted_scenario
from tests.worked_cases import Case

pytestmark = pytest.mark.live


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_hand_worked_case_agrees_with_vllm(case: Case, profile: str) -> None:
    lock = Lockstep(case.config, profile)
    assert type(lock.live.scheduler).__name__ == "AsyncScheduler"
    live_decisions = []
    for event in case.events:
        lock.handle(event)  # raises DivergenceFound at the first differing step
        if isinstance(event, ScheduleStep):
            assert lock.last_live is not None
            live_decisions.append(lock.last_live.decision())
    assert live_decisions == list(case.expected)
    statuses = {str(rid): str(r.status.name) for rid, r in lock.live.scheduler.requests.items()}
    # vLLM frees finished requests; any left must be finished as the reference says.
    for rid, status in statuses.items():
        assert case.finished[rid].upper() == status


def test_hand_worked_async_ngram_case(profile: str) -> None:
    """The first hand-worked stream with ngram at K=2: ngram, like EAGLE-3, reserves no
    slots, and its 0 lookahead (EAGLE-3's is 2) only changes how many of the 64 blocks
    are taken, never what is scheduled, so each step's arithmetic in its comments holds
    unchanged. vLLM 0.33 builds it under model runner V2 (V1 refuses async ngram); 0.32
    refuses async ngram outright, and the reference under the 0.32 profile with it."""
    case = next(c for c in CASES if c.name == "placeholders-and-max-tokens-skip")
    config = replace(case.config, speculative_config=SpeculativeConfig("ngram", 2))
    release = profile_named(profile).release
    if not release.runs_async("ngram", parallel_drafting=False):
        with pytest.raises(
            ConfigRefused, match=rf"vLLM {release.version} refuses async scheduling with 'ngram'"
        ):
            Lockstep(config, profile)
        return
    lock = Lockstep(config, profile)
    assert type(lock.live.scheduler).__name__ == "AsyncScheduler"
    assert lock.live.construction.how.startswith("model runner V2")
    # A release whose only runner is V2 no longer names it.
    assert getattr(lock.live.scheduler, "use_v2_model_runner", True)
    live_decisions = []
    for event in case.events:
        lock.handle(event)
        if isinstance(event, ScheduleStep):
            assert lock.last_live is not None
            live_decisions.append(lock.last_live.decision())
    assert live_decisions == list(case.expected)


def _async_run(lock: Lockstep, rng: random.Random, steps: int = 40) -> None:
    for _ in range(steps):
        if len(lock.requests) < 8 and rng.random() < 0.5:
            lock.add(rng.randint(1, 14), rng.randint(1, 10), rng.randint(0, 2))
        lock.run_step(
            lambda rid, drafts: rng.randint(0, drafts),
            lambda rid: lock.k,
            lambda rid, n: rng.randint(1, n) if rng.random() < 0.15 else 0,
        )


# Every drafter the installed release builds, but ngram's (0.32 runs none of them async).
ASYNC_LAYOUTS = [
    layout
    for layout in LAYOUTS
    if "ngram" not in layout.name and layout.name in installed_layouts()
]


@pytest.mark.parametrize("layout", ASYNC_LAYOUTS, ids=lambda layout: layout.name)
def test_drawn_async_runs_agree(layout: MethodLayout, profile: str) -> None:
    seen = {"stale_output": 0, "in_flight_max_tokens_skip": 0, "natural_stop": 0}
    for seed in range(6):
        rng = random.Random(seed)
        config = EngineConfig(
            max_num_batched_tokens=24,
            max_num_seqs=4,
            max_model_len=32,
            block_size=4,
            num_gpu_blocks=10 + seed,
            scheduling_policy="priority" if seed % 2 else "fcfs",
            speculative_config=SpeculativeConfig.for_layout(layout, 2),
            async_scheduling=True,
        )
        try:
            lock = Lockstep(config, profile, seed=seed)
        except ConfigRefused:
            continue
        _async_run(lock, rng)
        for name in seen:
            seen[name] += lock.reference.observed[name]
    assert all(seen.values()), seen


def test_a_planted_stale_output_bug_is_found_on_its_scenario(
    profile: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reference that drops stale output (as vLLM does only for a connector's hand-off)
    instead of delivering it: on an async scenario whose preempted request has output in
    flight, vLLM's resumed request, which kept the stale tokens, asks for more than the
    reference's.

    (The waiting loop's skip of a request with stale output still to come cannot be
    planted this way: with the engine's batch queue of depth 2 the stale output of a
    preemption always arrives before the next step's waiting loop, and the preempting
    step has none; the hand-worked ``waiting-loop-skips-stale`` stream, three steps in
    flight, pins it against vLLM instead.)"""
    original = Scheduler._update_from_output

    def drop_stale(self: Scheduler, event: ModelOutput) -> None:
        requests = self.state.requests
        waiting = {
            rid: r.num_output_tokens
            for rid, r in requests.items()
            if r.num_stale_output_tokens > 0 and r.status == PREEMPTED
        }
        original(self, event)
        for rid, num_output_tokens in waiting.items():
            if requests[rid].status == PREEMPTED:
                requests[rid].num_output_tokens = num_output_tokens  # the tokens dropped

    found = planted_divergence(
        planted_scenario("stale-output-delivered", profile),
        lambda: monkeypatch.setattr(Scheduler, "_update_from_output", drop_stale),
    )
    assert found is not None, "the planted bug went unnoticed"
    assert (found.kind, found.step) == ("decision", 4), found.report()


def test_a_scheduler_class_of_ones_own_runs_async_with_its_overrides(
    profile: str, scheduler_plugin: str
) -> None:
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler

    from dualbudget.integration.live import LiveScheduler, scheduler_class

    plugin = scheduler_class(scheduler_plugin)
    live = LiveScheduler(CASES[0].config, scheduler_cls=plugin)
    assert isinstance(live.scheduler, AsyncScheduler) and isinstance(live.scheduler, plugin)
    assert live.scheduler.max_num_active_reqs == 1
    sync = LiveScheduler(replace(CASES[0].config, async_scheduling=False))
    assert not isinstance(sync.scheduler, AsyncScheduler)
