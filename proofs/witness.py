"""Concrete, minimal witnesses of failed obligations, as tables and scenario files.

A witness is one scheduler step from an empty start: a configuration, a FCFS queue of new
requests (request ``i`` a prompt of ``need_i`` tokens), and what the profile's code gives
each. It is searched for with z3 on the same ``fcfs_step`` the proofs use, then the step is
re-run on plain ints (the spec code, no z3) to print the table, so the table is what the
code does, not what the solver claims.

Minimal means: the smallest ``max_num_batched_tokens`` (B), then the smallest ``K``, then
the fewest requests, then ``max_num_scheduled_tokens`` left at its default (= B) where
possible, then the smallest ``max_num_seqs`` and the smallest prompts. The search is
bounded: at most ``WITNESS_MAX_REQUESTS`` requests (C6: its queue bound), ``B``, ``S``
and prompts at most ``WITNESS_MAX_TOKENS``, ``K`` at most ``WITNESS_MAX_K``. A failed
obligation whose violation needs more than that is reported without a scenario.

The scenario JSON is written by the format's one writer, ``spec/scenario_format.py``
(the reference reads and writes it with the same), and the layout's
``speculative_config`` is ``SpeculativeConfig.for_layout``'s.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import z3

from dualbudget.spec.config import EngineConfig, SpeculativeConfig
from dualbudget.spec.invariants import (
    buffer_peak_ok,
    empty_step_progress,
    one_more_token_fits,
    one_token_fits,
)
from dualbudget.spec.methods import layout_named
from dualbudget.spec.policies import StepParams
from dualbudget.spec.scenario_format import acceptance_json, request_json, scenario_json

from .model import Subject, SymConfig, accepted, as_bool, fcfs_step, sym_config
from .obligations import C6_QUEUE, Obligation, lower_of

WITNESS_MAX_REQUESTS = 4
WITNESS_MAX_TOKENS = 64
WITNESS_MAX_K = 16
WITNESS_TIMEOUT_MS = 15000
"""Per solver call. A witness call that found its case in 0.5 s on an idle machine took
2.8 s at a load of 6 on 2 cores; the margin keeps a busy CI from losing a witness."""


@dataclass
class Witness:
    obligation: str
    kind: str
    profile: str
    layout: str
    b: int
    s: int
    m: int
    k: int
    needs: list[int]
    granted: dict[str, list[int]] = field(default_factory=dict)
    """profile -> tokens each request got (the spec code run on ints)."""
    broken: str = ""
    """Which bound broke, in words with the numbers."""

    def params(self) -> StepParams:
        return StepParams(self.b, self.s, self.m, self.k, layout_named(self.layout))

    def scenario(self) -> dict[str, Any]:
        return witness_scenario(
            self.profile, self.layout, self.b, self.s, self.m, self.k, self.needs
        )

    def table(self) -> str:
        p = self.params()
        lines = [
            f"witness for {self.obligation} ({self.kind})",
            f"  config: max_num_batched_tokens={self.b} max_num_scheduled_tokens={self.s}"
            f" max_num_seqs={self.m} K={self.k} layout={self.layout}",
        ]
        header = "  request  need  C(1)" + "".join(f"  {name:>15}" for name in self.granted)
        lines.append(header)
        for i, need in enumerate(self.needs):
            row = f"  r{i:<7} {need:>4}  {p.draft_rows(1):>4}"
            row += "".join(f"  {got[i]:>15}" for got in self.granted.values())
            lines.append(row)
        for name, got in self.granted.items():
            target = sum(got)
            draft = sum(p.draft_rows(q) for q in got if q > 0)
            lines.append(f"  {name}: T={target} D={draft} requests={sum(1 for q in got if q > 0)}")
        lines.append(f"  broken: {self.broken}")
        return "\n".join(lines)


def witness_scenario(
    profile: str, layout_name: str, b: int, s: int, m: int, k: int, needs: list[int]
) -> dict[str, Any]:
    """One step's worth of a scenario: every request arrives at step 0 with a prompt of its
    ``need`` tokens and one output token; the KV pool and ``max_model_len`` are large
    enough never to bind, so the first step is the budget decision alone."""
    block_size = 16
    max_model_len = max(needs) + k + 16
    blocks_per_request = -(-(max_model_len + k + 1) // block_size)
    config = EngineConfig(
        max_num_batched_tokens=b,
        max_num_seqs=m,
        max_model_len=max_model_len,
        block_size=block_size,
        num_gpu_blocks=(len(needs) + 1) * blocks_per_request + 1,
        max_num_scheduled_tokens=s if s != b else None,
        speculative_config=SpeculativeConfig.for_layout(layout_named(layout_name), k),
    )
    requests = [request_json(f"r{i}", need, 1) for i, need in enumerate(needs)]
    return scenario_json(profile, config, requests, acceptance_json(fixed=0))


# -- the search -------------------------------------------------------------------------


def _kind(ob: Obligation) -> str | None:
    if ob.check in ("C3", "C3-static-cap"):
        return "C3"
    if ob.check in ("C4", "C4-no-stall", "C4-converse", "C5"):
        return ob.check
    if ob.family == "C6":
        return "C6"
    return None


def _violation(
    kind: str, ob: Obligation, subjects: Mapping[str, Subject], cfg: SymConfig, needs: list[Any]
) -> list[Any]:
    """Constraints of a step that shows the obligation's violation."""
    subject = subjects[ob.profile]
    p = cfg.p
    if kind == "C4-converse":
        fits = as_bool(one_token_fits(p))
        return [fits, z3.Not(accepted(subject, p)), needs[0] == 1]
    base = [accepted(subject, p)]
    run = fcfs_step(subject, p, needs)
    if kind == "C3":
        opened = subject.policy.open(p)
        return [
            *base,
            z3.Not(as_bool(buffer_peak_ok(p, opened.token_budget, run.target, run.draft))),
        ]
    if kind == "C4":
        progress = as_bool(empty_step_progress(subject.open_book(p), needs[0]))
        return [*base, z3.Not(progress)]
    if kind == "C4-no-stall":
        return [*base, as_bool(run.stalled)]
    if kind == "C5":
        # The first request not served in full could have taken one more token.
        options = []
        for i, got in enumerate(run.granted):
            served = [run.granted[j] == needs[j] for j in range(i)]
            # The rest of the step: all of it but what request i holds.
            draft = run.draft - z3.If(got > 0, p.draft_rows(got), 0)
            count = run.count - z3.If(got > 0, 1, 0)
            more = as_bool(one_more_token_fits(p, run.target - got, draft, count, got))
            options.append(z3.And(*served, got < needs[i], more))
        return [*base, z3.Or(*options)]
    if kind == "C6":
        lower = subjects[lower_of(ob.profile) or ob.profile]
        other = fcfs_step(lower, p, needs)
        worse = run.target < other.target if "tokens" in ob.check else run.count < other.count
        return [*base, accepted(lower, p), worse]
    raise ValueError(kind)


