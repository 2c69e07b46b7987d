"""The budget policies as ledgers.

A policy opens a ledger of two budgets at the start of every step, and the scheduler asks
it about each request in turn:

- ``open``      the budgets of an empty step;
- ``room``      the most target tokens one request may be given now (0 or less: none);
- ``exhausted`` whether the scheduler stops looking at further requests this step;
- ``grant``     how many of the ``need`` tokens a request gets now (0: not scheduled);
- ``charge``    what scheduling ``q`` target tokens costs each budget;
- ``refund``    what preempting an already-scheduled request gives back: exactly its charge;
- ``max_active_requests`` the cap on running requests;
- ``admission_rules`` the checks a config must pass, each with vLLM's reason.

The two budgets, in vLLM's names:

- ``token_budget``: target tokens (the target forward's rows) still schedulable;
- ``input_budget``: rows of the model runner's input buffer of ``max_num_batched_tokens``
  rows still free. vLLM's releases charge it ``q + max_num_new_slots_for_drafting``; the
  dual policy charges it the true draft input rows ``C(q)``, since the target forward's
  rows are already bounded by ``token_budget <= max_num_batched_tokens``.

A policy runs on one release (``spec.releases``): the numbers vLLM derives per method
(its slots and lookahead columns) and its config-time admission rules are the release's,
the budget rule is the policy's. Every method is written over ``arith`` so that it runs
on ints and on z3 terms alike.
"""

from __future__ import annotations

from dataclasses import dataclass

from .arith import Cond, Num, all_of, any_of, floordiv, imax, imin, ite
from .config import ConfigError, EngineConfig, check_async_scheduling, check_parallel_drafting
from .methods import NO_SPECULATION, MethodLayout
from .releases import Release


@dataclass(frozen=True)
class Ledger:
    """The budgets left in the current step."""

    token_budget: Num
    input_budget: Num


@dataclass(frozen=True)
class Charge:
    """What one scheduled request cost each budget; the refund gives back exactly this."""

    tokens: Num
    rows: Num


@dataclass(frozen=True)
class StepParams:
    """What a policy reads of the config; ``Num`` so that proofs can make them symbolic."""

    max_num_batched_tokens: Num
    """``B``: rows of the model runner's input buffer."""
    max_num_scheduled_tokens: Num
    """``S``: vLLM's cap on target tokens per step (vLLM's default: ``B``)."""
    max_num_seqs: Num
    num_speculative_tokens: Num
    """``K``; unused (any value) when ``layout`` is ``NO_SPECULATION``."""
    layout: MethodLayout

    @classmethod
    def of(cls, config: EngineConfig) -> StepParams:
        return cls(
            max_num_batched_tokens=config.max_num_batched_tokens,
            max_num_scheduled_tokens=config.scheduled_tokens_cap,
            max_num_seqs=config.max_num_seqs,
            num_speculative_tokens=config.num_speculative_tokens,
            layout=config.layout or NO_SPECULATION,
        )

    def draft_rows(self, q: Num) -> Num:
        """``C(q)``, the method's true draft input rows for ``q`` target tokens."""
        return self.layout.draft_rows(q, self.num_speculative_tokens)


@dataclass(frozen=True)
class AdmissionRule:
    """One check of a config: ``holds`` must be true, else vLLM refuses with ``reason``."""

    field: str
    holds: Cond
    reason: str


class Policy:
    """A budget policy on one release. Subclasses override the methods whose rule differs."""

    name: str = ""

    def __init__(self, release: Release) -> None:
        self.release = release
        """The release whose columns (slots, lookahead) and config checks the policy reads."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.release.version!r})"

    # -- derived numbers -------------------------------------------------------------
    def draft_slots(self, p: StepParams) -> Num:
        """vLLM's ``max_num_new_slots_for_drafting`` in this policy's release."""
        return self.release.draft_slots(p.layout, p.num_speculative_tokens)

    def num_lookahead_tokens(self, p: StepParams) -> Num:
        return self.release.num_lookahead_tokens(p.layout, p.num_speculative_tokens)

    # -- the ledger ------------------------------------------------------------------
    def open(self, p: StepParams) -> Ledger:
        return Ledger(p.max_num_scheduled_tokens, p.max_num_batched_tokens)

    def room(self, p: StepParams, ledger: Ledger) -> Num:
        raise NotImplementedError

    def exhausted(self, p: StepParams, ledger: Ledger) -> Cond:
        return self.room(p, ledger) <= 0

    def grant(self, p: StepParams, ledger: Ledger, need: Num) -> Num:
        return imax(0, imin(need, self.room(p, ledger)))

    def charge(self, p: StepParams, q: Num) -> Charge:
        raise NotImplementedError

    def apply(self, ledger: Ledger, charge: Charge) -> Ledger:
        return Ledger(ledger.token_budget - charge.tokens, ledger.input_budget - charge.rows)

    def refund(self, ledger: Ledger, charge: Charge) -> Ledger:
        return Ledger(ledger.token_budget + charge.tokens, ledger.input_budget + charge.rows)

    # -- admission -------------------------------------------------------------------
    @property
    def caps_own_pass_admission(self) -> bool:
        """Whether ``max_active_requests`` applies the release's DFlash/DSpark cap."""
        return False

    def max_active_requests(self, p: StepParams) -> Num:
        """How many requests may be running at once (vLLM's ``max_num_active_seqs``)."""
        return p.max_num_seqs

    def admission_rules(self, p: StepParams) -> list[AdmissionRule]:
        return []

    def accepts(self, p: StepParams) -> Cond:
        return all_of(True, *(rule.holds for rule in self.admission_rules(p)))

    def validate(self, config: EngineConfig) -> None:
        """Raise ConfigError with vLLM's reason when this policy refuses ``config``: the
        release's drafter and async checks, then its admission rules."""
        check_parallel_drafting(config, self.release)
        check_async_scheduling(config, self.release)
        for rule in self.admission_rules(StepParams.of(config)):
            if not rule.holds:
                raise ConfigError(rule.field, rule.reason)


