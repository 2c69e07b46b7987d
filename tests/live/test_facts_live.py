"""Facts read from the installed vLLM: spec/'s method table and policies must give what
vLLM derives for every speculative config it lets us construct.

For each method row, K and budget: ``max_num_new_slots_for_drafting``,
``num_lookahead_tokens``, the resulting token budget (``max_num_scheduled_tokens``), the
admission cap (``max_num_active_seqs``) and accept/reject of the config. A mismatch names
the table row and the vLLM release it claims to mirror.
"""

from __future__ import annotations

import pytest

from dualbudget.integration.live import Unsupported, build_vllm_config
from dualbudget.integration.testing import installed_layouts, live_profile_name
from dualbudget.spec.config import ConfigError, EngineConfig, SpeculativeConfig
from dualbudget.spec.methods import LAYOUT_NAMES, layout_named
from dualbudget.spec.policies import StepParams
from dualbudget.spec.profiles import profile_named

pytestmark = pytest.mark.live

KS = (1, 2, 4, 7)


@pytest.fixture(scope="module")
def profile():  # type: ignore[no-untyped-def]
    return profile_named(live_profile_name())


def _config(layout: str, k: int, budget: int, seqs: int = 1) -> EngineConfig:
    return EngineConfig(
        max_num_batched_tokens=budget,
        max_num_seqs=seqs,
        max_model_len=256,
        block_size=16,
        num_gpu_blocks=64,
        speculative_config=SpeculativeConfig.for_layout(layout_named(layout), k),
    )


# The rows the installed release builds; test_accept_and_reject_match_the_policy checks
# that vLLM and the release's policy alike refuse the others.
@pytest.mark.parametrize("layout", installed_layouts())
@pytest.mark.parametrize("k", KS)
def test_slots_lookahead_and_budgets_match_the_table(profile, layout: str, k: int) -> None:  # type: ignore[no-untyped-def]
    release = profile.release
    row = layout_named(layout)
    config = _config(layout, k, budget=64, seqs=16)
    vllm_config, construction = build_vllm_config(config)
    where = f"method table row {layout!r} ({release.version}, K={k}, built {construction.how})"
    spec = vllm_config.speculative_config
    assert spec.max_num_new_slots_for_drafting == release.draft_slots(row, k), (
        f"{where}: max_num_new_slots_for_drafting: vLLM"
        f" {spec.max_num_new_slots_for_drafting}, table {release.draft_slots(row, k)}"
    )
    assert vllm_config.num_lookahead_tokens == release.num_lookahead_tokens(row, k), (
        f"{where}: num_lookahead_tokens: vLLM {vllm_config.num_lookahead_tokens},"
        f" table {release.num_lookahead_tokens(row, k)}"
    )
    p = StepParams.of(config)
    opened = profile.policy.open(p)
    sched = vllm_config.scheduler_config
    assert sched.max_num_scheduled_tokens == opened.token_budget, (
        f"{where}: token budget (max_num_scheduled_tokens): vLLM"
        f" {sched.max_num_scheduled_tokens}, {profile.name} {opened.token_budget}"
    )
    active = sched.max_num_active_seqs or sched.max_num_seqs
    assert active == profile.policy.max_active_requests(p), (
        f"{where}: admission cap (max_num_active_seqs): vLLM {active},"
        f" {profile.name} {profile.policy.max_active_requests(p)}"
    )


@pytest.mark.parametrize("layout", list(LAYOUT_NAMES))
@pytest.mark.parametrize("k", (1, 4))
def test_accept_and_reject_match_the_policy(profile, layout: str, k: int) -> None:  # type: ignore[no-untyped-def]
    release = profile.release
    row = layout_named(layout)
    edges = {release.draft_slots(row, k), release.num_lookahead_tokens(row, k)}
    budgets = sorted({b + d for b in edges for d in (-1, 0, 1) if b + d >= 1})
    for budget in budgets:
        config = _config(layout, k, budget)
        try:
            profile.policy.validate(config)
            expected = "accepts"
        except ConfigError as err:
            expected = f"refuses ({err})"
        try:
            build_vllm_config(config)
            observed = "accepts"
        except Unsupported as err:
            observed = f"refuses ({err.reason})"
        assert expected.split()[0] == observed.split()[0], (
            f"method table row {layout!r} ({release.version}, K={k}),"
            f" max_num_batched_tokens={budget}: vLLM {observed}, {profile.name} {expected}"
        )