def find_witness(ob: Obligation, subjects: Mapping[str, Subject]) -> Witness | None:
    kind = _kind(ob)
    if kind is None:
        return None
    max_requests = 1 if kind in ("C4", "C4-converse") else WITNESS_MAX_REQUESTS
    best = _search(ob, kind, subjects, range(1, max_requests + 1))
    if best is None and kind == "C6":
        best = _search(ob, kind, subjects, range(max_requests + 1, C6_QUEUE + 1))
    if best is None:
        return None
    _, v, need_values = best
    return describe(ob, kind, subjects, v["b"], v["s"], v["m"], v["k"], need_values)


Best = tuple[tuple[int, ...], dict[str, int], list[int]]


def _search(
    ob: Obligation, kind: str, subjects: Mapping[str, Subject], sizes: range
) -> Best | None:
    """Optimize proposes (B, K) for each queue length; every smaller (B, K) is then
    refuted with B and K fixed (the formulas are linear then), so the (B, K, requests)
    found is the least within the bounds; the rest is bisected with B, K, N fixed."""
    problems = []
    for n in sizes:
        cfg = sym_config(layout_named(ob.layout))
        needs = list(z3.Ints(" ".join(f"need{i}" for i in range(n))))
        constraints = [
            *cfg.engine(),
            *(x >= 1 for x in needs),
            *(x <= WITNESS_MAX_TOKENS for x in needs),
            cfg.b <= WITNESS_MAX_TOKENS,
            cfg.s <= WITNESS_MAX_TOKENS,
            cfg.k <= WITNESS_MAX_K,
            *_violation(kind, ob, subjects, cfg, needs),
        ]
        problems.append((n, cfg, needs, constraints))
    proposals = []
    for n, cfg, _, constraints in problems:
        opt = z3.Optimize()
        opt.set("timeout", WITNESS_TIMEOUT_MS)
        opt.add(*constraints)
        opt.minimize(cfg.b)
        opt.minimize(cfg.k)
        if opt.check() == z3.sat:
            model = opt.model()
            proposals.append((model.eval(cfg.b).as_long(), model.eval(cfg.k).as_long(), n))
            break  # an upper bound is enough: the refinement below tries every length
    if not proposals:
        return None
    b_best, k_best, _ = min(proposals)
    solvers = []
    for n, cfg, needs, constraints in problems:
        solver = z3.Solver()
        solver.set("timeout", WITNESS_TIMEOUT_MS)
        solver.add(*constraints)
        solvers.append((n, cfg, needs, solver))
    for b in range(1, b_best + 1):
        for k in range(1, (k_best if b == b_best else WITNESS_MAX_K) + 1):
            for n, cfg, needs, solver in solvers:
                solver.push()
                solver.add(cfg.b == b, cfg.k == k)
                model = minimize(solver, [z3.If(cfg.s == cfg.b, 0, 1), cfg.m, z3.Sum(*needs)])
                if model is not None:
                    values = {
                        name: model.eval(term, model_completion=True).as_long()
                        for name, term in (("b", cfg.b), ("s", cfg.s), ("m", cfg.m), ("k", cfg.k))
                    }
                    need_values = [model.eval(x, model_completion=True).as_long() for x in needs]
                    solver.pop()
                    return (b, k, n), values, need_values
                solver.pop()
    return None


