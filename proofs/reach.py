"""The reach of each finding: where in a realistic config space an expected failure occurs.

A finding of ``dualbudget prove`` comes with a minimal witness (B = 1, K = 1, ...). Its
*reach* is the part of the realistic box ``REACH_BOX`` (``max_num_batched_tokens`` B from
512 to 16384, ``max_num_seqs`` from 16 to 1024, K from 1 to 8, ``max_num_scheduled_tokens``
at vLLM's default B) where the same obligation fails. It is computed by z3 on the very
queries of the obligation (``obligations.family_queries``: the spec's code on z3 terms),
with the config bounded to the box instead of left free; nothing is sampled:

- per K, z3 decides whether any config of the box fails (``premises and not goal``
  satisfiable with K fixed): the set of K is exact, and ``none`` is a proof;
- for a K that fails, the region is named by the first candidate for which z3 proves that
  every failing config lies inside it (``failing and not candidate`` unsatisfiable) and
  finds a failing state at each of its corners (and, for a line, at the two points the
  line was read from): every config the profile accepts, every config it refuses, or
  those on one side of a line ``B <= a*max_num_seqs + c`` (``a`` and ``c`` read off the
  failing set's extreme B at two adjacent max_num_seqs with z3 Optimize). Inside the
  candidate beyond its corners the failure is not proved config by config; where no
  candidate passes, the failing set's bounding ranges are given, marked as such.

The event flow: the queries keep the step's frame as ``(n, T)`` (count and target tokens
of the scheduled requests), so z3 also answers whether a failing state exists where every
scheduled request is a steady-state decode (``q = 1 + K``: one token plus K drafts to
verify) or whether it needs smaller requests (new prompts, prefill chunks). A replayable
scenario is then built at one config of the region: one step of requests arriving
together (prompts of the needed sizes, which vLLM schedules in FCFS order in their first
step), checked by running the spec's FCFS step on ints (``model.fcfs_step``), as the
witnesses are; ``tests/unit/test_reach.py`` replays each through the reference and the live
tests through vLLM.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import z3

from dualbudget.spec.invariants import buffer_peak_ok, one_more_token_fits, one_token_fits
from dualbudget.spec.methods import layout_named
from dualbudget.spec.policies import StepParams

from .model import Subject, fcfs_step
from .obligations import Obligation, family_queries, lower_of
from .solve import subterms
from .witness import witness_scenario


@dataclass(frozen=True)
class Box:
    """The realistic config space of the reach queries; ``S`` is vLLM's default, ``B``."""

    b: tuple[int, int] = (512, 16384)
    m: tuple[int, int] = (16, 1024)
    k: tuple[int, int] = (1, 8)

    def text(self) -> str:
        return (
            f"max_num_batched_tokens B in [{self.b[0]}, {self.b[1]}], max_num_seqs in"
            f" [{self.m[0]}, {self.m[1]}], K in [{self.k[0]}, {self.k[1]}],"
            " max_num_scheduled_tokens = B (vLLM's default)"
        )


REACH_BOX = Box()
REACH_TIMEOUT_MS = 20000
"""Per z3 call (quantifier elimination included); an unknown is reported, never a 'none'."""

b_sym, s_sym, m_sym, k_sym = z3.Ints("B S max_num_seqs K")
"""The config symbols of ``model.sym_config`` (tag ""): the queries' own terms."""
_CONFIG_NAMES = ("B", "S", "max_num_seqs", "K")


@dataclass
class KRegion:
    """The failing configs at one K: a region z3 proved them inside, or their ranges."""

    k: int
    region: str
    """``none``, ``every config the profile accepts``, ``accepted, B <= a*max_num_seqs +
    c``, ..., ``ranges`` or ``unknown``."""
    proved: bool
    """True when z3 proved the failing set inside ``region`` and found failures at its
    corners (``none``: no failing config at all); False for bounding ranges."""
    slope: int | None = None
    offset: int | None = None
    b_range: tuple[int, int] | None = None
    m_range: tuple[int, int] | None = None


