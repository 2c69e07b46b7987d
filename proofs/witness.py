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

The scenario JSON follows DESIGN.md section 4 and reference/scenario.py's
``dualbudget-scenario`` version 1 (written here by hand: proofs/ may not import the
reference).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import z3

from dualbudget.spec.invariants import buffer_peak_ok
from dualbudget.spec.methods import MethodLayout, layout_named
from dualbudget.spec.policies import StepParams

from .model import Subject, SymConfig, accepted, as_bool, fcfs_step, fits_hard_limits, sym_config
from .obligations import C6_QUEUE, Obligation, lower_of

WITNESS_MAX_REQUESTS = 4
WITNESS_MAX_TOKENS = 64
WITNESS_MAX_K = 16
WITNESS_TIMEOUT_MS = 5000
SCENARIO_FORMAT = "dualbudget-scenario"
SCENARIO_VERSION = 1


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
        return scenario_json(self.profile, self.layout, self.b, self.s, self.m, self.k, self.needs)

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

    def write(self, directory: Path) -> Path:
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / (self.obligation.replace("/", "__") + ".json")
        path.write_text(json.dumps(self.scenario(), indent=2) + "\n")
        return path


def speculative_json(layout: MethodLayout, k: int) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "method": layout.methods[-1] if layout.parallel_drafting else layout.methods[0],
        "num_speculative_tokens": k,
        # None in the table: vLLM forces parallel drafting (DFlash, DSpark).
        "parallel_drafting": True if layout.parallel_drafting is None else layout.parallel_drafting,
    }
    if layout.dspark_layout is not None:
        spec["dspark_layout"] = layout.dspark_layout
    return spec


def scenario_json(
    profile: str, layout_name: str, b: int, s: int, m: int, k: int, needs: list[int]
) -> dict[str, Any]:
    """One step's worth of a scenario: every request arrives at step 0 with a prompt of its
    ``need`` tokens and one output token; the KV pool and ``max_model_len`` are large
    enough never to bind, so the first step is the budget decision alone."""
    layout = layout_named(layout_name)
    block_size = 16
    max_model_len = max(needs) + k + 16
    blocks_per_request = -(-(max_model_len + k + 1) // block_size)
    config: dict[str, Any] = {
        "max_num_batched_tokens": b,
        "max_num_seqs": m,
        "max_model_len": max_model_len,
        "block_size": block_size,
        "num_gpu_blocks": (len(needs) + 1) * blocks_per_request + 1,
        "enable_chunked_prefill": True,
        "long_prefill_token_threshold": 0,
        "scheduling_policy": "fcfs",
    }
    if s != b:
        config["max_num_scheduled_tokens"] = s
    config["speculative_config"] = speculative_json(layout, k)
    return {
        "format": SCENARIO_FORMAT,
        "version": SCENARIO_VERSION,
        "profile": profile,
        "config": config,
        "requests": [
            {"id": f"r{i}", "prompt_len": need, "max_tokens": 1, "arrival_step": 0, "priority": 0}
            for i, need in enumerate(needs)
        ],
        "acceptance": {"fixed": 0},
    }


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
        fits = as_bool(buffer_peak_ok(p, cfg.hard_target_cap(), 1, p.draft_rows(1)))
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
        progress = z3.And(subject.policy.max_active_requests(p) >= 1, run.granted[0] >= 1)
        return [*base, z3.Not(progress)]
    if kind == "C4-no-stall":
        return [*base, as_bool(run.stalled)]
    if kind == "C5":
        # The first request not served in full could have taken one more token.
        options = []
        for i, got in enumerate(run.granted):
            served = [run.granted[j] == needs[j] for j in range(i)]
            draft = run.draft - z3.If(got > 0, p.draft_rows(got), 0) + p.draft_rows(got + 1)
            count = run.count + z3.If(got > 0, 0, 1)
            more = fits_hard_limits(cfg, run.target + 1, draft, count)
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