def minimize(solver: z3.Solver, objectives: list[Any]) -> z3.ModelRef | None:
    """Lexicographic minimum by iterative tightening: each objective in turn is
    bisected (``objective <= mid``) with the ones before it fixed. Exact when every check
    answers; an ``unknown`` keeps the best model found so far."""
    if solver.check() != z3.sat:
        return None
    model = solver.model()
    for objective in objectives:
        hi = model.eval(objective, model_completion=True).as_long()
        lo = 0
        while lo < hi:
            mid = (lo + hi) // 2
            solver.push()
            solver.add(objective <= mid)
            answer = solver.check()
            if answer == z3.sat:
                model = solver.model()
                hi = model.eval(objective, model_completion=True).as_long()
            solver.pop()
            if answer == z3.unsat:
                lo = mid + 1
            elif answer != z3.sat:
                break
        solver.add(objective == hi)
    return model


def describe(
    ob: Obligation,
    kind: str,
    subjects: Mapping[str, Subject],
    b: int,
    s: int,
    m: int,
    k: int,
    needs: list[int],
) -> Witness:
    """Re-run the witness step on ints and say which bound broke."""
    w = Witness(ob.name, kind, ob.profile, ob.layout, b, s, m, k, needs)
    p = w.params()
    subject = subjects[ob.profile]
    profiles = [ob.profile]
    if kind == "C6":
        profiles.append(lower_of(ob.profile) or ob.profile)
    if kind == "C4-converse":
        profiles.append("dual")
    for name in profiles:
        other = subjects[name]
        if not other.policy.accepts(p):
            w.granted[name + " (rejects)"] = [0] * len(needs)
            continue
        w.granted[name] = [int(q) for q in fcfs_step(other, p, needs).granted]
    got = w.granted.get(ob.profile, [0] * len(needs))
    target = sum(got)
    draft = sum(p.draft_rows(q) for q in got if q > 0)
    if kind == "C3":
        opened = subject.policy.open(p).token_budget
        w.broken = (
            f"C3: T={target} (opened target budget {opened}, min(S,B)={min(s, b)}),"
            f" D={draft} > B={b}"
            if draft > b
            else f"C3: T={target} exceeds opened {opened} or min(S,B)={min(s, b)}"
        )
    elif kind == "C5":
        i = next(i for i, q in enumerate(got) if q < needs[i])
        more = got[i] + 1
        draft_more = draft - (p.draft_rows(got[i]) if got[i] > 0 else 0) + p.draft_rows(more)
        w.broken = (
            f"C5: r{i} got {got[i]} of {needs[i]}; with {more} the step would hold"
            f" T={target + 1} <= min(S,B)={min(s, b)} and D={draft_more} <= B={b}"
            f" (requests {sum(1 for q in got if q > 0) + (0 if got[i] else 1)} <= max_num_seqs={m})"
        )
    elif kind == "C6":
        lower = profiles[1]
        lo = w.granted.get(lower, [])
        measure = "tokens" if "tokens" in ob.check else "requests"
        hi_v = target if measure == "tokens" else sum(1 for q in got if q > 0)
        lo_v = sum(lo) if measure == "tokens" else sum(1 for q in lo if q > 0)
        w.broken = f"C6: {ob.profile} schedules {hi_v} {measure} < {lower}'s {lo_v}"
    elif kind == "C4-converse":
        w.broken = (
            f"C4 converse: {ob.profile} rejects the config, yet one 1-token request fits"
            f" (T=1 <= min(S,B)={min(s, b)}, D=C(1)={p.draft_rows(1)} <= B={b})"
        )
    elif kind == "C4":
        w.broken = f"C4: the config is accepted but the empty step grants {got[0]} tokens"
    else:
        w.broken = f"{kind}: the step stalls (not exhausted, under its cap, grant 0)"
    return w