@dataclass
class Reach:
    obligation: str
    profile: str
    layout: str
    check: str
    contract: str
    """The obligation's contract item (``C3``, ``C4``, ``C5``, ``C6``)."""
    per_k: list[KRegion] = field(default_factory=list)
    decodes: bool | None = None
    """A failing state whose scheduled requests are all steady-state decodes exists (True),
    none does (False: it needs requests of fewer than 1 + K tokens), or the query has no
    frame to ask (None: C4-converse, C6)."""
    config: dict[str, int] | None = None
    """The region config of the scenario: B, max_num_seqs, K."""
    needs: list[int] | None = None
    """The scenario's queue: prompt sizes, arriving together."""
    broken: str = ""
    scenario: dict[str, Any] | None = None
    scenario_path: str | None = None
    """Where ``prove --reach`` wrote ``scenario``."""
    seconds: float = 0.0

    @property
    def ks(self) -> list[int]:
        return [r.k for r in self.per_k if r.region not in ("none", "unknown")]

    def region(self) -> str:
        """The region in one line: ``none``, or per K (runs of K with the same rule)."""
        if any(r.region == "unknown" for r in self.per_k):
            return "unknown (a z3 call timed out)"
        failing = [r for r in self.per_k if r.region != "none"]
        if not failing:
            return "none"
        return "; ".join(_describe_runs(failing))

    def event_flow(self) -> str:
        if self.check == "C4-converse":
            flow = "at engine start: the config is refused before any request"
        elif self.decodes is True:
            flow = "steady-state decodes (q = 1 + K) suffice"
        elif self.decodes is False:
            flow = "needs requests of < 1 + K tokens (new prompts, prefill chunks)"
        else:
            flow = "a step of new prompts"
        if self.needs is None:
            return f"{flow}; no scenario found at a region config" if self.ks else "no"
        sizes = _sizes(self.needs)
        cfg = self.config or {}
        return (
            f"yes: {flow}; scenario B={cfg.get('B')} max_num_seqs={cfg.get('max_num_seqs')}"
            f" K={cfg.get('K')}, {sizes} arriving at once"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "obligation": self.obligation,
            "profile": self.profile,
            "layout": self.layout,
            "check": self.check,
            "box": REACH_BOX.text(),
            "region": self.region(),
            "ks": self.ks,
            "per_k": [
                {
                    "K": r.k,
                    "region": r.region,
                    "exact": r.proved,
                    "b_range": list(r.b_range) if r.b_range else None,
                    "max_num_seqs_range": list(r.m_range) if r.m_range else None,
                }
                for r in self.per_k
            ],
            "decodes_suffice": self.decodes,
            "event_flow": self.event_flow(),
            "reachable": self.needs is not None,
            "config": self.config,
            "needs": self.needs,
            "broken": self.broken,
            "scenario": self.scenario_path,
            "seconds": round(self.seconds, 3),
        }


def _sizes(needs: Sequence[int]) -> str:
    runs: list[tuple[int, int]] = []
    for q in needs:
        if runs and runs[-1][0] == q:
            runs[-1] = (q, runs[-1][1] + 1)
        else:
            runs.append((q, 1))
    words = [f"{n} x {q}-token prompts" if n > 1 else f"one {q}-token prompt" for q, n in runs]
    return " + ".join(words)


def _describe_runs(failing: Sequence[KRegion]) -> list[str]:
    """Group consecutive K with one rule; a line's slope linear in K is written in K."""
    groups: list[list[KRegion]] = []
    for r in failing:
        last = groups[-1][-1] if groups else None
        if last is not None and last.k + 1 == r.k and _shape(last) == _shape(r):
            groups[-1].append(r)
        else:
            groups.append([r])
    out = []
    for group in groups:
        if not group[0].proved:
            out.append(_ranges(group))
            continue
        ks = f"K={group[0].k}" if len(group) == 1 else f"K={group[0].k}..{group[-1].k}"
        out.append(f"{ks}: {_rule(group)}")
    return out


