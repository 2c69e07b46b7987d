"""The contract C1-C6: one predicate per item (spec/invariants.py), each pinned here on
hand-worked cases, true and false. The same functions are what the proofs' obligations
evaluate on z3 terms (proofs/obligations.py, one family per item) and what the reference
checks after every step (C1-C3)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dualbudget.proofs.model import Subject, fcfs_step
from dualbudget.spec.book import StepBook
from dualbudget.spec.contract import CONTRACT_IDS, contract_item
from dualbudget.spec.invariants import (
    buffer_peak_ok,
    conserved,
    dominates,
    empty_step_progress,
    no_stall,
    nonnegative,
    one_more_token_fits,
    one_token_fits,
)
from dualbudget.spec.methods import layout_named
from dualbudget.spec.policies import Ledger, StepParams
from dualbudget.spec.profiles import PROFILES

PREDICATES: dict[str, tuple[Callable[..., Any], ...]] = {
    "C1": (nonnegative,),
    "C2": (conserved,),
    "C3": (buffer_peak_ok,),
    "C4": (empty_step_progress, no_stall, one_token_fits),
    "C5": (one_more_token_fits,),
    "C6": (dominates,),
}


POLICY = {name: profile.policy for name, profile in PROFILES.items()}
"""Each profile's budget policy, on the release it is checked on."""


def _params(b: int, k: int, layout: str, m: int = 4, s: int | None = None) -> StepParams:
    return StepParams(b, b if s is None else s, m, k, layout_named(layout))


def test_every_item_has_a_predicate_that_names_it() -> None:
    assert tuple(PREDICATES) == CONTRACT_IDS
    for item, functions in PREDICATES.items():
        for function in functions:
            doc = function.__doc__ or ""
            assert doc.startswith(item), (function.__name__, doc[:40])
        assert contract_item(item).name.split()[0] in (functions[0].__doc__ or "")


def test_c1_nonnegative() -> None:
    assert nonnegative(Ledger(0, 0))
    assert nonnegative(Ledger(3, 12))
    assert not nonnegative(Ledger(-1, 5))
    assert not nonnegative(Ledger(3, -1))


def test_c2_conserved() -> None:
    # vLLM 0.32 on P-EAGLE, K = 4: slots K - 1 = 3, so 5 tokens cost (5, 8).
    p = _params(20, 4, "p-eagle")
    book = StepBook.opened(POLICY["vllm-0.32"], p)
    opened = book.ledger
    book.schedule("a", 5)
    assert book.ledger == Ledger(15, 12)
    assert conserved(opened, book.ledger, 5, 8)
    # A refund that forgets the slots gives back 5 rows of 8: the ledger no longer adds up.
    assert not conserved(opened, Ledger(15, 15), 5, 8)
    book.preempt("a")
    assert conserved(opened, book.ledger, 0, 0)


def test_c3_buffer_peak_ok() -> None:
    # DSpark fill-in, K = 1: C(q) = K + 1 = 2 rows per request, whatever q.
    p = _params(8, 1, "dspark-fill-in")
    assert buffer_peak_ok(p, 8, 4, 4 * p.draft_rows(1))  # four 1-token requests: D = 8
    assert not buffer_peak_ok(p, 8, 5, 5 * p.draft_rows(1))  # five: D = 10 > B
    assert not buffer_peak_ok(p, 3, 4, 8)  # T above the opened target budget
    # The vllm-0.32 finding: B = 1, one 1-token request, D = C(1) = 2 > 1.
    assert not buffer_peak_ok(_params(1, 1, "dspark-fill-in"), 1, 1, 2)


def test_c4_empty_step_progress() -> None:
    dual = StepBook.opened(POLICY["dual"], _params(16, 2, "eagle"))
    assert empty_step_progress(dual, 5)
    # vLLM 0.32 on P-EAGLE with B = 2, K = 3 (slots 2) opens an exhausted step (and
    # refuses the config: B must exceed the slots).
    p = _params(2, 3, "p-eagle", m=2)
    additive = StepBook.opened(POLICY["vllm-0.32"], p)
    assert not POLICY["vllm-0.32"].accepts(p)
    assert not empty_step_progress(additive, 1)
    # The global reserve of max_num_seqs * slots = 2 * 2 leaves no target budget of B = 4.
    reserve = StepBook.opened(POLICY["global-reserve"], _params(4, 3, "p-eagle", m=2))
    assert not empty_step_progress(reserve, 1)


