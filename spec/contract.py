"""The contract: C1-C6, what every budget policy must guarantee, every step, and C7-C13,
the scheduler's books that any vLLM must keep beside its budgets.

This module is the contract's one home. ``CONTRACT`` holds each item as data (its id, its
name and one sentence); the README, the proofs' README, the design document and the
design-review report render their statements from it (``contract_markdown``), and a test
fails when a rendered copy drifts. The predicates that state each item over ``arith`` (so
that they run on ints in the reference and on z3 terms in the proofs) are in
``invariants``, their docstrings opening with the item's id (tests/unit/test_contract.py pins
each on hand-worked cases). Each obligation of the proofs names its item in its
``contract`` field; docs/design.md §2 maps every item to its predicates, obligations and
tests, generated from those homes.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ContractItem:
    id: str
    """``C1`` .. ``C6``."""
    name: str
    statement: str
    """One sentence, in the vocabulary of vLLM's config and of the method table."""
    kind: str
    """``safety`` (broken: a wrong or unsafe step) or ``efficiency`` (broken: capacity
    left unused, never a crash)."""
    source: str = ""
    """Where in vLLM the item comes from (its assertion, comment or code path), for the
    items about the scheduler's books; the budget items come from the buffer model."""
    policy: str = ""
    """For an item about the scheduler's books: what of it a budget policy decides (the
    policy decides only how many tokens each request gets and what that costs), or why
    nothing."""
    proven_by: tuple[str, ...] = ()
    """The checks of the proofs (C1-C6's, for every profile and layout) that prove the
    policy's part of a book item; empty where the policy decides none of it."""


CONTRACT: tuple[ContractItem, ...] = (
    ContractItem(
        "C1",
        "nonnegative",
        "every budget the policy keeps is >= 0 after every decision.",
        "safety",
    ),
    ContractItem(
        "C2",
        "conservation",
        "each budget equals its opening value minus what the requests scheduled in the step"
        " were charged, and a preempted request's refund is exactly its charge, given once.",
        "safety",
    ),
    ContractItem(
        "C3",
        "buffer peak",
        "the target rows T and the true draft rows D = sum C(q_i) satisfy T <= S <= B and"
        " D <= B, so the step's buffer peak max(T, D) fits max_num_batched_tokens B.",
        "safety",
    ),
    ContractItem(
        "C4",
        "progress",
        "a config the policy accepts can always schedule at least one token of a runnable"
        " request in an empty step (no budget deadlock).",
        "safety",
    ),
    ContractItem(
        "C5",
        "tightness",
        "a request is granted fewer tokens than it needs only when one more token would break"
        " C3 or another hard limit (max_num_seqs, max_num_scheduled_tokens).",
        "efficiency",
    ),
    ContractItem(
        "C6",
        "dominance",
        "on the same queue in the same order, a policy that relaxes another schedules at"
        " least as many tokens and at least as many requests.",
        "efficiency",
    ),
)
CONTRACT_IDS: tuple[str, ...] = tuple(item.id for item in CONTRACT)