def _shape(r: KRegion) -> str:
    if r.slope is None:
        return r.region if r.proved else "ranges"
    return r.region.split(" B ")[0] + (" <=" if "<=" in r.region else " >=")


def _rule(group: Sequence[KRegion]) -> str:
    first = group[0]
    if first.slope is None or len(group) == 1:
        if len(group) == 1 or first.proved:
            return first.region if first.proved else _ranges(group)
        return _ranges(group)
    # slope and offset as alpha*K + beta when they are linear in K over the group
    terms = []
    for values in ([r.slope for r in group], [r.offset for r in group]):
        ints = [v for v in values if v is not None]
        alpha = ints[1] - ints[0]
        beta = ints[0] - alpha * group[0].k
        if any(v != alpha * r.k + beta for v, r in zip(ints, group, strict=True)):
            return "; ".join(f"K={r.k}: {r.region}" for r in group)
        terms.append(_linear_in_k(alpha, beta))
    head = first.region.split(" B ")[0]
    op = "<=" if "<=" in first.region else ">="
    slope = terms[0] if terms[0].isdigit() or terms[0] == "K" else f"({terms[0]})"
    offset = terms[1]
    if offset == "0":
        return f"{head} B {op} {slope}*max_num_seqs"
    if offset.startswith("-") and offset[1:].isdigit():
        return f"{head} B {op} {slope}*max_num_seqs - {offset[1:]}"
    return f"{head} B {op} {slope}*max_num_seqs + ({offset})"


def _linear_in_k(alpha: int, beta: int) -> str:
    if alpha == 0:
        return str(beta)
    k = "K" if alpha == 1 else f"{alpha}K"
    return k if beta == 0 else f"{k} {'+' if beta > 0 else '-'} {abs(beta)}"


def _ranges(group: Sequence[KRegion]) -> str:
    return "; ".join(
        f"K={r.k}: B {_span(r.b_range)}, max_num_seqs {_span(r.m_range)} (bounding ranges)"
        for r in group
    )


def _span(bounds: tuple[int, int] | None) -> str:
    return "?" if bounds is None else f"{bounds[0]}..{bounds[1]}"


# -- the region, per K -------------------------------------------------------------------


def _constants(exprs: Sequence[Any]) -> dict[str, Any]:
    return {
        e.decl().name(): e
        for e in subterms(exprs)
        if z3.is_const(e) and e.decl().kind() == z3.Z3_OP_UNINTERPRETED
    }


def _box(k: int) -> list[Any]:
    box = REACH_BOX
    return [
        b_sym >= box.b[0],
        b_sym <= box.b[1],
        m_sym >= box.m[0],
        m_sym <= box.m[1],
        k_sym == k,
        s_sym == b_sym,
    ]


def failing_formulas(ob: Obligation, subjects: Mapping[str, Subject]) -> list[Any]:
    """``premises and not goal`` of each query of the obligation's check (premises alone
    for a reachability check), as the obligation states them."""
    out = []
    for query in family_queries(ob.family, subjects, ob.profile, ob.layout):
        if ob.check not in query.goals:
            continue
        goal = query.goals[ob.check]
        out.append(z3.And(*query.premises, *([] if goal is None else [z3.Not(goal)])))
    return out


def _at_k(formula: Any, k: int) -> Any:
    return z3.simplify(z3.substitute(formula, (k_sym, z3.IntVal(k)), (s_sym, b_sym)))


def _solver(*assertions: Any) -> z3.Solver:
    solver = z3.Solver()
    solver.set("timeout", REACH_TIMEOUT_MS)
    solver.add(*assertions)
    return solver


def _extreme(formulas: Sequence[Any], term: Any, maximize: bool, *extra: Any) -> int | None:
    """The least or greatest value of ``term`` over the failing states (z3 Optimize)."""
    opt = z3.Optimize()
    opt.set("timeout", REACH_TIMEOUT_MS)
    opt.add(z3.Or(*formulas), *extra)
    handle = opt.maximize(term) if maximize else opt.minimize(term)
    if opt.check() != z3.sat:
        return None
    value = opt.upper(handle) if maximize else opt.lower(handle)
    return value.as_long() if z3.is_int_value(value) else None


