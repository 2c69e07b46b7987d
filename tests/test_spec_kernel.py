"""The budget kernel (spec/kernel.py): the book's formulas compiled to Python must answer
exactly what ``StepBook`` and the policy answer on ints, for every policy and layout; the
stored templates (spec/compiled_book.py) are what the compiler (proofs/compile_book.py)
makes of the spec today; a formula it cannot translate is refused; and the reference's
per-step C2 check catches a kernel that moves the ledger wrongly. That the templates equal
the spec's formulas for every config is proven, too (``dualbudget prove``, check
``compiled``)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import z3
from hypothesis import given, settings
from hypothesis import strategies as st

from dualbudget.proofs.compile_book import UntranslatableFormula, render_module, template, templates
from dualbudget.reference.events import AddRequest, ModelOutput, ScheduleStep
from dualbudget.reference.scheduler import Scheduler
from dualbudget.spec import compiled_book
from dualbudget.spec.arith import Num, floordiv
from dualbudget.spec.book import StepBook
from dualbudget.spec.compiled_book import TEMPLATES
from dualbudget.spec.config import EngineConfig, SpeculativeConfig
from dualbudget.spec.kernel import NoCompiledBook, compile_kernel
from dualbudget.spec.methods import LAYOUT_NAMES, NO_SPECULATION, layout_named
from dualbudget.spec.policies import Additive, Ledger, StepParams
from dualbudget.spec.profiles import PROFILES, profile_named
from dualbudget.spec.releases import VLLM_0_33
from tests.planted import planted_kernel

budgets = st.integers(min_value=-40, max_value=600)


@st.composite
def configs(draw: st.DrawFn) -> tuple[str, StepParams]:
    profile = draw(st.sampled_from(sorted(PROFILES)))
    name = draw(st.sampled_from((*LAYOUT_NAMES, NO_SPECULATION.name)))
    layout = NO_SPECULATION if name == NO_SPECULATION.name else layout_named(name)
    b = draw(st.integers(min_value=1, max_value=512))
    s = draw(st.integers(min_value=1, max_value=600))
    m = draw(st.integers(min_value=1, max_value=b))
    k = draw(st.integers(min_value=1, max_value=12))
    return profile, StepParams(b, s, m, k, layout)


@settings(max_examples=400, deadline=None)
@given(configs(), budgets, budgets, st.integers(min_value=0, max_value=600), st.integers(1, 600))
def test_the_kernel_answers_what_the_book_answers(
    config: tuple[str, StepParams], token_budget: int, input_budget: int, need: int, q: int
) -> None:
    name, p = config
    policy = PROFILES[name].policy
    kernel = compile_kernel(policy, p)
    ledger = Ledger(token_budget, input_budget)
    book = StepBook(policy, p, ledger)
    opened = policy.open(p)
    assert kernel.opened == (opened.token_budget, opened.input_budget)
    assert kernel.max_active_requests == policy.max_active_requests(p)
    assert kernel.exhausted(token_budget, input_budget) == book.exhausted()
    assert kernel.room(token_budget, input_budget) == policy.room(p, ledger)
    assert kernel.grant(token_budget, input_budget, need) == book.grant(need)

    book.schedule("r", q)
    after = book.ledger
    assert kernel.take(token_budget, input_budget, q) == (
        after.token_budget,
        after.input_budget,
        book.exhausted(),
    )
    # Preempting what was just scheduled gives back exactly its charge.
    assert kernel.give_back(after.token_budget, after.input_budget, q) == (
        token_budget,
        input_budget,
    )
    book.preempt("r")
    assert book.ledger == ledger


def test_the_kernel_is_the_formula_in_python() -> None:
    # vLLM 0.32 on DFlash, K = 4: 4 draft slots per request.
    kernel = compile_kernel(
        PROFILES["vllm-0.32"].policy, StepParams(512, 512, 64, 4, layout_named("dflash"))
    )
    assert "input_budget <= ((1 * 4) + 0)" in kernel.source  # K slots, as the table has it
    assert kernel.grant(100, 10, 50) == 6
    assert kernel.take(100, 10, 6) == (94, 0, True)
    assert kernel.exhausted(100, 4) and not kernel.exhausted(100, 5)


def test_one_config_compiles_once() -> None:
    p = StepParams(64, 64, 8, 3, layout_named("eagle"))
    again = dataclasses.replace(p)
    dual, additive = PROFILES["dual"].policy, PROFILES["vllm-0.32"].policy
    assert compile_kernel(dual, p) is compile_kernel(dual, again)
    assert compile_kernel(dual, p) is not compile_kernel(additive, p)


def test_the_stored_templates_are_what_the_compiler_makes_today() -> None:
    # Else: python -m dualbudget.proofs.compile_book --write
    fresh = templates()
    assert fresh == TEMPLATES
    with open(compiled_book.__file__) as stored:
        assert stored.read() == render_module(fresh)


class _DividesByTheLedger(Additive):
    def room(self, p: StepParams, ledger: Ledger) -> Num:
        return floordiv(ledger.token_budget, ledger.input_budget)


def test_a_formula_it_cannot_translate_is_refused() -> None:
    with pytest.raises(UntranslatableFormula, match="no translation"):
        template(_DividesByTheLedger(VLLM_0_33), layout_named("eagle"))


class _ReadsAForeignSymbol(Additive):
    def room(self, p: StepParams, ledger: Ledger) -> Num:
        return ledger.token_budget - z3.Int("secret")


def test_a_symbol_that_is_not_an_argument_or_a_config_number_is_refused() -> None:
    with pytest.raises(UntranslatableFormula, match="'secret'"):
        template(_ReadsAForeignSymbol(VLLM_0_33), layout_named("eagle"))


def test_a_policy_that_is_not_the_specs_has_no_compiled_book() -> None:
    # The reference runs only what was compiled (and proven) ahead of time.
    p = StepParams(64, 64, 8, 3, layout_named("eagle"))
    with pytest.raises(NoCompiledBook, match="_DividesByTheLedger"):
        compile_kernel(_DividesByTheLedger(VLLM_0_33), p)


def test_a_symbolic_config_is_refused() -> None:
    p = StepParams(64, 64, 8, z3.Int("K"), layout_named("eagle"))
    with pytest.raises(TypeError, match="concrete config"):
        compile_kernel(PROFILES["vllm-0.32"].policy, p)


def _run(scheduler: Scheduler) -> Any:
    for i in range(4):
        scheduler.handle(AddRequest(str(i), 40, 4))
    record = scheduler.handle(ScheduleStep())
    assert record is not None
    scheduler.handle(ModelOutput({rid: 1 for rid in record.num_scheduled_tokens}))
    return record


def test_the_contract_check_catches_a_kernel_that_charges_wrongly() -> None:
    config = EngineConfig(
        max_num_batched_tokens=64,
        max_num_seqs=8,
        max_model_len=256,
        block_size=16,
        num_gpu_blocks=64,
        speculative_config=SpeculativeConfig("dflash", 3, True),
    )
    honest = Scheduler(config, profile_named("vllm-0.32"), check="collect")
    _run(honest)
    assert honest.violations == []

    wrong = Scheduler(config, profile_named("vllm-0.32"), check="collect")
    right_take = wrong.kernel.take

    def forgets_the_slots(token_budget: int, input_budget: int, q: int) -> Any:
        tb, _, _ = right_take(token_budget, input_budget, q)
        return tb, input_budget - q, tb <= 0

    wrong.kernel = planted_kernel(wrong.kernel, take=forgets_the_slots)
    _run(wrong)
    assert [v.contract for v in wrong.violations] == ["C2"]
