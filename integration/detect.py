"""Which profile a vLLM scheduler follows: by its version, or by its decisions.

A release build of a known release is recognised by ``vllm.__version__``
(``spec.releases.release_of``: its record names its profile). Anything else (a
development version, or any ``--vllm-src`` tree, whose version string says nothing of
the code under review) is detected by decisions: every profile of ``spec.profiles`` runs
each scenario of ``DETECTION_SCENARIOS`` in the reference, and the live scheduler runs
the same event stream in lockstep. A profile matches when the scheduler decides as it
does on every scenario; each profile that does not is reported with the first scenario
it fails and how. The scenarios separate every pair of profiles that
``proofs.same_decisions`` does not prove equal on a layout
(tests/unit/test_detect_decisions.py), so more than one match is a class of profiles that
decide alike, reported as one. No match is a result too (``profile`` None, with the
report), never an exception: what a command does without a profile is its own choice
(``integration.commands.choose_profile``).

The probe reads nothing of vLLM but what the lockstep reads (the public scheduler API),
so any vLLM whose scheduler can be built gets a verdict; one whose scheduler cannot be
built on a scenario fails that scenario for every profile, which the report says.
``--profile`` overrides detection; lockstep then shows any mismatch as a divergence.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from dualbudget.reference.formats.scenario import Acceptance, RequestSpec, Scenario
from dualbudget.spec.config import EngineConfig, SpeculativeConfig
from dualbudget.spec.errors import BadInput
from dualbudget.spec.methods import LAYOUTS, MethodLayout
from dualbudget.spec.policies import Policy
from dualbudget.spec.profiles import PROFILE_NAMES, PROFILES
from dualbudget.spec.releases import release_of

from .live import require_vllm
from .vllm_api import AdapterFailure

DETECTION_K = 4
"""K of every detection scenario: large enough that ``K - 1``, ``K`` and ``K + 1`` slots
and the 0.33 admission cap ``B // (K + 1)`` all differ."""


@dataclass(frozen=True)
class DetectionScenario:
    """A config and a queue, run under every profile; named ``<layout>/<shape>``."""

    name: str
    config: EngineConfig
    requests: tuple[RequestSpec, ...]
    acceptance: Acceptance

    def under(self, profile: str) -> Scenario:
        return Scenario(profile, self.config, self.requests, self.acceptance)


@dataclass(frozen=True)
class Shape:
    """One queue shape, instantiated on every layout."""

    name: str
    max_num_batched_tokens: int
    max_num_seqs: int
    requests: tuple[tuple[int, int], ...]
    """(prompt_len, max_tokens) of each request, in arrival order."""
    accepted: int
    """Drafts the target accepts per step (``Acceptance.fixed``)."""
    k: int = DETECTION_K
    arrival_gap: int = 0
    """Request ``i`` arrives before step ``i * arrival_gap``."""
    outranking: bool = False
    """Priority scheduling, each arrival outranking every request before it."""
    block_size: int = 16
    num_gpu_blocks: int = 64
    max_model_len: int = 256


def _same(prompts: tuple[int, ...], max_tokens: int) -> tuple[tuple[int, int], ...]:
    return tuple((prompt, max_tokens) for prompt in prompts)


SHAPES = (
    # Prefills that overfill a small budget: separates the per-request charges (q + slots,
    # C(q), K query rows) and the config-time reserve.
    Shape("prefill-crowd", 16, 8, _same((9, 9, 9, 9, 9, 9), 6), 4),
    # Many decoding requests: the admission caps on running requests and the charges of
    # decode steps, with some drafts rejected.
    Shape("decode-crowd", 24, 8, _same((3, 3, 3, 3, 3, 3, 3, 3), 10), 1),
    # A budget a few rows above one request's charge: where the slots alone decide.
    Shape("narrow", 10, 4, _same((5, 7, 2), 8), 2),
    # A budget below the KV lookahead: which releases accept the config at all.
    Shape("below-lookahead", 3, 2, _same((2, 2), 3), 1),
    # K = 1 and a budget of one request's rows: the admission cap on running requests
    # (0.33's ``B // num_lookahead_tokens``) against the per-step charge.
    Shape("running-cap", 3, 2, ((1, 5), (4, 5), (1, 5)), 1, k=1),
    Shape("one-row", 2, 2, _same((1, 1), 3), 1, k=1),
    # A pool short of blocks under priority scheduling: a decode short of a block preempts
    # a request scheduled before it in the step, whose charge is refunded (C2), and the
    # budget then binds on the requests after it.
    Shape(
        "refund",
        29,
        6,
        ((6, 8), (2, 9), (4, 23), (3, 17), (2, 14), (1, 13), (6, 21), (1, 12)),
        2,
        arrival_gap=1,
        outranking=True,
        block_size=2,
        num_gpu_blocks=30,
        max_model_len=48,
    ),
    # The same with K = 3, where the only drafter reserving slots is a draft model's one
    # slot (0.34 builds no other): a refund short of that slot cuts a later grant of the
    # running loop by one token (step 6).
    Shape(
        "refund-one-slot",
        15,
        6,
        ((2, 20), (5, 19), (6, 19), (5, 13), (6, 11), (3, 18)),
        1,
        k=3,
        arrival_gap=1,
        outranking=True,
        block_size=2,
        num_gpu_blocks=31,
        max_model_len=48,
    ),
)