def _fails_at(formulas: Sequence[Any], k: int, b: int, m: int) -> bool:
    answer = _solver(*_box(k), z3.Or(*formulas), b_sym == b, m_sym == m).check()
    return bool(answer == z3.sat)


def _corners(candidate: Any, k: int) -> list[tuple[int, int]]:
    """The extreme (B, max_num_seqs) of a candidate region in the box: least and greatest B
    at its least and greatest max_num_seqs."""
    out = []
    for m_max in (False, True):
        m = _extreme([candidate], m_sym, m_max, *_box(k))
        if m is None:
            continue
        for b_max in (False, True):
            b = _extreme([candidate], b_sym, b_max, *_box(k), m_sym == m)
            if b is not None:
                out.append((b, m))
    return sorted(set(out))


def region_at(ob: Obligation, subject: Subject, formulas: Sequence[Any], k: int) -> KRegion:
    """The failing configs at K: ``none`` when z3 finds none in the box; else the first
    candidate that z3 proves contains every failing config (``failing and not candidate``
    unsat) and that fails at each of its corners and, for a line, at the two points it
    was read from."""
    failing = [_at_k(f, k) for f in formulas]
    sat = _solver(*_box(k), z3.Or(*failing)).check()
    if sat == z3.unsat:
        return KRegion(k, "none", True)
    if sat == z3.unknown:
        return KRegion(k, "unknown", False)
    p = StepParams(b_sym, b_sym, m_sym, z3.IntVal(k), layout_named(ob.layout))
    accepts = _as_bool(subject.policy.accepts(p))
    bases = (
        ("every config the profile accepts", z3.And(b_sym >= m_sym, accepts)),
        ("every config the profile refuses", z3.And(b_sym >= m_sym, z3.Not(accepts))),
    )
    b_range = (_extreme(failing, b_sym, False, *_box(k)), _extreme(failing, b_sym, True, *_box(k)))
    m_range = (_extreme(failing, m_sym, False, *_box(k)), _extreme(failing, m_sym, True, *_box(k)))
    ranges: dict[str, Any] = {
        "b_range": None if None in b_range else b_range,
        "m_range": None if None in m_range else m_range,
    }

    def contains(candidate: Any) -> bool:
        answer = _solver(*_box(k), z3.Or(*failing), z3.Not(candidate)).check()
        return bool(answer == z3.unsat)

    def attained(candidate: Any, points: Sequence[tuple[int, int]] = ()) -> bool:
        corners = [*_corners(candidate, k), *points]
        return bool(corners) and all(_fails_at(failing, k, b, m) for b, m in corners)

    for text, base in bases:
        if contains(base) and attained(base):
            return KRegion(k, text, True, **ranges)
    for text, base in bases:
        if not contains(base):
            continue
        for maximize, op in ((True, "<="), (False, ">=")):
            line = _line(failing, k, maximize)
            if line is None:
                continue
            a, c, points = line
            side = b_sym <= a * m_sym + c if maximize else b_sym >= a * m_sym + c
            candidate = z3.And(base, side)
            if contains(candidate) and attained(candidate, points):
                short = "accepted" if "accepts" in text else "refused"
                sign = f" + {c}" if c > 0 else (f" - {-c}" if c < 0 else "")
                text = f"{short}, B {op} {a}*max_num_seqs{sign}"
                return KRegion(k, text, True, a, c, **ranges)
    return KRegion(k, "ranges", False, **ranges)


