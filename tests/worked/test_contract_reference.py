"""The contract C1-C6 as the reference scheduler sees it, one hand-worked case per item.

C1-C3 are checked by the reference after every step (``spec.invariants.step_violations``
on its ledger and on the step's ``T``, true ``D`` and charges): each test here shows the
check silent on the real budget rules and naming exactly its item when the budget
rules the reference runs are planted with a fault that breaks that item alone. C4 is the
run's stall. C5 and C6 speak of what a step could have done, so they are read off the
steps the reference schedules with the predicates the proofs prove
(``one_more_token_fits``, ``dominates``). The predicates themselves are pinned in
tests/unit/test_contract.py; the table of docs/design.md §2 maps each item to both.
"""

from __future__ import annotations

from typing import Any

from dualbudget.reference.events import StepRecord
from dualbudget.reference.formats.scenario import parse_scenario
from dualbudget.reference.runs.driver import ScenarioRun
from dualbudget.spec.invariants import dominates, one_more_token_fits
from dualbudget.spec.policies import StepParams
from tests.planted import planted_rules


def _prompts(*lengths: int) -> list[dict[str, Any]]:
    """Requests ``"0"``, ``"1"``, ... of these prompt lengths, arriving together, one
    output token each."""
    return [{"id": str(i), "prompt_len": n, "max_tokens": 1} for i, n in enumerate(lengths)]


def _scenario(
    profile: str,
    b: int,
    speculative_config: dict[str, Any] | None,
    requests: list[dict[str, Any]],
    **config: Any,
) -> dict[str, Any]:
    """A scenario of ``max_num_batched_tokens`` B = ``b``, no draft accepted, and a KV
    pool that never binds unless ``config`` sets one."""
    fields: dict[str, Any] = {
        "max_num_batched_tokens": b,
        "max_num_seqs": min(4, b),  # vLLM refuses max_num_seqs > max_num_batched_tokens
        "max_model_len": 64,
        "block_size": 16,
        "num_gpu_blocks": 64,
        **config,
    }
    scenario = {"profile": profile, "config": fields, "requests": requests}
    if speculative_config is not None:
        fields["speculative_config"] = speculative_config
        scenario["drafts"] = {"fixed": 0}
    return scenario


def _run(
    scenario: dict[str, Any], max_steps: int | None = 1, **planted: Any
) -> tuple[ScenarioRun, list[StepRecord]]:
    """The reference on ``scenario``, its contract check collecting; ``planted`` replaces
    methods of the budget rules it runs (``reference.budget_rules.BudgetRules``)."""
    run = ScenarioRun(parse_scenario(scenario), max_steps=max_steps, check="collect")
    if planted:
        run.scheduler.rules = planted_rules(run.scheduler.rules, **planted)
    return run, list(run.records())


def _violated(run: ScenarioRun) -> list[tuple[str, int]]:
    return [(v.contract, v.step) for v in run.scheduler.violations]


def test_c1_the_reference_reports_a_negative_budget() -> None:
    # vLLM 0.32 on parallel-drafting ngram, K = 4: slots K - 1 = 3, no draft forward
    # (C(q) = 0). B = 8, one 8-token prompt: room min(8, 8 - 3) = 5, charged (5, 8).
    ngram = {"method": "ngram", "num_speculative_tokens": 4, "parallel_drafting": True}
    scenario = _scenario("vllm-0.32", 8, ngram, _prompts(8))
    run, records = _run(scenario)
    assert records[0].num_scheduled_tokens == {"0": 5}
    assert records[0].budgets_left == {"token_budget": 3, "input_budget": 0}
    assert _violated(run) == []
    # A grant that forgets the input budget gives all 8 tokens, charged (8, 8 + 3): the
    # input budget ends at -3. The ledger still adds up (C2) and T = 8 <= B, D = 0 (C3).
    run, records = _run(scenario, grant=lambda token_budget, _, need: min(need, token_budget))
    assert records[0].budgets_left == {"token_budget": 0, "input_budget": -3}
    assert _violated(run) == [("C1", 0)]


def test_c2_the_reference_reports_a_refund_that_is_not_the_charge() -> None:
    # Priority scheduling, block_size 4, 4 blocks (3 lent), no speculation: step 0, L
    # (priority 5) prefills 4 tokens; step 1, L decodes into a 2nd block and H (priority
    # 0) prefills 4. Step 2: L is scheduled (charged (1, 1)), then H needs a block: the
    # victim is L, already scheduled, so its charge comes back and the step ends with H
    # alone at 20 - 1.
    requests = [
        {"id": "L", "prompt_len": 4, "max_tokens": 6, "priority": 5},
        {"id": "H", "prompt_len": 4, "max_tokens": 3, "priority": 0, "arrival_step": 1},
    ]
    scenario = _scenario(
        "vllm-0.32",
        20,
        None,
        requests,
        max_model_len=12,
        block_size=4,
        num_gpu_blocks=4,
        scheduling_policy="priority",
    )
    run, records = _run(scenario, max_steps=3)
    assert (records[2].preempted, records[2].num_scheduled_tokens) == (["L"], {"H": 1})
    assert records[2].budgets_left == {"token_budget": 19, "input_budget": 19}
    assert _violated(run) == []
    # A book that keeps L's charge on preemption ends at 20 - 2 for one token scheduled.
    run, records = _run(scenario, max_steps=3, give_back=lambda tb, ib, _: (tb, ib))
    assert records[2].budgets_left == {"token_budget": 18, "input_budget": 18}
    assert _violated(run) == [("C2", 2)]