def test_the_measured_first_step_of_p_eagle(profile) -> None:  # type: ignore[no-untyped-def]
    """A first step measured on vLLM: B=20, max_num_seqs=16, P-EAGLE K=4, two 10-token
    prompts; the second prompt gets what the first left of the input budget."""
    from dualbudget.integration.live import LiveScheduler
    from dualbudget.reference.events import AddRequest, ScheduleStep

    config = EngineConfig(
        max_num_batched_tokens=20,
        max_num_seqs=16,
        max_model_len=256,
        block_size=16,
        num_gpu_blocks=64,
        speculative_config=SpeculativeConfig("eagle3", 4, True),
    )
    if not profile.release.builds(layout_named("p-eagle")):
        # A release that drafts in parallel only for DFlash and DSpark refuses P-EAGLE.
        with pytest.raises(Unsupported, match="parallel_drafting is only supported by"):
            LiveScheduler(config)
        return
    live = LiveScheduler(config)
    live.handle(AddRequest("0", 10, 4, arrival_time=0.0))
    live.handle(AddRequest("1", 10, 4, arrival_time=1.0))
    record = live.handle(ScheduleStep())
    assert record is not None
    assert record.num_scheduled_tokens == {"0": 10, "1": 4}


def test_ngram_parallel_drafting_with_b_at_most_k_minus_1(profile) -> None:  # type: ignore[no-untyped-def]
    """The finding vllm-0.33/ngram-parallel/C4, live: ngram with ``parallel_drafting`` and
    K = 3 reserves K - 1 = 2 slots per request; with max_num_batched_tokens = 2, vLLM 0.32
    refuses the config, while 0.33 (which checks B against num_lookahead_tokens, 0 for
    ngram) accepts it and then never schedules the waiting request."""
    from dualbudget.integration.live import LiveScheduler
    from dualbudget.reference.events import AddRequest, ModelOutput, ScheduleStep

    config = EngineConfig(
        max_num_batched_tokens=2,
        max_num_seqs=1,
        max_model_len=256,
        block_size=16,
        num_gpu_blocks=64,
        speculative_config=SpeculativeConfig("ngram", 3, True),
    )
    # B checked against the slots, or parallel ngram not built at all (0.34 on).
    if not (
        profile.release.caps_own_pass_admission
        and profile.release.builds_parallel_drafting("ngram")
    ):
        with pytest.raises(Unsupported):
            build_vllm_config(config)
        return
    live = LiveScheduler(config)
    live.handle(AddRequest("0", 1, 4, arrival_time=0.0))
    for _ in range(3):
        record = live.handle(ScheduleStep())
        assert record is not None
        assert record.num_scheduled_tokens == {}
        live.handle(ModelOutput({}))


def test_the_long_prefill_threshold_with_chunked_prefill_off(profile) -> None:  # type: ignore[no-untyped-def]
    """tests/unit/test_releases.py's hand-worked first step, on the installed vLLM: 0.32 and
    0.33 cut a 10-token prompt to the threshold of 4 with chunked prefill off; 0.34
    applies the threshold only to chunked prefill (``threshold_needs_chunked_prefill``)."""
    from dualbudget.integration.live import LiveScheduler
    from dualbudget.reference.events import AddRequest, ScheduleStep

    config = EngineConfig(
        max_num_batched_tokens=64,
        max_num_seqs=4,
        max_model_len=64,
        block_size=16,
        num_gpu_blocks=32,
        speculative_config=SpeculativeConfig("eagle3", 2),
        enable_chunked_prefill=False,
        long_prefill_token_threshold=4,
    )
    live = LiveScheduler(config)
    live.handle(AddRequest("0", 10, 3, arrival_time=0.0))
    live.handle(AddRequest("1", 3, 3, arrival_time=1.0))
    record = live.handle(ScheduleStep())
    assert record is not None
    first = 10 if profile.release.threshold_needs_chunked_prefill else 4
    assert record.num_scheduled_tokens == {"0": first, "1": 3}
