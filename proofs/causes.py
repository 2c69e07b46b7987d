"""A known finding's cause: the condition on a run's config under which it breaks.

A finding of the manifest is known on a profile and layout; a live break of the same
contract item there is the finding only when the config meets its cause. Two findings on
one key can have different causes (vLLM 0.33's ngram-parallel C4: the budget deadlock of
``B <= K-1``, and the padding stall of ``max_num_scheduled_tokens < 1 + K``, which the
spec does not model), so a break is labelled with the finding whose condition its config
meets, and a break meeting none is new.

A condition is written in the manifest as comparisons of sums of the config's integer
settings and integer literals, joined by ``and``, alternatives joined by ``or`` (``and``
binds tighter): ``max_num_batched_tokens <= num_speculative_tokens - 1``. Names are those
of ``SETTINGS``, vLLM's names, read off the config under the finding's profile (whose
release gives ``max_num_new_slots_for_drafting``); nothing is evaluated as Python.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from dualbudget.spec.config import EngineConfig
from dualbudget.spec.errors import BadInput
from dualbudget.spec.profiles import profile_named


def _drafting_slots(profile: str, config: EngineConfig) -> int:
    """vLLM's ``max_num_new_slots_for_drafting`` in ``profile``'s release (0 without
    speculative decoding)."""
    if config.layout is None:
        return 0
    release = profile_named(profile).release
    return int(release.draft_slots(config.layout, config.num_speculative_tokens))


SETTINGS: Mapping[str, Callable[[str, EngineConfig], int]] = {
    "max_num_batched_tokens": lambda _, c: c.max_num_batched_tokens,
    # vLLM's default applied: max_num_batched_tokens when unset.
    "max_num_scheduled_tokens": lambda _, c: c.scheduled_tokens_cap,
    "max_num_seqs": lambda _, c: c.max_num_seqs,
    "max_model_len": lambda _, c: c.max_model_len,
    "block_size": lambda _, c: c.block_size,
    "num_gpu_blocks": lambda _, c: c.num_gpu_blocks,
    "long_prefill_token_threshold": lambda _, c: c.long_prefill_token_threshold,
    "num_speculative_tokens": lambda _, c: c.num_speculative_tokens,
    # K for multi-module MTP, 1 for another drafter on the target's hidden states, else 0.
    "num_prefill_lookahead_tokens": lambda _, c: c.num_prefill_lookahead_tokens,
    "max_num_new_slots_for_drafting": _drafting_slots,
    # A flag as 0 or 1, so that a condition can compare it like the counts.
    "enable_chunked_prefill": lambda _, c: int(c.enable_chunked_prefill),
}
"""The settings a condition may name, read off a profile's config (the fuzz's and
vLLM's)."""

_COMPARE: Mapping[str, Callable[[int, int], bool]] = {
    "<=": operator.le,
    ">=": operator.ge,
    "==": operator.eq,
    "!=": operator.ne,
    "<": operator.lt,
    ">": operator.gt,
}
_COMPARISON = re.compile(r"^(.+?)\s*(<=|>=|==|!=|<|>)\s*(.+)$")
_TERM = re.compile(r"\s*([+-])?\s*([a-z_]+|\d+)\s*")

Sum = tuple[tuple[int, str | int], ...]
"""Signed terms: (+1 or -1, a setting's name or a literal)."""


@dataclass(frozen=True)
class Comparison:
    left: Sum
    op: str
    right: Sum

    def holds(self, profile: str, config: EngineConfig) -> bool:
        left, right = _value(self.left, profile, config), _value(self.right, profile, config)
        return _COMPARE[self.op](left, right)


@dataclass(frozen=True)
class Condition:
    """Alternatives (``or``), each a conjunction (``and``) of comparisons."""

    text: str
    alternatives: tuple[tuple[Comparison, ...], ...]

    def holds(self, profile: str, config: EngineConfig) -> bool:
        """``config`` meets the condition under ``profile``."""
        return any(all(c.holds(profile, config) for c in conj) for conj in self.alternatives)


def parse_condition(text: str) -> Condition:
    """``text`` as a condition; ``BadInput`` naming what is wrong with it."""
    alternatives = []
    for alternative in text.split(" or "):
        conjunction = []
        for part in alternative.split(" and "):
            match = _COMPARISON.match(part.strip())
            if match is None:
                raise BadInput(f"condition {text!r}: {part.strip()!r} is no comparison")
            left, op, right = match.groups()
            conjunction.append(Comparison(_sum(left, text), op, _sum(right, text)))
        alternatives.append(tuple(conjunction))
    return Condition(text, tuple(alternatives))


def _sum(text: str, whole: str) -> Sum:
    terms: list[tuple[int, str | int]] = []
    pos = 0
    while pos < len(text):
        match = _TERM.match(text, pos)
        if match is None or match.end() == pos or (terms and match.group(1) is None):
            raise BadInput(f"condition {whole!r}: cannot read {text[pos:]!r}")
        sign, word = match.groups()
        if not word.isdigit() and word not in SETTINGS:
            raise BadInput(
                f"condition {whole!r}: {word!r} is no setting (known: {', '.join(SETTINGS)})"
            )
        terms.append((-1 if sign == "-" else 1, int(word) if word.isdigit() else word))
        pos = match.end()
    if not terms:
        raise BadInput(f"condition {whole!r}: an empty side")
    return tuple(terms)


def _value(terms: Sum, profile: str, config: EngineConfig) -> int:
    return sum(
        sign * (term if isinstance(term, int) else SETTINGS[term](profile, config))
        for sign, term in terms
    )


@dataclass(frozen=True)
class Cause:
    """One known finding: its manifest name, where it breaks (profile, layout, contract
    item), and the condition its config meets (None: every config there)."""

    name: str
    key: tuple[str, str, str]
    when: Condition | None = None

    def explains(self, key: tuple[str, str, str], config: EngineConfig) -> bool:
        """A break of ``key`` under ``config`` is this finding."""
        return key == self.key and (self.when is None or self.when.holds(key[0], config))
