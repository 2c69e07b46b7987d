"""The upstream proposals as profiles (pr-53080, pr-52996, fork-605), run through the
reference: the cases their threads state, pinned step by step, and where each differs from
the releases and from ``dual``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dualbudget.cli import main
from dualbudget.reference.events import StepRecord
from dualbudget.reference.formats.scenario import parse_scenario
from dualbudget.reference.runs.driver import ScenarioRun
from dualbudget.spec.book import StepBook
from dualbudget.spec.methods import LAYOUTS, layout_named
from dualbudget.spec.policies import Ledger, StepParams
from dualbudget.spec.profiles import PROPOSAL_NAMES, profile_named

UPSTREAM = ("pr-53080", "pr-52996", "fork-605")


def scenario_json(
    prompts: list[int], budget: int, spec: dict[str, Any], profile: str, *, seqs: int = 8
) -> dict[str, Any]:
    return {
        "profile": profile,
        "config": {
            "max_num_batched_tokens": budget,
            "max_num_seqs": seqs,
            "max_model_len": 64,
            "block_size": 4,
            "num_gpu_blocks": 256,
            "speculative_config": spec,
        },
        "requests": [
            {"id": f"r{i}", "prompt_len": n, "max_tokens": 4} for i, n in enumerate(prompts)
        ],
    }


def first_step(prompts: list[int], budget: int, spec: dict[str, Any], profile: str) -> StepRecord:
    run = ScenarioRun(
        parse_scenario(scenario_json(prompts, budget, spec, profile)), max_steps=1, check="collect"
    )
    record = next(run.records())
    assert not run.scheduler.violations, [v.message for v in run.scheduler.violations]
    return record


DSPARK_K4 = {"method": "dspark", "num_speculative_tokens": 4}
DFLASH_K3 = {"method": "dflash", "num_speculative_tokens": 3}


def test_pr_52996_two_prefills_get_their_whole_prompts() -> None:
    # vllm-project/vllm#52996's first case: B = 16, DSpark K = 4, two 8-token prefills.
    # The target stage holds 8 + 8 = 16 tokens; the separate draft budget 16 - 4 - 4 = 8.
    record = first_step([8, 8], 16, DSPARK_K4, "pr-52996")
    assert record.num_scheduled_tokens == {"r0": 8, "r1": 8}
    assert record.budgets_left == {"token_budget": 0, "input_budget": 8}
    # Without the change (vLLM 0.32: 8 + (K-1) = 11 rows for r0) the second gets 16-11-3 = 2,
    # the number the thread reports for its test before the fix.
    assert first_step([8, 8], 16, DSPARK_K4, "vllm-0.32").num_scheduled_tokens == {
        "r0": 8,
        "r1": 2,
    }


def test_pr_52996_draft_budget_admits_four_of_five() -> None:
    # The second case: five 1-token requests; K = 4 query rows each of the draft budget 16.
    record = first_step([1] * 5, 16, DSPARK_K4, "pr-52996")
    assert record.num_scheduled_tokens == {f"r{i}": 1 for i in range(4)}
    assert record.draft_rows == 16  # the anchor layout's true rows: K per request
    assert record.budgets_left == {"token_budget": 12, "input_budget": 0}


def test_pr_52996_leaves_dflash_additive_and_fork_605_separates_it() -> None:
    # DFlash K = 3, one 16-token prefill, B = 16. pr-52996 is vLLM 0.32 here: q + K rows,
    # so the request gets 16 - 3 = 13. fork-605 charges K + 1 = 4 query rows of the separate
    # budget and gives the target stage all 16.
    assert first_step([16], 16, DFLASH_K3, "pr-52996").num_scheduled_tokens == {"r0": 13}
    assert first_step([16], 16, DFLASH_K3, "vllm-0.32").num_scheduled_tokens == {"r0": 13}
    forked = first_step([16], 16, DFLASH_K3, "fork-605")
    assert forked.num_scheduled_tokens == {"r0": 16}
    assert forked.draft_rows == 4 and forked.budgets_left["input_budget"] == 12
    # Five 1-token DFlash requests: 16 // (K + 1) = 4 fit the query budget.
    five = first_step([1] * 5, 16, DFLASH_K3, "fork-605")
    assert sorted(five.num_scheduled_tokens) == ["r0", "r1", "r2", "r3"]
    assert five.draft_rows == 16


def test_fork_605_preemption_restores_both_budgets() -> None:
    policy = profile_named("fork-605").policy
    p = StepParams(16, 16, 8, 3, layout_named("dflash"))
    book = StepBook.opened(policy, p)
    book.schedule("a", 5)
    assert book.ledger == Ledger(11, 12)
    refund = book.preempt("a")
    assert (refund.tokens, refund.rows) == (5, 4)
    assert book.ledger == policy.open(p)
    assert book.preempt("a").rows == 0  # given once


@pytest.mark.parametrize("profile", ["pr-52996", "fork-605"])
def test_dspark_fill_in_overflows_under_k_query_rows(profile: str) -> None:
    # Both charge K rows per DSpark request; the fill-in layout reads K + 1 (the C3 finding
    # in proofs/manifest.toml): four 1-token requests at B = 16, K = 4 read 20 rows.
    spec = {**DSPARK_K4, "dspark_layout": "fill-in"}
    run = ScenarioRun(
        parse_scenario(scenario_json([1] * 4, 16, spec, profile)), max_steps=1, check="collect"
    )
    record = next(run.records())
    assert len(record.num_scheduled_tokens) == 4 and record.draft_rows == 20
    assert [v.contract for v in run.scheduler.violations] == ["C3"]


@pytest.mark.parametrize("layout", [layout.name for layout in LAYOUTS])
def test_pr_53080_is_the_dual_rule_on_every_layout(layout: str) -> None:
    # The same ledger answers, on ints, for a grid of configs and ledgers.
    split, dual = profile_named("pr-53080").policy, profile_named("dual").policy
    assert split is not dual and split.name != dual.name
    for b, k in ((1, 1), (7, 2), (16, 4), (128, 7)):
        p = StepParams(b, b, 4, k, layout_named(layout))
        assert split.open(p) == dual.open(p) and split.accepts(p) == dual.accepts(p)
        for tokens in range(-1, b + 1, max(1, b // 4)):
            for rows in range(-1, b + 1, max(1, b // 4)):
                ledger = Ledger(tokens, rows)
                assert split.room(p, ledger) == dual.room(p, ledger)
                assert split.exhausted(p, ledger) == dual.exhausted(p, ledger)
        assert [split.charge(p, q) for q in range(1, 5)] == [dual.charge(p, q) for q in range(1, 5)]


def test_every_upstream_profile_cites_its_thread() -> None:
    threads = {
        "pr-53080": "vllm-project/vllm#53080",
        "pr-52996": "vllm-project/vllm#52996",
        "fork-605": "local-inference-lab/vllm#605",
    }
    assert PROPOSAL_NAMES == UPSTREAM
    for name in UPSTREAM:
        profile = profile_named(name)
        assert profile.thread == threads[name] and threads[name] in profile.summary
        assert threads[name] in (type(profile.policy).__doc__ or "")
        assert profile.vllm_version is None  # no release ships them


def test_cli_schedule_runs_an_upstream_profile(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "s.json"
    path.write_text(json.dumps(scenario_json([8, 8], 16, DSPARK_K4, "vllm-0.32")))
    assert main(["schedule", str(path), "--profile", "pr-52996"]) == 0
    first = json.loads(capsys.readouterr().out.splitlines()[0])
    assert first["num_scheduled_tokens"] == {"r0": 8, "r1": 8}
