"""The proof machinery itself: the step book, the decision rules (vacuous and unknown are
failures), the FCFS step on ints, the runner's CLI contract, and the mutants' killers."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import pytest
import z3

from dualbudget.proofs import commands
from dualbudget.proofs.manifest import Manifest, load_manifest
from dualbudget.proofs.model import Subject, fcfs_step
from dualbudget.proofs.mutants import MUTANTS
from dualbudget.proofs.obligations import Query, catalog
from dualbudget.proofs.runner import run, select
from dualbudget.proofs.solve import decide
from dualbudget.spec.book import StepBook
from dualbudget.spec.methods import layout_named
from dualbudget.spec.policies import Charge, Ledger, StepParams
from dualbudget.spec.profiles import PROFILES

# -- the step book (spec/book.py) on ints ---------------------------------------------


def _book(profile: str = "vllm-0.32", layout: str = "p-eagle") -> StepBook:
    # B = 20, S = 20, max_num_seqs = 4, K = 4: P-EAGLE slots = K-1 = 3.
    policy = PROFILES[profile].policy
    return StepBook.opened(policy, StepParams(20, 20, 4, 4, layout_named(layout)))


def test_book_records_and_refunds_exactly_once() -> None:
    book = _book()
    assert book.schedule("a", 5) == Charge(5, 8)  # 5 tokens, 5 + 3 rows
    assert book.ledger == Ledger(15, 12)
    assert book.preempt("a") == Charge(5, 8)
    assert book.ledger == Ledger(20, 20)
    assert book.preempt("a") == Charge(0, 0)  # a second preemption refunds nothing
    assert book.ledger == Ledger(20, 20)


def test_book_refunds_nothing_for_an_unscheduled_request() -> None:
    book = _book()
    book.schedule("a", 2)
    before = book.ledger
    assert book.preempt("never") == Charge(0, 0)
    assert book.ledger == before


def test_book_refuses_a_second_schedule_and_zero_tokens() -> None:
    book = _book()
    book.schedule("a", 1)
    with pytest.raises(ValueError, match="already scheduled"):
        book.schedule("a", 1)
    with pytest.raises(ValueError, match="cannot schedule 0"):
        book.schedule("b", 0)


def test_fcfs_step_on_ints_is_the_scheduler_loop() -> None:
    # The hand-worked upstream case of test_spec_policies: P-EAGLE, K=4, B=20, slots 3.
    # First: room min(20, 17) = 17, gets 10 (10, 7). Second: room min(10, 4) = 4, gets 4
    # -> (6, 0); 0 <= 3 stops the step.
    subject = Subject("vllm-0.32", PROFILES["vllm-0.32"].policy)
    run = fcfs_step(subject, StepParams(20, 20, 16, 4, layout_named("p-eagle")), [10, 10, 10])
    assert run.granted == [10, 4, 0]
    assert run.book.ledger == Ledger(6, 0)
    assert (run.target, run.count) == (14, 2)
    # Draft rows are the method's true C(q) = q + K - 1 per request: 13 + 7.
    assert run.draft == 20


def test_fcfs_step_symbolic_agrees_with_ints() -> None:
    subject = Subject("vllm-0.33", PROFILES["vllm-0.33"].policy)
    b, k = z3.Ints("b k")
    needs = [3, 1, 2]
    p_sym = StepParams(b, b, 4, k, layout_named("dflash"))
    symbolic = fcfs_step(subject, p_sym, needs)
    for bv, kv in ((7, 1), (9, 2), (12, 3)):
        concrete = fcfs_step(subject, StepParams(bv, bv, 4, kv, layout_named("dflash")), needs)
        point = [(b, z3.IntVal(bv)), (k, z3.IntVal(kv))]
        got = [
            z3.simplify(z3.substitute(z3.IntVal(0) + g, *point)).as_long() for g in symbolic.granted
        ]
        assert got == concrete.granted


# -- decisions -----------------------------------------------------------------------


def test_unsatisfiable_premises_fail_as_vacuous() -> None:
    x = z3.Int("x")
    result = decide([Query("vacuous", [x > 1, x < 0], {"C1": x > 5})])["C1"]
    assert result.verdict == "fails"
    assert not result.nonvacuous


def test_a_counterexample_fails_with_a_model() -> None:
    x = z3.Int("x")
    result = decide([Query("cex", [x >= 0], {"C1": x >= 1})])["C1"]
    assert result.verdict == "fails" and result.nonvacuous
    assert result.counterexample is not None and result.counterexample["x"] == "0"


def test_a_timeout_is_unknown_never_a_pass() -> None:
    # A hard nonlinear goal under a 1 ms timeout: z3 cannot finish.
    a, b, c = z3.Ints("a b c")
    premises = [a > 0, b > 0, c > 0]
    goal = a * a * a + b * b * b != c * c * c + 7
    result = decide([Query("hard", premises, {"C1": goal})], timeout_ms=1)["C1"]
    assert result.verdict in ("unknown", "fails")
    assert result.verdict != "holds"


def test_reachability_holds_only_when_premises_are_satisfiable() -> None:
    x = z3.Int("x")
    assert decide([Query("r", [x == 1], {"C2-reach": None})])["C2-reach"].verdict == "holds"
    assert decide([Query("r", [x == 1, x == 2], {"C2-reach": None})])["C2-reach"].verdict == (
        "fails"
    )


# -- the manifest decides the exit code ----------------------------------------------


def test_a_verdict_unlike_the_manifest_is_a_mismatch() -> None:
    manifest = load_manifest()
    obligations = [
        ob for ob in select(["vllm-0.32"], ["dspark-fill-in"], ["C3"]) if ob.check == "C3"
    ]
    assert [o.matches for o in run(obligations, manifest, witnesses=False)] == [True]
    flipped = Manifest({**manifest.entries, "vllm-0.32/dspark-fill-in/C3": "holds"}, {}, {})
    (outcome,) = run(obligations, flipped, witnesses=False)
    assert outcome.verdict == "fails" and not outcome.matches


def test_prove_cli_json_and_junit(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out_json, out_xml = tmp_path / "p.json", tmp_path / "p.xml"
    options = commands.ProveOptions(
        profiles=("vllm-0.32",),
        layouts=("dspark-fill-in", "eagle"),
        contracts=("C3", "C5"),
        json_path=str(out_json),
        junit_path=str(out_xml),
        witness_dir=tmp_path / "w",
    )
    assert commands.prove(options) == 0
    text = capsys.readouterr().out
    assert "vllm-0.32       dspark-fill-in  C3       C3" in text
    assert "prove: OK" in text
    data = json.loads(out_json.read_text())
    assert set(data) == {"obligations", "summary"}
    keys = {
        "profile",
        "layout",
        "contract",
        "check",
        "name",
        "verdict",
        "expected",
        "nonvacuous",
        "inductive",
        "seconds",
        "witness",
    }
    for ob in data["obligations"]:
        assert set(ob) == keys
        assert ob["verdict"] in ("holds", "fails", "unknown")
        assert ob["contract"] in ("C3", "C5")
    finding = next(o for o in data["obligations"] if o["name"] == "vllm-0.32/dspark-fill-in/C3")
    assert finding["verdict"] == "fails" and Path(finding["witness"]).is_file()
    suite = ElementTree.parse(out_xml).getroot()
    assert suite.get("failures") == "0"
    assert int(suite.get("tests") or 0) == len(data["obligations"])


def test_every_mutant_has_a_description_and_a_real_profile() -> None:
    assert len(MUTANTS) >= 12
    assert len({m.name for m in MUTANTS}) == len(MUTANTS)
    for m in MUTANTS:
        assert m.description and m.profile in {"global-reserve", "vllm-0.32", "vllm-0.33", "dual"}
        assert isinstance(m.build(), Subject)


# One killer per mutant, as measured by `dualbudget prove --mutants`; the full kill table
# is that command's job (minutes), this keeps each mutant's first killer honest (seconds).
KILLERS = {
    "refund-target-only": "vllm-0.32/eagle/C2",
    "refund-forgets-slots": "vllm-0.32/p-eagle/C2",
    "double-refund": "dual/eagle/C2",
    "refund-unscheduled-victim": "vllm-0.32/pard/C2",
    "book-records-target-only": "vllm-0.33/p-eagle/C2",
    "strict-stop": "vllm-0.32/p-eagle/C4-no-stall",
    "dflash-charged-K-minus-1": "vllm-0.32/dflash/C3",
    "admission-off-by-one": "vllm-0.32/pard/C4",
    "room-ignores-token-budget": "vllm-0.32/eagle/C1",
    "static-cap-from-K": "vllm-0.33/dflash/C3",
    "static-cap-missing": "vllm-0.33/dspark-anchor/C3",
    "reserve-one-request": "global-reserve/dflash/C3",
    "draft-budget-from-target": "dual/p-eagle/C3",
    "dual-charges-target-rows-only": "dual/dflash/C3",
    "dual-room-ignores-fixed-rows": "dual/pard/C1",
    "dual-admits-fixed-rows-only": "dual/draft-model/C4",
    "dual-strict-room": "dual/dflash/C5",
    "grant-over-need": "dual/eagle/C4-no-stall",
    "own-pass-cap-eight": "vllm-0.32/dflash/C6-requests-vs-global-reserve",
}


def test_every_mutant_has_a_listed_killer() -> None:
    assert set(KILLERS) == {m.name for m in MUTANTS}


@pytest.mark.parametrize("mutant", sorted(KILLERS))
def test_mutant_is_killed(mutant: str) -> None:
    manifest = load_manifest()
    (ob,) = [ob for ob in catalog() if ob.name == KILLERS[mutant]]
    (base,) = run([ob], manifest, witnesses=False, processes=1)
    assert base.matches, base.reasons
    (mutated,) = run([ob], manifest, mutant=mutant, witnesses=False, processes=1)
    assert mutated.verdict != "unknown" and not mutated.matches, mutated.reasons


def test_breaks_outside_the_model_are_known_to_the_fuzz_and_checked_for_form() -> None:
    from dualbudget.fuzz_cli import known_findings
    from dualbudget.proofs.manifest import outside_model_findings

    manifest = load_manifest()
    outside = outside_model_findings()
    assert ("vllm-0.32", "ngram-parallel", "C4") in outside
    # The proofs' verdict on that key holds of the spec's budget book only: it stays.
    assert manifest.expected("vllm-0.32/ngram-parallel/C4") == "holds"
    assert outside <= known_findings()
    names = [ob.name for ob in catalog()]
    assert not manifest.problems(names)
    bad = Manifest(
        manifest.entries, manifest.why, {"stall": {"where": ["vllm-0.32/ngram-parallel/C9"]}}
    )
    assert bad.problems(names) == [
        "[outside_model] stall: not where = [profile/layout/item, ...] with a why"
    ]