class Additive(Policy):
    """vLLM's own budget: one input budget; each request costs its target tokens plus
    ``slots``.

    Mirrors ``Scheduler.schedule``: the loops stop once ``input_budget <= slots``, and a
    request gets at most ``min(token_budget, input_budget - slots)`` tokens. Admission is
    ``VllmConfig._set_max_num_scheduled_tokens``'s, which depends on the release: with
    ``caps_own_pass_admission`` it checks ``max_num_batched_tokens`` against
    ``num_lookahead_tokens`` and caps the running requests of DFlash and DSpark at
    ``max_num_batched_tokens // num_lookahead_tokens``; without it, against the slots.
    """

    name = "additive"

    def room(self, p: StepParams, ledger: Ledger) -> Num:
        return imin(ledger.token_budget, ledger.input_budget - self.draft_slots(p))

    def exhausted(self, p: StepParams, ledger: Ledger) -> Cond:
        slots = self.draft_slots(p)
        return any_of(ledger.token_budget <= 0, ledger.input_budget <= slots)

    def charge(self, p: StepParams, q: Num) -> Charge:
        return Charge(q, q + self.draft_slots(p))

    @property
    def caps_own_pass_admission(self) -> bool:
        return self.release.caps_own_pass_admission

    def max_active_requests(self, p: StepParams) -> Num:
        if not (self.caps_own_pass_admission and p.layout.drafts_in_own_pass):
            return p.max_num_seqs
        # vLLM VllmConfig._set_max_num_scheduled_tokens overrides max_num_active_seqs
        draft_seqs = floordiv(p.max_num_batched_tokens, self.num_lookahead_tokens(p))
        return imin(p.max_num_seqs, draft_seqs)

    def admission_rules(self, p: StepParams) -> list[AdmissionRule]:
        # vLLM VllmConfig._set_max_num_scheduled_tokens
        if self.caps_own_pass_admission:
            bound, name = self.num_lookahead_tokens(p), "num_lookahead_tokens"
        else:
            bound, name = self.draft_slots(p), "max_num_new_slots_for_drafting"
        return [
            AdmissionRule(
                "max_num_batched_tokens",
                p.max_num_batched_tokens > bound,
                "VllmConfig does not have enough slots to schedule a token and support the"
                f" speculative decoding settings (max_num_batched_tokens must exceed"
                f" {name}={bound})",
            )
        ]


class GlobalReserve(Policy):
    """vLLM before the adaptive change: a target cap fixed at config time,
    ``S' = max_num_batched_tokens - max_num_seqs * slots``, whatever the step holds.
    """

    name = "global-reserve"

    def reserved_target_cap(self, p: StepParams) -> Num:
        reserve = p.max_num_seqs * self.draft_slots(p)
        return imin(p.max_num_scheduled_tokens, p.max_num_batched_tokens - reserve)

    def open(self, p: StepParams) -> Ledger:
        return Ledger(self.reserved_target_cap(p), p.max_num_batched_tokens)

    def room(self, p: StepParams, ledger: Ledger) -> Num:
        return ledger.token_budget

    def charge(self, p: StepParams, q: Num) -> Charge:
        # The input budget is not tracked: the static reserve is the whole guarantee.
        return Charge(q, 0)

    def admission_rules(self, p: StepParams) -> list[AdmissionRule]:
        return [
            AdmissionRule(
                "max_num_batched_tokens",
                self.reserved_target_cap(p) > 0,
                "max_num_scheduled_tokens (max_num_batched_tokens - max_num_seqs *"
                " max_num_new_slots_for_drafting) does not allow any tokens to be scheduled",
            )
        ]