BOOKS: tuple[ContractItem, ...] = (
    ContractItem(
        "C7",
        "placeholders",
        "no request's output placeholders or stale output tokens are ever negative; under"
        " async scheduling a request whose step reaches the end of its known tokens (not a"
        " prefill chunk) gains exactly one placeholder for the token it samples plus one per"
        " draft scheduled with it, a request not scheduled keeps its own (none once"
        " preempted), and without async scheduling no request holds any.",
        "safety",
        "vLLM's AsyncScheduler._update_after_schedule (the placeholders it adds), the"
        " assertion num_stale_output_tokens >= 0 in update_from_output (0.34).",
        "none: the placeholders count the tokens scheduled, whatever number the policy grants.",
    ),
    ContractItem(
        "C8",
        "drafts within rows",
        "the draft tokens scheduled with a request are at most num_speculative_tokens and"
        " fewer than the tokens scheduled for it: every draft verified has a row of its own"
        " after the row of its last verified token.",
        "safety",
        "vLLM's schedule(), which trims spec_token_ids to the scheduled tokens; the model"
        " runner reads the drafts as the last rows of the request's scheduled tokens.",
        "the grant: the drafts are trimmed to the tokens granted less one, so a grant of at"
        " least 1 and at most the need keeps the item; and the drafter's rows for what was"
        " granted, C(q), are the rows C3 bounds.",
        ("C3", "C4-no-stall"),
    ),
    ContractItem(
        "C9",
        "slots ahead",
        "every scheduled request holds KV slots, in every KV group, for all its computed"
        " tokens after the step, plus the drafting lookahead (num_lookahead_tokens) where"
        " the step reaches the end of its known tokens (it samples, and the drafter drafts"
        " past them), capped at max_model_len.",
        "safety",
        "vLLM's KVCacheManager.allocate_slots (num_lookahead_tokens, the max_model_len cap)"
        " and the scheduler's comment that the drafter writes those slots; releases up to"
        " 0.22 reserve none for a request's first prefill chunk, which drafts nothing.",
        "none: the KV manager reserves the slots after the grant, for whatever was granted;"
        " num_lookahead_tokens is the release's column, not the policy's.",
    ),
    ContractItem(
        "C10",
        "length cap",
        "no scheduled position passes max_model_len (a request's computed tokens after the"
        " step are at most max_model_len), and a step that verifies drafts leaves room"
        " within max_model_len for the token it samples.",
        "safety",
        "vLLM's schedule(), which caps num_new_tokens at max_model_len less the computed"
        " tokens and the sampled token, 'necessary when using spec decoding'.",
        "the grant: the cap is applied to the need before the policy is asked, so a grant"
        " of at most the need keeps it.",
        ("C4-no-stall",),
    ),
    ContractItem(
        "C11",
        "preemption",
        "a request preempted in a step is not scheduled in it and leaves it with no KV"
        " blocks in its table, no computed tokens, no drafts and no output placeholders,"
        " back in the waiting queue.",
        "safety",
        "vLLM's Scheduler._preempt_request (blocks freed, num_computed_tokens = 0,"
        " spec_token_ids and placeholders cleared, the request prepended to waiting).",
        "the refund: a victim scheduled earlier in the step gives back exactly its charge,"
        " once, and a refund can happen.",
        ("C2", "C2-reach-refund"),
    ),
    ContractItem(
        "C12",
        "engine calls",
        "the engine's calls between steps lose no accepted token: a prefix-cache reset that"
        " resets the running requests leaves each of them waiting with all its tokens, no"
        " KV blocks, computed tokens, drafts or output placeholders, and its output still"
        " in flight counted stale (to be dropped, not delivered); every other request, and"
        " every request at a pause or a resume, is left exactly as it was.",
        "safety",
        "vLLM's Scheduler.reset_prefix_cache (running requests preempted with"
        " drop_stale_output, the comment that a same-step resume would otherwise deliver"
        " tokens out of order) and set_pause_state, which only sets the state the next"
        " schedule() reads.",
        "none: the calls come between steps, when no step's budget is open.",
    ),
    ContractItem(
        "C13",
        "blocks held",
        "every KV block a request's table holds (in any KV group; the null block aside)"
        " counts that table in its reference count, so it is neither free nor handed to"
        " another request by an allocation, and a block two tables hold is a cached block"
        " they share (it has a hash).",
        "safety",
        "vLLM's BlockPool: a reference count of 0 means the block is in the free queue"
        " (touch), an allocation takes only such blocks and asserts it (get_new_blocks),"
        " free_blocks returns a block to the queue when its count reaches 0; and the KV"
        " managers' req_to_blocks, the tables.",
        "none: the KV managers allocate, share and free blocks after the grant, whatever"
        " was granted.",
    ),
)
"""The contract's second family: the scheduler's books beside the budgets, judged by the
monitor on every live step (C7-C11, C13) and every engine call between steps (C12) of any vLLM
(``integration.books``) from vLLM's own state, never by agreement with the reference.
Their predicates are ``spec.books``."""
BOOKS_IDS: tuple[str, ...] = tuple(item.id for item in BOOKS)


def contract_item(contract_id: str) -> ContractItem:
    for item in CONTRACT + BOOKS:
        if item.id == contract_id:
            return item
    raise KeyError(
        f"unknown contract item {contract_id!r} (known: {', '.join(CONTRACT_IDS + BOOKS_IDS)})"
    )


def contract_markdown() -> str:
    """The contract as a Markdown list, one item a line: the text every document shows."""
    return "".join(f"- **{item.id} {item.name}**: {item.statement}\n" for item in CONTRACT)


def books_markdown() -> str:
    """The scheduler's books as a Markdown list, each item with where in vLLM it comes
    from."""
    return "".join(
        f"- **{item.id} {item.name}**: {item.statement} *From:* {item.source}\n" for item in BOOKS
    )
