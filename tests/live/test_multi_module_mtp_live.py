"""Multi-module MTP against the installed vLLM's own scheduler, built on an EAGLE
drafter relabelled MTP with ``num_nextn_predict_layers`` modules (``integration.live``):
the hand-worked cases of ``tests/worked/test_multi_module_mtp.py``, then crowds of requests on
a full-attention and a sliding-window + full-attention layout, sync and async, caching on
and off, each decided alike step by step."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from dualbudget.integration.lockstep import ConfigRefused, Lockstep, MirroredCrash
from dualbudget.reference.events import InvalidEvent
from dualbudget.reference.formats.scenario import validate
from dualbudget.reference.formats.trace import read_trace
from dualbudget.reference.runs.replay import replay_trace
from dualbudget.reference.runs.workload import preset
from dualbudget.spec.config import KVGroup, SpeculativeConfig, runs_async
from dualbudget.spec.profiles import profile_named
from tests.multi_module_mtp_cases import MAMBA_ALIGN, PROMPT, SHARED, K, mtp_config, sibling_run

pytestmark = pytest.mark.live


@pytest.mark.parametrize("caching", [False, True], ids=["no-caching", "caching"])
@pytest.mark.parametrize("modules", [1, 3])
def test_the_hand_worked_chunks_agree_live(modules: int, caching: bool, profile: str) -> None:
    """PROMPT, a longer prompt behind it: the first chunk is 7 tokens with 3 modules, 8
    with one, in vLLM as in the reference; the run goes on until both finish."""
    config = mtp_config(modules, enable_prefix_caching=caching)
    lock = Lockstep(config, profile)
    lock.add(len(PROMPT), 4, prompt_token_ids=PROMPT)
    lock.add(30, 4, prompt_token_ids=tuple(range(500, 530)))
    first, _ = lock.run_step(lambda rid, drafts: drafts, lambda rid: K)
    assert first.num_scheduled_tokens["0"] == (7 if modules > 1 else 8)
    for _ in range(12):
        lock.run_step(lambda rid, drafts: drafts, lambda rid: K)


LAYOUTS = {
    "full attention": (),
    "sliding window + full": (
        KVGroup("sliding_window", 4, sliding_window=8),
        KVGroup("full_attention", 4, is_eagle_group=True),
    ),
}


@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_sibling_hit_agrees_live(layout: str, profile: str) -> None:
    """tests/worked/test_multi_module_mtp.py's sibling case, on each layout: vLLM caches the
    same blocks of the first SHARED as the reference, so the second one is scheduled
    alike. One module schedules it otherwise than three where the re-prefillable tokens
    go uncached: one group (the unitary coordinator leaves them out of every block), or
    a group that drops a hit's last block (the drafter's, in 0.32); 0.33's hybrid
    coordinator drops none with caching on, and caches them."""
    schedules = []
    for modules in (3, 1):
        config = mtp_config(modules, enable_prefix_caching=True, kv_groups=LAYOUTS[layout])
        lock = Lockstep(dataclasses.replace(config, num_gpu_blocks=129), profile)
        lock.add(len(SHARED), 4, prompt_token_ids=SHARED)
        lock.add(30, 4, prompt_token_ids=tuple(range(500, 530)))
        lock.run_step(lambda rid, drafts: drafts, lambda rid: 0)
        sibling = lock.add(len(SHARED), 4, prompt_token_ids=SHARED)
        scheduled = []
        for _ in range(2):
            record, _ = lock.run_step(lambda rid, drafts: drafts, lambda rid: 0)
            scheduled.append(record.num_scheduled_tokens.get(sibling, 0))
        if not LAYOUTS[layout]:
            assert scheduled == sibling_run(modules, profile)
        schedules.append(scheduled)
    drops = profile_named(profile).release.drops_last_hit_block("mtp")
    assert (schedules[0] != schedules[1]) == (not LAYOUTS[layout] or drops)


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("caching", [False, True], ids=["no-caching", "caching"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_crowd_runs_in_lockstep(
    layout: str, caching: bool, async_scheduling: bool, profile: str
) -> None:
    """Prompts sharing a system prompt, chunked by a small budget so that chunks end near
    their prompts' ends, repeats and later turns arriving as the pool evicts: the
    reference and vLLM agree on every step, and the lookahead cuts some chunks (the same
    run with one module schedules otherwise)."""
    groups = LAYOUTS[layout]
    config = mtp_config(
        3,
        max_num_batched_tokens=20,
        long_prefill_token_threshold=0,
        num_gpu_blocks=max(len(groups), 1) * 40 + 1,
        enable_prefix_caching=caching,
        async_scheduling=async_scheduling,
        kv_groups=groups,
    )
    runs = []
    for modules in (3, 1):
        lock = Lockstep(dataclasses.replace(config, num_nextn_predict_layers=modules), profile)
        system = tuple(range(1000, 1010))
        prompts = [system + tuple(range(100 * n, 100 * n + 3 + 5 * n)) for n in range(4)]
        for prompt in prompts:
            lock.add(len(prompt), 5 + len(prompt) % 4, prompt_token_ids=prompt)
        records = []
        for step in range(40):
            if step % 5 == 4:
                earlier = prompts[step % len(prompts)]
                again = earlier if step % 10 == 4 else (*earlier, 7, 7, 7)
                lock.add(len(again), 4, prompt_token_ids=again)
            record, _ = lock.run_step(lambda rid, drafts: drafts // 2, lambda rid: K)
            records.append(record.num_scheduled_tokens)
        runs.append(records)
        if caching:
            assert lock.reference.observed["prefix_hit"] > 0
    assert runs[0] != runs[1]


def test_a_short_scheduler_block_is_refused_where_vllm_refuses_it(profile: str) -> None:
    """Blocks of 2 tokens under K = 3 with caching: 0.32 (which drops a hit's last block
    for MTP) refuses the config, and so does the reference; 0.33 runs it."""
    config = mtp_config(3, block_size=2, enable_prefix_caching=True)
    release = profile_named(profile).release
    if release.drops_last_hit_block("mtp"):
        with pytest.raises(ConfigRefused):
            Lockstep(config, profile)
        return
    lock = Lockstep(config, profile)
    lock.add(len(PROMPT), 4, prompt_token_ids=PROMPT)
    for _ in range(6):
        lock.run_step(lambda rid, drafts: drafts, lambda rid: K)


def test_a_recorded_multi_module_trace_replays_agreeing(profile: str, tmp_path: Path) -> None:
    """A scheduler-level trace of vLLM at its defaults (prefix caching, async where the
    release runs MTP async) with three MTP modules: the recorder reads the modules from
    the live config, and the trace replays agreeing; read as one module it does not."""
    from dualbudget.integration.scheduler_trace import write_scheduler_trace

    scenario = preset("chat-system-prompt").scenario(0)
    release = profile_named(profile).release
    spec = SpeculativeConfig("mtp", K)
    config = dataclasses.replace(
        scenario.config,
        speculative_config=spec,
        num_nextn_predict_layers=3,
        enable_prefix_caching=True,
        async_scheduling=runs_async(spec, release),
        long_prefill_token_threshold=24,
    )
    scenario = validate(dataclasses.replace(scenario, profile=profile, config=config))
    path = tmp_path / "mtp.ndjson"
    assert write_scheduler_trace(scenario, path, 30) == 30
    trace = read_trace(path)
    assert trace.header.settings["num_nextn_predict_layers"] == 3
    assert trace.header.config.num_prefill_lookahead_tokens == K
    result = replay_trace(trace)
    assert result.ok and result.steps_checked == 30, result.divergence
    one_module = dataclasses.replace(
        trace,
        header=dataclasses.replace(
            trace.header,
            config=dataclasses.replace(trace.header.config, num_nextn_predict_layers=1),
        ),
    )
    if release.num_hash_lookahead_tokens("mtp"):
        # 0.33's hashes cover the K tokens after each block, one module's only one.
        with pytest.raises(InvalidEvent, match="block hashes"):
            replay_trace(one_module)
    else:
        assert not replay_trace(one_module).ok


def test_vllm_indexes_past_the_lookahead_hashes_without_full_attention(profile: str) -> None:
    """A lone sliding-window group with prefix caching: 0.33 hashes each block with the K
    tokens after it, and its sliding-window search starts at the block num_tokens - 1
    ends in, past a 10-token prompt's one hash: vLLM raises IndexError and the reference
    its mirrored crash. 0.32 hashes no token ahead, and schedules the prompt; so does
    0.33 with one module."""
    window = (KVGroup("sliding_window", 4, sliding_window=8),)
    config = mtp_config(3, enable_prefix_caching=True, kv_groups=window)
    release = profile_named(profile).release
    for modules in (1, 3):
        lock = Lockstep(dataclasses.replace(config, num_nextn_predict_layers=modules), profile)
        lock.add(len(PROMPT), 4, prompt_token_ids=PROMPT)
        if modules > 1 and release.num_hash_lookahead_tokens("mtp"):
            with pytest.raises(MirroredCrash, match="live: IndexError") as crashed:
                lock.run_step(lambda rid, drafts: drafts, lambda rid: K)
            assert crashed.value.crash == "lookup-past-lookahead-hashes"
        else:
            record, _ = lock.run_step(lambda rid, drafts: drafts, lambda rid: K)
            assert record.num_scheduled_tokens["0"] == len(PROMPT)


@pytest.mark.parametrize("threshold", [2, 3])
def test_a_long_prefill_threshold_below_k_stalls_a_prefill_for_ever(
    threshold: int, profile: str
) -> None:
    """Three modules, K = 3, a 9-token prompt with another request waiting behind it
    (``max_num_seqs`` 1, so vLLM applies the threshold): chunks of ``threshold`` tokens
    until 3 are left; at a threshold of 2 the next chunk would end 1 token short of the
    end, the reserve cuts it to none, and every step is empty with the budgets and the
    pool free, in vLLM as in the reference. The monitor's C4 break is the manifest's
    ``prefill-lookahead-stall``; at a threshold of K the prompt finishes."""
    from dualbudget.fuzz_cli import known_findings
    from dualbudget.integration.lockstep import run_in_lockstep
    from dualbudget.integration.monitor import MonitorViolation
    from dualbudget.integration.outcome import known_as
    from dualbudget.reference.formats.scenario import Acceptance, RequestSpec, Scenario

    config = mtp_config(3, max_num_seqs=1, long_prefill_token_threshold=threshold)
    requests = (RequestSpec("0", 9, 2), RequestSpec("1", 4, 2))
    scenario = validate(Scenario(profile, config, requests, Acceptance(fixed=0)))
    beside: list[MonitorViolation] = []
    steps, divergence = run_in_lockstep(scenario, max_steps=12, monitored=beside)
    assert divergence is None  # the reference stalls as vLLM does
    if threshold == K:
        assert beside == [] and steps > 4
        return
    # Chunks of 2 until 3 tokens are left (3 steps), then a fixed point: an empty step.
    assert steps == 4 and [(v.contract, v.step) for v in beside] == [("C4", 3)], beside
    key = (profile, "eagle", "C4")
    assert known_as(key, config, known_findings()) == "outside_model.prefill-lookahead-stall"


def test_a_mamba_chunk_ends_where_vllm_ends_it(profile: str) -> None:
    """tests/worked/test_multi_module_mtp.py's Mamba case against vLLM: the 14-token prompt's
    first chunk is 8 tokens in vLLM as in the reference, and the run goes on alike."""
    config = mtp_config(3, long_prefill_token_threshold=0, enable_prefix_caching=True)
    lock = Lockstep(dataclasses.replace(config, kv_groups=MAMBA_ALIGN), profile)
    lock.add(14, 4, prompt_token_ids=tuple(range(200, 214)))
    first, _ = lock.run_step(lambda rid, drafts: drafts, lambda rid: K)
    assert first.num_scheduled_tokens["0"] == 8
    for _ in range(6):
        lock.run_step(lambda rid, drafts: drafts, lambda rid: K)