class Dual(Policy):
    """Separate budgets: target tokens against ``S``, true draft input rows against ``B``."""

    name = "dual"

    def open(self, p: StepParams) -> Ledger:
        target_budget = imin(p.max_num_scheduled_tokens, p.max_num_batched_tokens)
        return Ledger(target_budget, p.max_num_batched_tokens)

    def room(self, p: StepParams, ledger: Ledger) -> Num:
        fixed_rows = p.draft_rows(0)
        if p.layout.carries_target_rows:
            return imin(ledger.token_budget, ledger.input_budget - fixed_rows)
        return ite(ledger.input_budget >= fixed_rows, ledger.token_budget, 0)

    def charge(self, p: StepParams, q: Num) -> Charge:
        return Charge(q, p.draft_rows(q))

    def admission_rules(self, p: StepParams) -> list[AdmissionRule]:
        one_request = p.draft_rows(1)
        return [
            AdmissionRule(
                "max_num_batched_tokens",
                p.max_num_batched_tokens >= one_request,
                f"max_num_batched_tokens must hold one request's draft rows C(1)={one_request}",
            )
        ]


class SplitDraftBudget(Dual):
    """vllm-project/vllm#53080 (open proposal): for every method, a target budget charged
    ``q`` and a draft budget of ``max_num_batched_tokens`` rows charged the method's draft
    input cost ``C(q) = e*q + f(K)``.

    The thread describes a request's draft input as its target segment (all the target
    rows, all but the first, or none), an optional bonus token as anchor, and
    ``num_parallel_drafting_tokens`` mask rows; per method that gives ``C(q)`` with the
    offset ``f(K)`` of each row of ``spec/methods.py`` (EAGLE/MTP ``q``, DFlash and DSpark
    no target segment). Where a request may go is the largest grant whose ``C(q)`` fits
    the draft budget. That is the ``dual`` rule, term for term: this policy is ``Dual``
    under the proposal's name, and its own proofs say so (the admission check, which the
    thread does not state, is ``dual``'s ``B >= C(1)``).
    """

    name = "split-draft-budget"


class SeparateQueryBudget(Additive):
    """vLLM's additive budget, except for the layouts whose drafter runs a query pass
    of its own rows (``query_rows`` not None): those charge a fixed number of query rows
    per request to a separate draft-input budget of ``max_num_batched_tokens`` rows, and
    only ``q`` to the target stage.

    The target stage keeps vLLM's two caps, ``max_num_scheduled_tokens`` and
    ``max_num_batched_tokens``, both charged ``q``: one budget opened at their minimum is
    the same rule, so the ledger's ``token_budget`` is that budget and its
    ``input_budget`` the separate draft-input budget. A request fits while the draft
    budget holds its query rows; its rows do not grow with ``q``, so it then gets the
    whole target budget. Preemption refunds both (``StepBook.preempt``). Admission stays
    the release's config check (``Additive.admission_rules``).
    """

    def query_rows(self, p: StepParams) -> Num | None:
        """Rows one request takes of the separate budget on ``p``'s layout; None where the
        layout keeps the additive charge."""
        raise NotImplementedError

    def open(self, p: StepParams) -> Ledger:
        if self.query_rows(p) is None:
            return super().open(p)
        target_budget = imin(p.max_num_scheduled_tokens, p.max_num_batched_tokens)
        return Ledger(target_budget, p.max_num_batched_tokens)

    def room(self, p: StepParams, ledger: Ledger) -> Num:
        rows = self.query_rows(p)
        if rows is None:
            return super().room(p, ledger)
        return ite(ledger.input_budget >= rows, ledger.token_budget, 0)

    def exhausted(self, p: StepParams, ledger: Ledger) -> Cond:
        rows = self.query_rows(p)
        if rows is None:
            return super().exhausted(p, ledger)
        return any_of(ledger.token_budget <= 0, ledger.input_budget < rows)

    def charge(self, p: StepParams, q: Num) -> Charge:
        rows = self.query_rows(p)
        if rows is None:
            return super().charge(p, q)
        return Charge(q, rows)


class DsparkQueryBudget(SeparateQueryBudget):
    """vllm-project/vllm#52996 (open proposal): DSpark only, ``K`` query rows per request
    from the separate draft-input budget, whatever its ``dspark_layout``; every other
    method keeps the release's additive charge. The thread's own cases (B = 16, K = 4): two
    8-token prefills get 8 each, five 1-token requests admit four
    (``tests/unit/test_upstream_profiles.py`` runs both through the reference).
    """

    name = "dspark-query-budget"

    def query_rows(self, p: StepParams) -> Num | None:
        if "dspark" in p.layout.methods:
            return p.num_speculative_tokens
        return None


class QueryBudget(DsparkQueryBudget):
    """local-inference-lab/vllm#605 (merged in that fork): #52996's DSpark rule (``K``
    query rows), and DFlash from the same separate budget at ``K + 1`` query rows (its
    bonus token and ``K`` masks); every other method keeps the additive per-request
    reservation, and preemption gives back both budgets.
    """

    name = "query-budget"

    def query_rows(self, p: StepParams) -> Num | None:
        if "dflash" in p.layout.methods:
            return p.num_speculative_tokens + 1
        return super().query_rows(p)


POLICY_TYPES: dict[str, type[Policy]] = {
    policy.name: policy
    for policy in (GlobalReserve, Additive, Dual, SplitDraftBudget, DsparkQueryBudget, QueryBudget)
}
"""The budget policies by name; each runs on the release its profile names."""