def test_c3_the_reference_reports_a_buffer_overflow() -> None:
    # DSpark fill-in, K = 1: C(q) = K + 1 = 2 draft rows per request, whatever q. B = 4,
    # four 1-token prompts. vLLM 0.32 charges q + (K - 1) = 1 row each: all four fit the
    # input budget, but D = 4 * 2 = 8 > B (its finding). 0.33 caps the requests at
    # B // num_lookahead_tokens = 4 // 2 = 2 and dual charges the 2 true rows: D = 4 = B.
    fill_in = {"method": "dspark", "num_speculative_tokens": 1, "dspark_layout": "fill-in"}
    prompts = _prompts(1, 1, 1, 1)
    run, records = _run(_scenario("vllm-0.32", 4, fill_in, prompts))
    assert (records[0].target_tokens, records[0].draft_rows) == (4, 8)
    assert _violated(run) == [("C3", 0)]
    for profile in ("vllm-0.33", "dual"):
        run, records = _run(_scenario(profile, 4, fill_in, prompts))
        assert (records[0].target_tokens, records[0].draft_rows) == (2, 4), profile
        assert _violated(run) == [], profile


def test_c4_the_reference_reports_a_stall() -> None:
    # vLLM 0.33 on parallel-drafting ngram, K = 2: it admits B = 1 (it checks B >
    # num_lookahead_tokens = 0, not B > slots = K - 1 = 1), then every step is exhausted
    # at input_budget <= slots before a token: the request waits forever.
    ngram = {"method": "ngram", "num_speculative_tokens": 2, "parallel_drafting": True}
    run, records = _run(_scenario("vllm-0.33", 1, ngram, _prompts(1)), max_steps=None)
    assert [record.num_scheduled_tokens for record in records] == [{}]
    assert run.stall is not None and run.stall.unfinished == ("0",)
    # dual charges the true draft rows, C(q) = 0: the same config schedules the token.
    run, records = _run(_scenario("dual", 1, ngram, _prompts(1)), max_steps=None)
    assert records[0].num_scheduled_tokens == {"0": 1}
    assert run.stall is None


def test_c5_the_reference_cuts_a_request_that_one_more_token_fits() -> None:
    # DFlash, K = 1: C(q) = K + 1 = 2 rows whatever q. B = 2, max_num_seqs 1, one 2-token
    # prompt. vLLM 0.32 charges q + slots (slots K = 1): room min(2, 2 - 1) = 1; with a
    # second token the step would hold T = 2 <= 2 and D = 2 <= 2: a token left unused.
    dflash = {"method": "dflash", "num_speculative_tokens": 1}
    scenario = _scenario("vllm-0.32", 2, dflash, _prompts(2), max_num_seqs=1)
    p = StepParams.of(parse_scenario(scenario).config)
    run, records = _run(scenario)
    assert records[0].num_scheduled_tokens == {"0": 1}
    assert one_more_token_fits(p, 0, 0, 0, 1)
    assert _violated(run) == []  # C5 is capacity, not safety: no step check breaks
    # dual grants both tokens, and a third would break T <= B.
    _, records = _run({**scenario, "profile": "dual"})
    assert records[0].num_scheduled_tokens == {"0": 2}
    assert not one_more_token_fits(p, 0, 0, 0, 2)


def test_c6_the_reference_steps_of_a_relaxed_profile_dominate() -> None:
    # DSpark fill-in, K = 1, B = 3, max_num_seqs 2, two 1-token prompts: 0.33's cap
    # B // (K + 1) = 1 takes one, 0.32 both (its C3 finding: D = 4 > 3), so 0.33 does not
    # dominate 0.32 there (the manifest's expected C6 failure); dual >= 0.33 holds.
    fill_in = {"method": "dspark", "num_speculative_tokens": 1, "dspark_layout": "fill-in"}
    scenario = _scenario("vllm-0.33", 3, fill_in, _prompts(1, 1), max_num_seqs=2)
    steps = {
        profile: _run({**scenario, "profile": profile})[1][0]
        for profile in ("dual", "vllm-0.33", "vllm-0.32")
    }

    def measured(profile: str) -> tuple[int, int]:
        record = steps[profile]
        return record.target_tokens, len(record.num_scheduled_tokens)

    assert [measured(profile) for profile in steps] == [(1, 1), (1, 1), (2, 2)]
    for measure in ("tokens", "requests"):
        assert dominates(measure, *measured("dual"), *measured("vllm-0.33"))
        assert not dominates(measure, *measured("vllm-0.33"), *measured("vllm-0.32"))