def _line(
    failing: Sequence[Any], k: int, maximize: bool
) -> tuple[int, int, list[tuple[int, int]]] | None:
    """``(a, c, points)`` of ``B = a*m + c`` through the failing set's extreme B at two
    adjacent m where it is inside the box (not at its B bound, not on ``B = m``)."""
    lo = _extreme(failing, m_sym, False, *_box(k))
    hi = _extreme(failing, m_sym, True, *_box(k))
    if lo is None or hi is None:
        return None
    edge = REACH_BOX.b[1] if maximize else REACH_BOX.b[0]
    for m1 in sorted({lo, (lo + hi) // 2, hi - 1}):
        if not lo <= m1 < hi:
            continue
        b1 = _extreme(failing, b_sym, maximize, *_box(k), m_sym == m1)
        b2 = _extreme(failing, b_sym, maximize, *_box(k), m_sym == m1 + 1)
        if b1 is None or b2 is None or edge in (b1, b2) or b1 == m1:
            continue
        a = b2 - b1
        return a, b1 - a * m1, [(b1, m1), (b2, m1 + 1)]
    return None


def _as_bool(cond: Any) -> Any:
    return z3.BoolVal(cond) if isinstance(cond, bool) else cond


# -- the event flow ----------------------------------------------------------------------


def _decodes_suffice(formulas: Sequence[Any], ks: Sequence[int]) -> bool | None:
    """Whether some failing state in the box has every scheduled request at ``1 + K``
    tokens: the frame ``T = n*(1 + K)``, and the tracked or cut request too."""
    asked = False
    for k in ks:
        for formula in formulas:
            names = _constants([formula])
            if "n" not in names or "T" not in names:
                continue
            asked = True
            n, t = names["n"], names["T"]
            decode = [t == n * (1 + k_sym)]
            for name in ("need", "q_x"):
                if name in names:
                    decode.append(names[name] == 1 + k_sym)
            if _solver(formula, *_box(k), *decode).check() == z3.sat:
                return True
    return False if asked else None


Check = Callable[[StepParams, list[int]], str | None]


def _violation_check(ob: Obligation, subjects: Mapping[str, Subject]) -> Check:
    """The obligation's violation on one concrete step (spec code on ints): a message
    saying what broke, or None."""
    subject = subjects[ob.profile]

    def check(p: StepParams, needs: list[int]) -> str | None:
        if ob.check == "C4-converse":
            if one_token_fits(p) and not subject.policy.accepts(p):
                return f"{ob.profile} refuses the config although one 1-token request fits"
            return None
        if not subject.policy.accepts(p):
            return None
        run = fcfs_step(subject, p, needs)
        b = p.max_num_batched_tokens
        if ob.contract == "C3":
            opened = subject.policy.open(p).token_budget
            if not buffer_peak_ok(p, opened, run.target, run.draft):
                return f"C3: {int(run.count)} requests, T={run.target}, D={run.draft} > B={b}"
            return None
        if ob.contract == "C5":
            for i, got in enumerate(run.granted):
                if got >= needs[i]:
                    continue
                draft = run.draft - (p.draft_rows(got) if got > 0 else 0)
                count = run.count - (1 if got > 0 else 0)
                if one_more_token_fits(p, run.target - got, draft, count, got):
                    return (
                        f"C5: request {i} got {got} of {needs[i]} tokens; one more fits"
                        f" (T={run.target}, D={run.draft}, B={b})"
                    )
                return None
            return None
        if ob.contract == "C6":
            lower = subjects[lower_of(ob.profile) or ob.profile]
            if not lower.policy.accepts(p):
                return None
            other = fcfs_step(lower, p, needs)
            if "tokens" in ob.check and run.target < other.target:
                return f"C6: {ob.profile} T={run.target} < {lower.profile} T={other.target}"
            if "requests" in ob.check and run.count < other.count:
                return f"C6: {ob.profile} {run.count} requests < {lower.profile} {other.count}"
            return None
        return None

    return check


def _queues(p: StepParams) -> list[list[int]]:
    """The queues tried at a config: n one-token prompts, one long prompt, both."""
    b, m, k = p.max_num_batched_tokens, p.max_num_seqs, p.num_speculative_tokens
    per = max(1, p.draft_rows(1))
    counts = sorted({n for n in (1, 2, b // per + 1, b // (k + 1) + 1, b // k + 1, m) if n <= m})
    out = [[1] * n for n in counts]
    out += [[b], [2 * b], [1, b], [1, 2 * b]]
    out += [[1] * (n - 1) + [b] for n in counts if n > 1]
    return out


def _scenario(
    ob: Obligation,
    subjects: Mapping[str, Subject],
    formulas: Sequence[Any],
    ks: Sequence[int],
) -> tuple[dict[str, int], list[int], str] | None:
    """A config of the region (least B, then max_num_seqs, per failing K) and a queue of
    prompts whose first step shows the violation."""
    check = _violation_check(ob, subjects)
    layout = layout_named(ob.layout)
    for k in ks:
        for pick in (False, True):  # the least B first, then the largest
            opt = z3.Optimize()
            opt.set("timeout", REACH_TIMEOUT_MS)
            opt.add(*_box(k), z3.Or(*formulas))
            if pick:
                opt.maximize(b_sym)
            else:
                opt.minimize(b_sym)
            opt.minimize(m_sym)
            if opt.check() != z3.sat:
                continue
            model = opt.model()
            b = model.eval(b_sym, model_completion=True).as_long()
            m = model.eval(m_sym, model_completion=True).as_long()
            p = StepParams(b, b, m, k, layout)
            for needs in _queues(p):
                broken = check(p, needs)
                if broken is not None:
                    return {"B": b, "max_num_seqs": m, "K": k}, needs, broken
    return None


def reach_units(
    obligations: Sequence[Obligation], expected: Callable[[str], str]
) -> list[Obligation]:
    """The units of ``prove --reach``: each expected failure among ``obligations``
    (``expected``: the manifest's verdict of an obligation name), in their order. Each
    unit is independent of the others (``reach_of`` of it), so any executor may run them."""
    return [ob for ob in obligations if expected(ob.name) == "fails"]


def reach_of(ob: Obligation, subjects: Mapping[str, Subject]) -> Reach:
    """The reach of one expected failure (see the module docstring)."""
    started = time.perf_counter()
    subject = subjects[ob.profile]
    formulas = failing_formulas(ob, subjects)
    out = Reach(ob.name, ob.profile, ob.layout, ob.check, ob.contract)
    for k in range(REACH_BOX.k[0], REACH_BOX.k[1] + 1):
        out.per_k.append(region_at(ob, subject, formulas, k))
    ks = out.ks
    if ks:
        out.decodes = _decodes_suffice(formulas, ks)
        found = _scenario(ob, subjects, formulas, ks)
        if found is not None:
            out.config, out.needs, out.broken = found
            cfg = out.config
            out.scenario = witness_scenario(
                ob.profile, ob.layout, cfg["B"], cfg["B"], cfg["max_num_seqs"], cfg["K"], out.needs
            )
    out.seconds = time.perf_counter() - started
    return out


# -- the table ---------------------------------------------------------------------------

REACH_HEADER = ("finding", "minimal witness", "realistic region", "reachable in the event flow")


def minimal_witness(table: str | None) -> str:
    """The config and the broken bound of a witness table (``witness.Witness.table``)."""
    if not table:
        return "none found"
    config, broken = "", ""
    for line in table.splitlines():
        line = line.strip()
        if line.startswith("config:"):
            config = line.removeprefix("config:").strip()
        elif line.startswith("broken:"):
            broken = line.removeprefix("broken:").strip()
    config = config.split(" layout=")[0]
    for long, short in (("max_num_batched_tokens=", "B="), ("max_num_scheduled_tokens=", "S=")):
        config = config.replace(long, short)
    return f"{config}: {broken}" if broken else config


def reach_rows(reaches: Sequence[Reach], witnesses: Mapping[str, str]) -> list[list[str]]:
    """A header row, then per finding: its name, minimal witness (``witnesses``: name ->
    ``minimal_witness``), realistic region and event-flow reachability."""
    rows = [list(REACH_HEADER)]
    for r in reaches:
        rows.append(
            [r.obligation, witnesses.get(r.obligation, "none found"), r.region(), r.event_flow()]
        )
    return rows
