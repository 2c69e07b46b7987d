"""The mutation machinery on a synthetic scheduler of the same shapes (no vLLM needed).

``_TOY`` is written for this test (not vLLM's code): a loop granting tokens under two
budgets, a stop on the input budget, an active-request cap, a long-prefill threshold, a
padding rule and a refund. Every operator must find its sites there, each mutant must be
a subclass that decides differently somewhere (or be one of the few the test names as
equivalent, with why), an operator with no site must fail loudly, and an equivalence
claim z3 refutes must fail the run.
"""

from __future__ import annotations

import itertools
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from dualbudget.integration.mutate import MutantResult, decide
from dualbudget.integration.mutation import equivalence
from dualbudget.integration.mutation.equivalence import Claim, ClaimRefuted, check, counterexample
from dualbudget.integration.mutation.loading import (
    SchedulerSource,
    compile_class,
    load_source,
)
from dualbudget.integration.mutation.operators import OPERATORS, NoSite, find_sites, mutate

_TOY = """
class Scheduler:
    max_num_active_reqs = 3

    def schedule(self, needs, budget, slots, threshold=0, refund_at=-1, pad_to=0, limit=99):
        token_budget = budget
        input_budget = budget + 2
        draft_slots = slots
        long_prefill_token_threshold = threshold if len(needs) > 1 else 0
        granted = {}
        for i, need in enumerate(needs):
            if input_budget <= draft_slots:
                break
            if len(granted) >= self.max_num_active_reqs:
                break
            if 0 < long_prefill_token_threshold < need:
                need = long_prefill_token_threshold
            if need == 1 and pad_to:
                padded_num_tokens = 1 + pad_to
                if i + padded_num_tokens <= limit:
                    need = padded_num_tokens
            q = min(need, token_budget, input_budget - draft_slots)
            token_budget -= q
            input_budget -= q + draft_slots
            granted[i] = q
            if i == refund_at:
                restored = granted.pop(i)
                token_budget += restored
                input_budget += restored + draft_slots
        return granted, token_budget, input_budget
"""

# Mutants of ``_TOY`` no input of the grid tells apart, and why (the toy's own shapes:
# the same ones are argued for vLLM in integration/mutation/equivalence.py).
_TOY_EQUIVALENT = {
    # need == threshold: setting need to the threshold changes nothing.
    "shift-boundary/schedule/long_prefill_token_threshold/3",
}


@pytest.fixture(scope="module")
def toy(tmp_path_factory: pytest.TempPathFactory) -> SchedulerSource:
    folder = tmp_path_factory.mktemp("toy")
    (folder / "toy_scheduler.py").write_text(textwrap.dedent(_TOY))
    sys.path.insert(0, str(folder))
    try:
        return load_source("toy_scheduler", "Scheduler")
    finally:
        sys.path.remove(str(folder))


def _grid() -> list[dict[str, Any]]:
    needs = [(3,), (1, 4), (5, 1, 2), (2, 6, 1, 3)]
    cases = []
    for n, budget, slots, threshold, refund_at, pad_to, limit in itertools.product(
        needs, (4, 7), (0, 1), (0, 2, 3), (-1, 0), (0, 2), (3, 99)
    ):
        cases.append(
            dict(
                needs=n,
                budget=budget,
                slots=slots,
                threshold=threshold,
                refund_at=refund_at,
                pad_to=pad_to,
                limit=limit,
            )
        )
    return cases


def _outputs(cls: type) -> list[Any]:
    scheduler = cls()
    return [scheduler.schedule(**case) for case in _grid()]


def test_every_operator_finds_sites_in_source_order(toy: SchedulerSource) -> None:
    sites = find_sites(toy.function("schedule"))
    assert {s.operator for s in sites} == set(OPERATORS)
    names = [s.name for s in sites]
    assert len(names) == len(set(names)), "mutant names must be unique"
    lines = Path(toy.path).read_text().splitlines()
    mark = {"skip-break": "break", "remove-refund": "+=", "refund-twice": "+="}
    for site in sites:
        # The location is the line in the parsed file: it holds what the operator changes.
        text = lines[site.line - 1]
        if site.operator in mark:
            assert mark[site.operator] in text, (site.name, text)
        elif site.operator == "shift-boundary":
            assert "<" in text or ">" in text, (site.name, text)
        else:
            assert any(name in text for name in site.anchor.split("+")), (site.name, text)
    by_op = {op: [s for s in sites if s.operator == op] for op in OPERATORS}
    assert [s.line for s in by_op["remove-refund"]] == [s.line for s in by_op["refund-twice"]]
    assert len(by_op["remove-refund"]) == 2  # both refund statements
    assert len(by_op["skip-break"]) == 2  # the input-budget stop and the active cap


def test_names_do_not_depend_on_the_operators_asked(toy: SchedulerSource) -> None:
    function = toy.function("schedule")
    every = {s.name: s for s in find_sites(function)}
    for operator in OPERATORS:
        for site in find_sites(function, (operator,)):
            assert every[site.name] == site


