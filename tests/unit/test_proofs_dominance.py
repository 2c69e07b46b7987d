"""C6 by induction (proofs/dominance.py) against a bounded encoding.

The bounded encoding unrolls ``model.fcfs_step`` over a queue of up to ``C6_QUEUE``
requests; it proves nothing past that bound, so it serves only as this cross-check: on
every (pair, layout) the inductive verdict equals the bounded one. Then: the planted
mutant that breaks dominance only past 8 requests is killed by the induction and survives
the bounded encoding; each strengthening of the relation is needed exactly where
proofs/strengthenings.py says (the table of proofs/README.md); and the lane step
``serve`` is the FCFS loop of ``fcfs_step`` on ints.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
import z3

from dualbudget.proofs import commands
from dualbudget.proofs.dominance import MEASURES, Lane, Relation, opened_lane, serve
from dualbudget.proofs.manifest import load_manifest
from dualbudget.proofs.model import Subject, accepted, fcfs_step, sym_config
from dualbudget.proofs.mutants import mutant_named
from dualbudget.proofs.obligations import (
    C6_QUEUE,
    CHAIN,
    Query,
    c6_queries,
    catalog,
    lower_of,
)
from dualbudget.proofs.runner import base_subjects, run, subjects_for
from dualbudget.proofs.solve import decide
from dualbudget.proofs.strengthenings import NEEDED, SHOWN, needed_for
from dualbudget.spec.invariants import dominates
from dualbudget.spec.methods import LAYOUT_NAMES, layout_named
from dualbudget.spec.policies import StepParams
from dualbudget.spec.profiles import PROFILE_NAMES, PROFILES

PAIRS = [(hi, lower) for hi in PROFILE_NAMES if (lower := lower_of(hi)) is not None]
"""Every C6 comparison the catalog makes: the chain and its branches."""
CHAIN_PAIRS = [(hi, lower) for hi in CHAIN if (lower := lower_of(hi)) is not None]
"""The chain's links, whose strengthenings proofs/strengthenings.py tabulates."""
MUTANT = "own-pass-cap-eight"


def bounded_c6_queries(hi: Subject, lo: Subject, layout_name: str) -> list[Query]:
    """The bounded encoding: one queue of ``1..C6_QUEUE`` requests with symbolic sizes,
    both FCFS steps unrolled, configs accepted by both."""
    cfg = sym_config(layout_named(layout_name))
    p = cfg.p
    needs = list(z3.Ints(" ".join(f"need{i}" for i in range(C6_QUEUE))))
    length = z3.Int("queue_len")
    present = [length > i for i in range(C6_QUEUE)]
    run_hi = fcfs_step(hi, p, needs, present)
    run_lo = fcfs_step(lo, p, needs, present)
    premises = [
        *cfg.engine(),
        accepted(hi, p),
        accepted(lo, p),
        length >= 1,
        length <= C6_QUEUE,
        *(n >= 1 for n in needs),
    ]
    goals = {
        f"C6-{m}-vs-{lo.profile}": dominates(
            m, run_hi.target, run_hi.count, run_lo.target, run_lo.count
        )
        for m in MEASURES
    }
    return [Query(f"{hi.profile} vs {lo.profile} on one queue", premises, goals)]


def _verdicts(queries: list[Query]) -> dict[str, str]:
    results = decide(queries)
    for result in results.values():
        assert result.nonvacuous, result.reasons
        assert result.verdict != "unknown", result.reasons
    return {check: result.verdict for check, result in results.items()}


def _pair(subjects: dict[str, Subject], hi: str) -> tuple[Subject, Subject]:
    lower = lower_of(hi)
    assert lower is not None
    return subjects[hi], subjects[lower]


# Each pair on every layout the higher profile's release builds (its obligations').
BUILT = [(hi, lo, layout) for hi, lo in PAIRS for layout in PROFILES[hi].release.layouts]