def _scenario(layout: MethodLayout, shape: Shape) -> DetectionScenario:
    config = EngineConfig(
        max_num_batched_tokens=shape.max_num_batched_tokens,
        max_num_seqs=shape.max_num_seqs,
        max_model_len=shape.max_model_len,
        block_size=shape.block_size,
        num_gpu_blocks=shape.num_gpu_blocks,
        speculative_config=SpeculativeConfig.for_layout(layout, shape.k),
        scheduling_policy="priority" if shape.outranking else "fcfs",
    )
    count = len(shape.requests)
    requests = tuple(
        RequestSpec(
            str(i),
            prompt,
            max_tokens,
            i * shape.arrival_gap,
            priority=count - i if shape.outranking else 0,
        )
        for i, (prompt, max_tokens) in enumerate(shape.requests)
    )
    return DetectionScenario(
        f"{layout.name}/{shape.name}", config, requests, Acceptance(fixed=shape.accepted)
    )


DETECTION_SCENARIOS = tuple(_scenario(layout, shape) for layout in LAYOUTS for shape in SHAPES)
"""Every shape on every layout of the method table."""


@dataclass(frozen=True)
class Failure:
    """The first scenario a profile fails, and how."""

    scenario: str
    how: str


@dataclass
class Detection:
    profile: str | None
    """The detected profile (the first of its class); None when no profile matches."""
    vllm_version: str
    how: str
    """``version`` or ``decisions``."""
    matches: tuple[str, ...] = ()
    """Every profile whose decisions the scheduler makes on every scenario: one, or a
    class of profiles that decide alike (``proofs.same_decisions``)."""
    failures: dict[str, Failure] = field(default_factory=dict)
    """Per profile that does not match, its first failing scenario."""

    def how_chosen(self) -> str:
        """How the profile was found, for a command's header: by version or decisions,
        the class it belongs to, and the rules of other profiles it runs on its base."""
        how = f"detected by {self.how}"
        if len(self.matches) > 1:
            how += f", class {', '.join(self.matches)}"
        rules = [rule_on_base(name) for name in self.matches]
        return "; ".join([how, *(rule for rule in rules if rule)])

    def report(self) -> str:
        """The verdict and, per profile, the first scenario it fails."""
        if self.how == "version":
            return f"vLLM {self.vllm_version}: profile {self.profile} (by its version)"
        named = ", ".join(_named(name) for name in self.matches)
        if self.profile is None:
            head = f"vLLM {self.vllm_version}: no profile matches its decisions"
        elif len(self.matches) > 1:
            head = (
                f"vLLM {self.vllm_version}: decides as the class {named}"
                f" (profiles that decide alike); profile {self.profile}"
            )
        else:
            head = f"vLLM {self.vllm_version}: decides as profile {named}"
        lines = [head + f" on all {len(DETECTION_SCENARIOS)} detection scenarios"]
        lines += [f"  {name}: fails {f.scenario}: {f.how}" for name, f in self.failures.items()]
        return "\n".join(lines)

    def nearest(self) -> tuple[str, Failure] | None:
        """The profile the scheduler follows longest (its first failing scenario the
        latest of ``DETECTION_SCENARIOS``; the first such profile) and that failure; None
        when a profile matches."""
        if self.profile is not None or not self.failures:
            return None
        order = {scenario.name: index for index, scenario in enumerate(DETECTION_SCENARIOS)}
        name = max(self.failures, key=lambda n: order.get(self.failures[n].scenario, -1))
        return name, self.failures[name]

    def nearest_verdict(self) -> str:
        """The verdict on a scheduler no profile matches: the nearest profile and how it
        first differs (``nearest``)."""
        nearest = self.nearest()
        if nearest is None:
            return f"FAIL: vLLM {self.vllm_version} decides as no profile"
        name, failure = nearest
        return (
            f"FAIL: vLLM {self.vllm_version} decides as no profile; nearest {name}, which it"
            f" first departs from on {failure.scenario}: {failure.how}"
        )

    def to_json(self) -> dict[str, Any]:
        nearest = self.nearest()
        return {
            "nearest": None
            if nearest is None
            else {"profile": nearest[0], "scenario": nearest[1].scenario, "how": nearest[1].how},
            "profile": self.profile,
            "vllm_version": self.vllm_version,
            "how": self.how,
            "matches": list(self.matches),
            "same_rule": {name: list(same_rule_elsewhere(name)) for name in self.matches},
            "failures": {
                name: {"scenario": f.scenario, "how": f.how} for name, f in self.failures.items()
            },
        }