def test_c4_no_stall() -> None:
    # vLLM 0.32 on P-EAGLE, B = 20, K = 4 (slots 3): after a 5-token request charged
    # (5, 8) the book holds (15, 12), not exhausted (12 > 3): a 20-token prompt gets
    # min(15, 12 - 3) = 9 of its tokens, a 1-token one its one.
    book = StepBook.opened(POLICY["vllm-0.32"], _params(20, 4, "p-eagle"))
    book.schedule("a", 5)
    assert not book.exhausted()
    assert book.grant(20) == 9 and no_stall(book, 20)
    assert no_stall(book, 1)
    # Granting b all 9, charged (9, 12), leaves (6, 0): a grant of 0 is no progress,
    # which C4 allows only because the book says it is exhausted (0 <= slots).
    book.schedule("b", 9)
    assert (book.ledger, book.exhausted(), book.grant(5)) == (Ledger(6, 0), True, 0)
    assert not no_stall(book, 5)


def test_c4_one_token_fits() -> None:
    assert one_token_fits(_params(2, 1, "dspark-fill-in"))  # C(1) = 2 <= 2
    assert not one_token_fits(_params(1, 1, "dspark-fill-in"))  # C(1) = 2 > 1
    assert one_token_fits(_params(1, 1, "eagle", m=1))  # C(1) = 1
    # The vllm-0.33 finding: it refuses B <= num_lookahead_tokens although one token fits.
    assert not POLICY["vllm-0.33"].accepts(_params(1, 1, "eagle", m=1))


def test_c5_one_more_token_fits() -> None:
    # vllm-0.32 on DFlash, B = 2, K = 1: slots K = 1 leave room for 1 of a 2-token
    # prompt, yet with 2 the step would hold T = 2 <= 2 and D = C(2) = K + 1 = 2 <= 2.
    p = _params(2, 1, "dflash", m=1)
    granted = fcfs_step(Subject("vllm-0.32", POLICY["vllm-0.32"]), p, [2]).granted
    assert granted == [1]
    assert one_more_token_fits(p, 0, 0, 0, 1)
    # dual grants both; a third token would break T <= min(S, B) = 2.
    assert fcfs_step(Subject("dual", POLICY["dual"]), p, [2]).granted == [2]
    assert not one_more_token_fits(p, 0, 0, 0, 2)
    # A request not scheduled at all (granted 0) in a full step: one more request would
    # break max_num_seqs = 1.
    assert not one_more_token_fits(p, 1, 2, 1, 0)


def test_c6_dominates() -> None:
    # vllm-0.33 vs vllm-0.32 on DSpark fill-in, B = 3, K = 1, max_num_seqs = 2, two
    # 1-token prompts: 0.33's cap B // num_lookahead_tokens = 1 admits one, 0.32 both
    # (its C3 bug: D = 4 > 3).
    p = _params(3, 1, "dspark-fill-in", m=2)
    hi = fcfs_step(Subject("vllm-0.33", POLICY["vllm-0.33"]), p, [1, 1])
    lo = fcfs_step(Subject("vllm-0.32", POLICY["vllm-0.32"]), p, [1, 1])
    assert (hi.target, hi.count, lo.target, lo.count) == (1, 1, 2, 2)
    for measure in ("tokens", "requests"):
        assert not dominates(measure, hi.target, hi.count, lo.target, lo.count)
        assert dominates(measure, lo.target, lo.count, hi.target, hi.count)
    # dual >= vllm-0.33 on the same queue.
    top = fcfs_step(Subject("dual", POLICY["dual"]), p, [1, 1])
    assert dominates("tokens", top.target, top.count, hi.target, hi.count)
    assert dominates("requests", top.target, top.count, hi.target, hi.count)