@pytest.mark.parametrize(("hi", "lo", "layout"), BUILT)
def test_inductive_verdict_equals_the_bounded_one(hi: str, lo: str, layout: str) -> None:
    subjects = base_subjects()
    inductive = _verdicts(c6_queries(*_pair(subjects, hi), layout))
    bounded = _verdicts(bounded_c6_queries(*_pair(subjects, hi), layout))
    assert inductive == bounded
    # ... and both are what the manifest expects.
    manifest = load_manifest()
    assert inductive == {check: manifest.expected(f"{hi}/{layout}/{check}") for check in inductive}


def test_prove_shows_every_obligation_inductive(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    c6 = [ob for ob in catalog() if ob.family == "C6"]
    assert len(c6) == 2 * len(BUILT)
    assert all(ob.inductive for ob in catalog())
    out = tmp_path / "prove.json"
    options = commands.ProveOptions(
        profiles=("vllm-0.33",),
        layouts=("dspark-fill-in",),
        contracts=("C6",),
        json_path=str(out),
        witness_dir=tmp_path / "w",
    )
    assert commands.prove(options) == 0
    text = capsys.readouterr().out
    assert "bounds: none on the proofs" in text and " 0 bounded;" in text
    data = json.loads(out.read_text())
    assert [o["inductive"] for o in data["obligations"]] == [True, True]
    assert data["summary"]["bounded"] == 0
    # The expected failure comes with its witness: a concrete queue, replayable.
    assert all(o["verdict"] == "fails" and o["witness"] for o in data["obligations"])


def test_dominates_on_ints() -> None:
    assert dominates("tokens", 5, 1, 5, 3) and not dominates("tokens", 4, 9, 5, 0)
    assert dominates("requests", 0, 3, 9, 3) and not dominates("requests", 9, 2, 0, 3)
    with pytest.raises(ValueError, match="measure"):
        dominates("rows", 1, 1, 1, 1)


# -- the mutant past the bound ---------------------------------------------------------


def test_mutant_past_eight_requests_is_killed_by_the_induction_only() -> None:
    manifest = load_manifest()
    names = [f"vllm-0.32/dflash/C6-{m}-vs-global-reserve" for m in MEASURES]
    obligations = [ob for ob in catalog() if ob.name in names]
    mutated = run(obligations, manifest, mutant=MUTANT, witnesses=False, processes=1)
    assert [(o.verdict, o.expected) for o in mutated] == [("fails", "holds")] * 2
    # The bounded encoding, on the same mutant, sees nothing: every queue it unrolls
    # has at most 8 requests.
    subjects = subjects_for(MUTANT)
    bounded = _verdicts(bounded_c6_queries(*_pair(subjects, "vllm-0.32"), "dflash"))
    assert set(bounded.values()) == {"holds"}


def test_mutant_violation_is_real_on_nine_requests() -> None:
    """The kill is no artefact of the induction: on ints, 9 one-token requests with
    B=18, K=1, max_num_seqs=9 (DFlash) give global-reserve 9 and the mutant 8."""
    p = StepParams(18, 18, 9, 1, layout_named("dflash"))
    mutant = mutant_named(MUTANT).build()
    lower = base_subjects()["global-reserve"]
    assert mutant.policy.accepts(p) and lower.policy.accepts(p)
    ours, theirs = fcfs_step(mutant, p, [1] * 9), fcfs_step(lower, p, [1] * 9)
    assert (ours.count, theirs.count) == (8, 9)
    assert not dominates("requests", ours.target, ours.count, theirs.target, theirs.count)
    # Up to 8 requests the mutant and the real vllm-0.32 are the same step.
    real = base_subjects()["vllm-0.32"]
    assert fcfs_step(mutant, p, [1] * 8).granted == fcfs_step(real, p, [1] * 8).granted


# -- which strengthening each pair needs (proofs/strengthenings.py) -------------------

PLAIN = Relation(count_nonnegative=False, tokens_cover_count=False, lower_exhausted=False)


def test_the_strengthening_table_covers_every_link_once() -> None:
    cells = [(row.upper, layout) for row in NEEDED for layout in row.layouts]
    assert sorted(cells) == sorted((hi, layout) for hi, _ in CHAIN_PAIRS for layout in LAYOUT_NAMES)
    assert set(SHOWN) == set(vars(PLAIN))
    assert all(set(row.strengthenings or ()) <= set(SHOWN) for row in NEEDED)
    # No relation holds exactly where the manifest expects the link to fail.
    manifest = load_manifest()
    for hi, layout in cells:
        fails = {
            manifest.expected(f"{hi}/{layout}/C6-{m}-vs-{lower_of(hi)}") == "fails"
            for m in MEASURES
        }
        assert fails == {needed_for(hi, layout).strengthenings is None}, (hi, layout)


def _holds(hi: str, layout: str, **on: bool) -> bool:
    relation = Relation(**{**vars(PLAIN), **on})
    results = decide(c6_queries(*_pair(base_subjects(), hi), layout, relation))
    return all(r.verdict == "holds" for r in results.values())


@pytest.mark.parametrize("layout", LAYOUT_NAMES)
@pytest.mark.parametrize("hi", [hi for hi, _ in CHAIN_PAIRS])
def test_each_strengthening_is_needed_where_the_table_says(hi: str, layout: str) -> None:
    strengthenings = needed_for(hi, layout).strengthenings
    if strengthenings is None:
        # Not a relaxation (the manifest's expected failure): no relation can hold.
        assert not _holds(hi, layout, **dict.fromkeys(vars(PLAIN), True))
        return
    needed = set(strengthenings)
    assert _holds(hi, layout, **dict.fromkeys(needed, True))
    for dropped in needed:
        assert not _holds(hi, layout, **{name: True for name in needed - {dropped}}), dropped


# -- the lane step is the scheduler's loop ---------------------------------------------


def _lanes_on_ints(subject: Subject, p: StepParams, needs: list[int]) -> list[Any]:
    lane = Lane(subject.open_book(p).ledger, 0, 0, True)
    granted = []
    for need in needs:
        lane, got = serve(subject, p, lane, need)
        granted.append(got)
    return granted


def test_serve_folded_over_a_queue_is_fcfs_step() -> None:
    rng = random.Random(6)
    subjects = {**base_subjects(), "mutant": mutant_named(MUTANT).build()}
    for _ in range(400):
        layout = layout_named(rng.choice(LAYOUT_NAMES))
        b = rng.randint(1, 40)
        p = StepParams(b, rng.randint(1, 40), rng.randint(1, b), rng.randint(1, 5), layout)
        needs = [rng.randint(1, 12) for _ in range(rng.randint(1, 12))]
        for subject in subjects.values():
            if subject.policy.accepts(p):
                assert _lanes_on_ints(subject, p, needs) == fcfs_step(subject, p, needs).granted


@pytest.mark.parametrize("layout", LAYOUT_NAMES)
def test_serve_folded_over_a_queue_is_fcfs_step_symbolically(layout: str) -> None:
    """For every config and every queue of 3 requests (z3): the same grants."""
    cfg = sym_config(layout_named(layout))
    needs = list(z3.Ints("need0 need1 need2"))
    for subject in base_subjects().values():
        lane = opened_lane(subject, cfg.p)
        granted = []
        for need in needs:
            lane, got = serve(subject, cfg.p, lane, need)
            granted.append(got)
        unrolled = fcfs_step(subject, cfg.p, needs).granted
        solver = z3.Solver()
        solver.add(*cfg.engine(), accepted(subject, cfg.p), *(n >= 1 for n in needs))
        solver.add(z3.Or(*(a != b for a, b in zip(granted, unrolled, strict=True))))
        assert solver.check() == z3.unsat, subject.profile