def test_each_mutant_is_a_subclass_that_decides_differently(toy: SchedulerSource) -> None:
    original = _outputs(toy.base)
    control = compile_class(toy, [toy.function("schedule")], "control")
    assert issubclass(control, toy.base) and control is not toy.base
    assert _outputs(control) == original
    equivalent = set()
    for site in find_sites(toy.function("schedule")):
        cls = compile_class(toy, [mutate(toy.function("schedule"), site)], site.name)
        assert issubclass(cls, toy.base)
        try:
            outputs = _outputs(cls)
        except Exception:  # a mutant that crashes is told apart too
            continue
        if outputs == original:
            equivalent.add(site.name)
    assert equivalent == _TOY_EQUIVALENT


def test_mutating_leaves_the_source_tree_alone(toy: SchedulerSource) -> None:
    import ast

    before = ast.dump(toy.function("schedule"))
    for site in find_sites(toy.function("schedule")):
        mutate(toy.function("schedule"), site)
    assert ast.dump(toy.function("schedule")) == before


def test_an_operator_with_no_site_fails_loudly(toy: SchedulerSource, tmp_path: Path) -> None:
    (tmp_path / "no_refund.py").write_text(
        textwrap.dedent(
            """
            class Scheduler:
                def schedule(self, token_budget):
                    if token_budget <= 0:
                        return 0
                    return token_budget
            """
        )
    )
    sys.path.insert(0, str(tmp_path))
    try:
        source = load_source("no_refund", "Scheduler")
    finally:
        sys.path.remove(str(tmp_path))
    with pytest.raises(NoSite, match="remove-refund") as err:
        find_sites(source.function("schedule"), ("shift-boundary", "remove-refund"))
    assert "skip-break" not in str(err.value)
    with pytest.raises(NoSite, match="refund-twice, skip-break"):
        find_sites(source.function("schedule"), ("refund-twice", "skip-break"))
    with pytest.raises(ValueError, match="unknown operators: swap"):
        find_sites(source.function("schedule"), ("swap",))


def test_a_claim_z3_refutes_fails_the_run() -> None:
    planted = Claim(
        "drop-term/schedule/draft_slots/1",
        "wrongly: the slots never matter",
        assume=("input_budget >= 0", "draft_slots >= 1"),
        holds="input_budget - draft_slots == input_budget",
    )
    found = counterexample(planted)
    assert found is not None and "draft_slots = " in found
    with pytest.raises(ClaimRefuted, match="drop-term/schedule/draft_slots/1"):
        check([*equivalence.CLAIMS, planted])


def test_the_shipped_claims_hold_and_name_their_releases() -> None:
    check(equivalence.CLAIMS)  # raises on a refuted one
    assert all(c.reason for c in equivalence.CLAIMS)
    assert equivalence.claims_for("0.32.0") and equivalence.claims_for("0.33.0")
    assert not equivalence.claims_for("0.31.0")
    arithmetic = [c for c in equivalence.CLAIMS if c.holds]
    assert arithmetic, "the arithmetic reasons are checked, not only stated"


def test_a_claimed_mutant_that_is_killed_or_missing_is_an_error() -> None:
    claimed = next(iter(equivalence.claims_for("0.32.0")))
    killed = MutantResult(claimed, "shift-boundary", "schedule:1", "killed", scenario="s.json")
    errors = decide([killed], "0.32.0")
    assert any("claimed equivalent but was killed" in e for e in errors)
    survivor = MutantResult(claimed, "shift-boundary", "schedule:1", "survived")
    errors = decide([survivor], "0.32.0")
    assert survivor.status == "equivalent" and survivor.reason
    assert all("was killed" not in e for e in errors)
    assert any("no such mutant" in e for e in errors)  # the other claims' mutants are absent


def test_the_refund_path_counts_of_the_reference() -> None:
    """``bound_after_refund`` and ``token_budget_bound`` as the reference counts its
    grants (``GrantCounts``, which the lockstep reads per step): a cut grant counts after a
    refund of the same step only, and a grant cut to exactly the token budget counts as a
    token bound (the lockstep keeps it where the token budget opens below the input
    budget)."""
    from dualbudget.reference.scheduler import GrantCounts, OpenStep, Scheduler
    from dualbudget.spec.config import EngineConfig, SpeculativeConfig
    from dualbudget.spec.profiles import profile_named

    # vLLM 0.32 on DFlash, K = 3: 3 slots; B = 16, max_num_scheduled_tokens = 8.
    config = EngineConfig(
        16, 4, 64, 4, 64, max_num_scheduled_tokens=8,
        speculative_config=SpeculativeConfig("dflash", 3, True),
    )  # fmt: skip
    scheduler = Scheduler(config, profile_named("vllm-0.32"), check="raise")
    rules, step = scheduler.rules, OpenStep(0, 8, 16, {}, {}, [], [])
    assert rules.opened == (8, 16)

    def grant(token_budget: int, input_budget: int, need: int) -> int:
        q = rules.grant(token_budget, input_budget, need)
        if q < need:
            scheduler._count_cut(step, token_budget, q)
        return q

    assert grant(8, 16, 40) == 8  # the token budget cuts it
    assert scheduler.grants == GrantCounts(cut_to_token_budget=1)
    assert grant(8, 10, 40) == 7  # the input budget cuts it: 10 - 3
    assert scheduler.grants == GrantCounts(cut_by_input_budget=1, cut_to_token_budget=1)
    step.refunded = True
    assert grant(8, 16, 2) == 2  # not cut: no bound after the refund
    assert scheduler.grants.cut_after_refund == 0
    assert grant(5, 16, 9) == 5  # cut after the refund
    assert scheduler.grants == GrantCounts(1, 2, 1)