def _rule(policy: type[Policy]) -> dict[str, object]:
    """A policy class's budget rule: every method (and property) it resolves, by name.
    Two classes with the same resolution are one rule under two names."""
    names = {
        name
        for cls in policy.__mro__
        if cls is not object
        for name, value in vars(cls).items()
        if not name.startswith("__") and (callable(value) or isinstance(value, property))
    }
    return {name: inspect.getattr_static(policy, name) for name in names}


def same_rule_elsewhere(profile: str) -> tuple[str, ...]:
    """The proposals run on another release whose budget rule is ``profile``'s own (per
    ``spec.profiles``: a policy class that resolves every method as ``profile``'s does):
    on ``profile``'s base, their rule decides as ``profile`` does, by construction. A
    release's own profile names its release, not a rule, so it is never one of them."""
    own = PROFILES[profile]
    rule = _rule(type(own.policy))
    return tuple(
        other.name
        for other in PROFILES.values()
        if other.vllm_version is None
        and other.release != own.release
        and _rule(type(other.policy)) == rule
    )


def rule_on_base(profile: str) -> str:
    """``"pr-53080's rule on vllm-0.33's base"`` for ``dual``: what else the detected
    profile is, named from the records; empty when it is no other profile's rule."""
    base = PROFILES[profile].release.profile_name
    return ", ".join(f"{other}'s rule on {base}'s base" for other in same_rule_elsewhere(profile))


def _named(profile: str) -> str:
    rule = rule_on_base(profile)
    return f"{profile} ({rule})" if rule else profile


def reference_decisions(scenario: DetectionScenario, profile: str) -> tuple[Any, ...]:
    """The reference's decisions under ``profile``, step by step; ``("refuses", why)``
    for a config the profile refuses. What the detection's core test compares."""
    from dualbudget.reference.runs.driver import ScenarioRun

    try:
        run = ScenarioRun(scenario.under(profile), check="collect")
        return tuple(repr(record.decision()) for record in run.records())
    except BadInput as err:
        return ("refuses", str(err))


def detect() -> Detection:
    """The profile of the vLLM this process runs: by version for a release build of a
    known release, else by decisions (always for a ``--vllm-src`` tree)."""
    from .vllm_source import active_source

    version = require_vllm()
    # A release build (major.minor.patch); a development version is probed instead.
    release = release_of(version) if re.fullmatch(r"\d+\.\d+\.\d+", version) else None
    if release is not None and active_source() is None:
        return Detection(release.profile_name, version, "version", (release.profile_name,))
    return detect_by_decisions(version)


def detect_by_decisions(version: str, profiles: tuple[str, ...] = PROFILE_NAMES) -> Detection:
    """Each of ``profiles`` against the live scheduler on every detection scenario."""
    failures: dict[str, Failure] = {}
    for scenario in DETECTION_SCENARIOS:
        left = [name for name in profiles if name not in failures]
        for name, how in _failures_on(scenario, left):
            failures[name] = Failure(scenario.name, how)
    matches = tuple(name for name in profiles if name not in failures)
    ordered = {name: failures[name] for name in profiles if name in failures}
    return Detection(matches[0] if matches else None, version, "decisions", matches, ordered)


def _failures_on(scenario: DetectionScenario, profiles: list[str]) -> Iterator[tuple[str, str]]:
    """(profile, how) for each of ``profiles`` the live scheduler disagrees with on
    ``scenario``. Profiles whose reference runs decide alike share one lockstep run."""
    groups: dict[tuple[Any, ...], list[str]] = {}
    for name in profiles:
        groups.setdefault(reference_decisions(scenario, name), []).append(name)
    for names in groups.values():
        how = _lockstep_failure(scenario.under(names[0]))
        if how is not None:
            yield from ((name, how) for name in names)


def _lockstep_failure(scenario: Scenario) -> str | None:
    """How the live scheduler departs from the reference on ``scenario``; None if never."""
    from .lockstep import ConfigRefused, run_in_lockstep

    try:
        _, divergence = run_in_lockstep(scenario)
    except ConfigRefused:
        return None
    except AdapterFailure:
        raise  # the adapter cannot drive this vLLM: no profile can be judged
    except Exception as err:  # any vLLM whose scheduler breaks here still gets a verdict
        return f"the live scheduler fails ({type(err).__name__}: {err})"
    if divergence is None:
        return None
    return (
        f"{divergence.kind} at step {divergence.step}: reference {divergence.reference},"
        f" live {divergence.live}"
    )
