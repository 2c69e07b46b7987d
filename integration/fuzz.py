"""Stateful differential fuzzing of the live vLLM scheduler against the reference.

A Hypothesis ``RuleBasedStateMachine`` draws a config (method, K, budgets, chunked
prefill, long-prefill threshold, a KV pool small enough to force preemption, FCFS or
priority), then interleaves rules that add requests, abort them and run engine steps
with drawn acceptance and draft proposals. After every step the invariants hold or the
run stops: the live decision equals the reference's (``Lockstep``), and the reference's
C1-C3 hold (a break is a *finding*; see ``KNOWN_FINDINGS``).

The examples are shared out, not drawn from one pool: every method (layout) gets its own
share, and each share is split over *aims* (``AIMS``): ``mixed`` draws configs over the
whole space, the others draw configs and requests aimed at one coverage event that a
uniform draw reaches rarely (a bound input budget, a preemption of a request already
scheduled in the step, a padded decode). Each (layout, aim) unit is one Hypothesis run
with its own seed derived from ``--seed``, so a fixed seed gives the same examples,
whatever the other units did. Aims only choose *where* to look: every example is checked
by the same machine with the same invariants.

Coverage is counted per method (``lockstep.COVERAGE_EVENTS``) so that a run that never
reached an event says so; ``FuzzResult.zero_coverage`` lists the (method, event) pairs
of ``REQUIRED_EVENTS`` still at zero.
"""

from __future__ import annotations

import contextlib
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dualbudget.reference.kv import cdiv
from dualbudget.spec.config import EngineConfig, SpeculativeConfig
from dualbudget.spec.methods import LAYOUT_NAMES, layout_named
from dualbudget.spec.policies import StepParams
from dualbudget.spec.profiles import profile_named

from .lockstep import (
    COVERAGE_EVENTS,
    ConfigRefused,
    Divergence,
    DivergenceFound,
    Lockstep,
    MirroredCrash,
)

# (profile, layout, contract) breaks that are vLLM's own behaviour, mirrored faithfully:
# vLLM 0.32 reserves K-1 slots for DSpark whatever its layout, but the fill-in layout
# reads K+1 draft rows per request (DESIGN.md section 1), so the draft forward can
# overflow the buffer (C3). A finding of the project, pinned by the reference's tests.
KNOWN_FINDINGS = {("vllm-0.32", "dspark-fill-in", "C3")}

# The layouts vLLM builds from config-only folders (mtp needs an MTP target checkpoint
# config and suffix needs arctic-inference: see docs/vllm-environments.md).
FUZZ_LAYOUTS: dict[str, tuple[str, bool, str | None]] = {
    "ngram": ("ngram", False, None),
    "eagle": ("eagle3", False, None),
    "p-eagle": ("eagle3", True, None),
    "draft-model": ("draft_model", False, None),
    "pard": ("draft_model", True, None),
    "dflash": ("dflash", True, None),
    "dspark-anchor": ("dspark", True, "anchor"),
    "dspark-fill-in": ("dspark", True, "fill-in"),
}
assert set(FUZZ_LAYOUTS) == set(LAYOUT_NAMES)

# The coverage gate: which events must be reached, per layout. Every event is required
# for every layout fuzzed, under both releases; why each is reachable:
# - input_budget_bound: with slots > 0 (0.32: p-eagle K>=2, draft-model, pard, dflash,
#   dspark K>=2; 0.33: the same but dflash/dspark reserve 0) any grant past
#   ``B - sum(q + slots) - slots`` is cut by the input budget. With 0 slots (ngram, eagle;
#   dflash and dspark in 0.33; p-eagle and dspark at K=1) vLLM charges the input budget
#   exactly what it charges the token budget, so it can only bind when the token budget
#   starts above it: ``max_num_scheduled_tokens > max_num_batched_tokens``, which vLLM's
#   ``SchedulerConfig`` accepts (it checks only ``>= 1``). The ``budget`` aim draws that.
# - preempt_scheduled: only under priority scheduling (FCFS's victim is the last running
#   request, never one scheduled before the requester); the ``preempt`` aim draws
#   priority, a tight KV pool and outranking late arrivals.
# - padded_decode: every fuzzed layout has K >= 1, and vLLM pads a new one-token request
#   joining decodes (``pad_spec_decode``) for every method (no ``dynamic_sd_lookup`` here).
# A layout/event pair proven unreachable would be left out here, with its reason.
REQUIRED_EVENTS: dict[str, tuple[str, ...]] = {layout: COVERAGE_EVENTS for layout in FUZZ_LAYOUTS}

# What each share of examples aims at, and its weight in a layout's share (the rest of
# the share, after each aimed unit got its weight's part, goes to ``mixed``).
AIMS: dict[str, int] = {"mixed": 2, "budget": 1, "preempt": 3, "padded": 1}


def unit_seed(seed: int, layout: str, aim: str) -> int:
    """The Hypothesis seed of one (layout, aim) unit: stable across processes."""
    return zlib.crc32(f"{seed}/{layout}/{aim}".encode())


def shares(examples: int, layouts: list[str]) -> list[tuple[str, str, int]]:
    """``examples`` split into (layout, aim, n), n > 0: layouts evenly (the first ones take
    the remainder); a layout's part over ``AIMS`` by weight, each aim at least one and
    ``mixed`` the rest, or, for a part smaller than ``len(AIMS)``, one each in ``AIMS``
    order."""
    units: list[tuple[str, str, int]] = []
    base, extra = divmod(examples, len(layouts))
    total_weight = sum(AIMS.values())
    for i, layout in enumerate(layouts):
        share = base + (i < extra)
        parts = dict.fromkeys(AIMS, 0)
        if share < len(AIMS):
            for aim in list(AIMS)[:share]:
                parts[aim] = 1
        else:
            for aim, weight in AIMS.items():
                if aim != "mixed":
                    parts[aim] = max(1, share * weight // total_weight)
            parts["mixed"] = share - sum(parts.values())
        units += [(layout, aim, n) for aim, n in parts.items() if n > 0]
    return units


@dataclass
class Finding:
    profile: str
    layout: str
    contract: str
    step: int
    message: str
    scenario_path: str
    known: bool

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class FuzzResult:
    profile: str
    vllm_version: str
    examples: int = 0
    steps: int = 0
    refused_configs: int = 0
    mirrored_crashes: int = 0
    divergences: list[Divergence] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    coverage: dict[str, dict[str, int]] = field(default_factory=dict)
    constructions: dict[str, set[str]] = field(default_factory=dict)
    examples_by_layout: dict[str, int] = field(default_factory=dict)
    examples_by_unit: dict[str, int] = field(default_factory=dict)
    stopped_by_time: bool = False
    seconds: float = 0.0
    """Seconds of the fuzz, after ``warm_up_seconds`` of vLLM's one-off costs."""
    warm_up_seconds: float = 0.0

    def totals(self) -> dict[str, int]:
        return {
            event: sum(per.get(event, 0) for per in self.coverage.values())
            for event in COVERAGE_EVENTS
        }

    def zero_coverage(self, layouts: list[str] | None = None) -> list[str]:
        zeros = []
        for layout in layouts or list(FUZZ_LAYOUTS):
            per = self.coverage.get(layout, {})
            required = REQUIRED_EVENTS.get(layout, COVERAGE_EVENTS)
            zeros += [f"{layout}:{e}" for e in required if per.get(e, 0) == 0]
        return zeros

    @property
    def unknown_findings(self) -> list[Finding]:
        return [f for f in self.findings if not f.known]


class _TimeUp(Exception):
    """Raised by a unit's first rule once its time is spent: ends that Hypothesis run."""


class _Session:
    def __init__(
        self,
        profile: str,
        result: FuzzResult,
        seed: int,
        out_dir: Path,
        progress: Callable[[str], None] | None,
    ) -> None:
        self.profile = profile
        self.result = result
        self.seed = seed
        self.out_dir = out_dir
        self.progress = progress
        self.deadline: float | None = None
        """The running unit's deadline."""
        self.unit_examples = 0
        """Examples the running unit started."""
        self.counter = 0
        self.seen_findings: set[tuple[str, str, str]] = set()

    def out_of_time(self) -> bool:
        return self.deadline is not None and time.monotonic() > self.deadline

    @property
    def stopped(self) -> bool:
        return bool(self.result.divergences or self.result.unknown_findings)


def _reserve(profile: str, layout: str, k: int) -> tuple[int, int]:
    """(slots the profile's policy charges per request, num_lookahead_tokens) at K.

    The lookahead is at least the slots in every row of both tables, and both releases
    accept ``max_num_batched_tokens > num_lookahead_tokens``: aimed configs stay above it
    so that they are never refused (``mixed`` still draws refused ones)."""
    row = layout_named(layout)
    policy = profile_named(profile).policy
    p = StepParams(1, 1, 1, k, row)
    return int(policy.draft_slots(p)), int(policy.num_lookahead_tokens(p))


def _config_strategy(st: Any, layout: str, aim: str, profile: str) -> Any:
    method, parallel, dspark_layout = FUZZ_LAYOUTS[layout]

    @st.composite
    def mixed(draw: Any) -> EngineConfig:
        k = draw(st.integers(1, 5))
        block_size = draw(st.sampled_from([2, 4, 8, 16]))
        max_model_len = draw(st.sampled_from([24, 32, 48, 64, 96]))
        need = cdiv(max_model_len, block_size) + 1
        # Small pools force preemption; the null block and one full request always fit.
        num_gpu_blocks = draw(st.one_of(st.integers(need, need + 4), st.integers(need, need * 3)))
        chunked = draw(st.booleans() | st.just(True))
        low = 4 if chunked else max_model_len
        max_num_batched_tokens = draw(
            st.one_of(st.integers(low, max(low, 24)), st.integers(low, max(low, 64)))
        )
        max_num_seqs = draw(st.integers(1, min(8, max_num_batched_tokens)))
        # Mostly vLLM's default (None); sometimes below B, sometimes above it (legal in
        # vLLM, and the only way the input budget binds for methods reserving no slots).
        cap = draw(
            st.one_of(
                st.none(),
                st.integers(1, max_num_batched_tokens),
                st.integers(max_num_batched_tokens + 1, max_num_batched_tokens * 2 + 8),
            )
        )
        threshold = draw(st.one_of(st.just(0), st.just(0), st.integers(1, max_model_len)))
        policy = draw(st.sampled_from(["fcfs", "priority"]))
        return EngineConfig(
            max_num_batched_tokens=max_num_batched_tokens,
            max_num_seqs=max_num_seqs,
            max_model_len=max_model_len,
            block_size=block_size,
            num_gpu_blocks=num_gpu_blocks,
            enable_chunked_prefill=chunked,
            long_prefill_token_threshold=threshold,
            scheduling_policy=policy,
            max_num_scheduled_tokens=cap,
            speculative_config=SpeculativeConfig(method, k, parallel, dspark_layout),
        )

    @st.composite
    def budget(draw: Any) -> EngineConfig:
        """Prompts long against a small buffer, chunked: grants meet the input budget.
        A KV pool of three full requests keeps preemption out of the way."""
        k = draw(st.integers(1, 5))
        slots, lookahead = _reserve(profile, layout, k)
        block_size = draw(st.sampled_from([4, 8, 16]))
        max_model_len = draw(st.sampled_from([48, 64, 96]))
        need = cdiv(max_model_len, block_size) + 1
        low = max(4, lookahead + 2)
        b = draw(st.integers(low, max(low, 24)))
        above = st.integers(b + 1, b * 2 + 8)
        # With 0 slots only a token budget above B lets the input budget bind.
        cap = draw(above if slots == 0 else st.one_of(st.none(), above))
        return EngineConfig(
            max_num_batched_tokens=b,
            max_num_seqs=draw(st.integers(1, min(8, b))),
            max_model_len=max_model_len,
            block_size=block_size,
            num_gpu_blocks=draw(st.integers(need * 3, need * 4)),
            enable_chunked_prefill=True,
            long_prefill_token_threshold=0,
            scheduling_policy=draw(st.sampled_from(["fcfs", "priority"])),
            max_num_scheduled_tokens=cap,
            speculative_config=SpeculativeConfig(method, k, parallel, dspark_layout),
        )

    @st.composite
    def preempt(draw: Any) -> EngineConfig:
        """Priority scheduling, a pool of one to 1.5 full requests, a buffer that fits
        every running request: a running request that outranks one scheduled before it
        and needs a block preempts that one (its charge is refunded)."""
        k = draw(st.integers(1, 5))
        _, lookahead = _reserve(profile, layout, k)
        block_size = draw(st.sampled_from([2, 4]))
        max_model_len = draw(st.sampled_from([32, 48, 64]))
        need = cdiv(max_model_len, block_size) + 1
        low = max(16, lookahead + 2)
        b = draw(st.integers(low, max(low, 64)))
        return EngineConfig(
            max_num_batched_tokens=b,
            max_num_seqs=draw(st.integers(2, min(8, b))),
            max_model_len=max_model_len,
            block_size=block_size,
            num_gpu_blocks=draw(st.integers(need, need + need // 2)),
            enable_chunked_prefill=True,
            long_prefill_token_threshold=0,
            scheduling_policy="priority",
            max_num_scheduled_tokens=None,
            speculative_config=SpeculativeConfig(method, k, parallel, dspark_layout),
        )

    @st.composite
    def padded(draw: Any) -> EngineConfig:
        """Room for a decode batch at width 1 + K and an ample pool: one-token prompts
        arriving while the others decode join padded."""
        k = draw(st.integers(1, 5))
        _, lookahead = _reserve(profile, layout, k)
        block_size = draw(st.sampled_from([4, 8, 16]))
        max_model_len = draw(st.sampled_from([48, 64, 96]))
        need = cdiv(max_model_len, block_size) + 1
        seqs = draw(st.integers(2, 8))
        # Each request costs at most 1 + K + slots <= 2K + 2 of the input budget.
        low = max(seqs * (2 * k + 2) + 1, lookahead + 2, 16)
        b = draw(st.integers(low, low + 16))
        return EngineConfig(
            max_num_batched_tokens=b,
            max_num_seqs=seqs,
            max_model_len=max_model_len,
            block_size=block_size,
            num_gpu_blocks=draw(st.integers(need * 3, need * 6)),
            enable_chunked_prefill=True,
            long_prefill_token_threshold=0,
            scheduling_policy="fcfs",
            max_num_scheduled_tokens=None,
            speculative_config=SpeculativeConfig(method, k, parallel, dspark_layout),
        )

    strategies = {"mixed": mixed, "budget": budget, "preempt": preempt, "padded": padded}
    return strategies[aim]()


def make_machine(session: _Session, layout: str, aim: str) -> type:
    import hypothesis.strategies as st
    from hypothesis import assume, reject
    from hypothesis.stateful import (
        RuleBasedStateMachine,
        initialize,
        invariant,
        precondition,
        rule,
    )

    max_requests = 14
    unit = f"{layout}/{aim}"

    class LockstepMachine(RuleBasedStateMachine):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.lock: Lockstep | None = None

        @initialize(config=_config_strategy(st, layout, aim, session.profile), data=st.data())
        def start(self, config: EngineConfig, data: Any) -> None:
            if session.stopped:
                reject()  # the first divergence stopped the run; void the rest
            if session.out_of_time() and session.unit_examples > 0:
                # A unit always gets its first example: vLLM's one-off costs (its import,
                # the first build of each draft architecture) must not starve a unit.
                session.result.stopped_by_time = True
                raise _TimeUp
            session.counter += 1
            session.unit_examples += 1
            try:
                self.lock = Lockstep(
                    config,
                    session.profile,
                    seed=session.seed,
                    out_dir=session.out_dir,
                    label=f"{session.profile}-{layout}-{aim}-ex{session.counter}",
                )
            except ConfigRefused:
                session.result.refused_configs += 1
                assume(False)
            except DivergenceFound as found:
                session.result.divergences.append(found.divergence)
                raise
            assert self.lock is not None
            result = session.result
            result.examples += 1
            result.examples_by_layout[layout] = result.examples_by_layout.get(layout, 0) + 1
            result.examples_by_unit[unit] = result.examples_by_unit.get(unit, 0) + 1
            result.constructions.setdefault(layout, set()).add(self.lock.construction.how)
            # The preempt aim starts with a crowd, so that the pool fills early.
            low = 3 if aim == "preempt" else 1
            for _ in range(data.draw(st.integers(low, 6), label="initial requests")):
                self._add(data)
            # Steps right away: Hypothesis opens every run with its simplest example (one
            # rule, no step), and each (layout, aim) unit is a run of its own.
            self._run_steps(data, data.draw(st.integers(1, 12), label="first steps"))

        def _add(self, data: Any) -> None:
            assert self.lock is not None
            limit = self.lock.config.max_model_len
            late = self.lock.step > 0
            if aim == "budget":
                # Prompts long against the buffer: their chunks meet the input budget.
                prompt_strategy = st.one_of(
                    st.integers(limit // 2, limit - 1), st.integers(1, limit - 1)
                )
            elif aim == "padded":
                # Short prompts decode soon; one-token late arrivals join them padded.
                prompt_strategy = (
                    st.one_of(st.just(1), st.just(1), st.integers(1, 4))
                    if late
                    else st.integers(1, 8)
                )
            elif aim == "preempt":
                prompt_strategy = st.integers(1, min(12, limit - 1))
            else:
                # One-token prompts join a decode batch padded to 1 + K; long ones get chunked.
                prompt_strategy = st.one_of(
                    st.just(1), st.integers(1, min(8, limit - 1)), st.integers(1, limit - 1)
                )
            prompt = data.draw(prompt_strategy, label="prompt_len")
            if aim in ("preempt", "padded"):
                # Long outputs keep the batch decoding and growing into the pool.
                output_strategy = st.one_of(st.just(limit), st.integers(limit // 2, limit))
            else:
                # Long outputs run into max_model_len.
                output_strategy = st.one_of(
                    st.integers(1, 12), st.integers(1, limit), st.just(limit)
                )
            output = data.draw(output_strategy, label="max_tokens")
            priority = 0
            if self.lock.config.scheduling_policy == "priority":
                # Later arrivals may outrank running requests (0 is the highest priority),
                # so that a victim can be one already scheduled in the step.
                low = 0 if late else 2
                priority_strategy = st.integers(low, 3)
                if aim == "preempt" and late:
                    # Mostly outranking: a late request admitted behind worse ones is
                    # what makes a victim out of a request scheduled before it.
                    priority_strategy = st.sampled_from([0, 0, 1, 2, 3])
                priority = data.draw(priority_strategy, label="priority")
            self.lock.add(prompt, output, priority)

        @precondition(lambda self: self.lock is not None and len(self.lock.requests) < max_requests)
        @rule(data=st.data())
        def add_request(self, data: Any) -> None:
            self._add(data)

        @precondition(
            lambda self: self.lock is not None
            and self.lock.config.scheduling_policy == "priority"
            and self.lock.step > 0
            and len(self.lock.requests) < max_requests
        )
        @rule(prompt=st.integers(1, 8), output=st.integers(4, 32))
        def add_urgent(self, prompt: int, output: int) -> None:
            """A late request that outranks the running ones: under KV pressure the
            victim is then a running request already scheduled in the step."""
            assert self.lock is not None
            self.lock.add(prompt, output, 0)

        @precondition(lambda self: self.lock is not None and bool(self.lock.unfinished()))
        @rule(data=st.data())
        def abort_request(self, data: Any) -> None:
            assert self.lock is not None
            # One rule pick in four aborts: the rules are picked uniformly, and aborting
            # as often as adding would leave few requests to schedule.
            if data.draw(st.integers(0, 3), label="abort?") == 0:
                rid = data.draw(st.sampled_from(self.lock.unfinished()), label="abort")
                self.lock.abort(rid)

        @precondition(lambda self: self.lock is not None)
        @rule(data=st.data(), steps=st.integers(1, 12))
        def run_steps(self, data: Any, steps: int) -> None:
            self._run_steps(data, steps)

        def _run_steps(self, data: Any, steps: int) -> None:
            assert self.lock is not None
            lock = self.lock
            k = lock.k
            accept_mode = data.draw(st.sampled_from(["draw", "all", "none"]), label="acceptance")

            def accept(rid: str, drafts: int) -> int:
                if accept_mode == "all":
                    return drafts
                if accept_mode == "none":
                    return 0
                return int(data.draw(st.integers(0, drafts), label=f"accept {rid}"))

            def propose(rid: str) -> int:
                return int(data.draw(st.sampled_from([k, k, k, 0, 1, max(k - 1, 0)])))

            for _ in range(steps):
                # Preempt aim: urgent arrivals between steps too, not only between rule
                # picks; each is a chance of a victim already scheduled in its step.
                if (
                    aim == "preempt"
                    and len(lock.requests) < max_requests
                    and data.draw(st.integers(0, 5), label="urgent arrival?") == 0
                ):
                    lock.add(
                        data.draw(st.integers(1, 8), label="urgent prompt_len"),
                        data.draw(st.integers(4, 32), label="urgent max_tokens"),
                        0,
                    )
                before = dict(lock.coverage)
                try:
                    lock.run_step(accept, propose)
                except DivergenceFound as found:
                    session.result.divergences.append(found.divergence)
                    raise
                except MirroredCrash:
                    session.result.mirrored_crashes += 1
                    self.lock = None
                    return
                session.result.steps += 1
                per = session.result.coverage.setdefault(
                    lock.layout, dict.fromkeys(COVERAGE_EVENTS, 0)
                )
                for event, count in lock.coverage.items():
                    per[event] += count - before[event]

        @rule()
        def idle(self) -> None:
            """Keeps the machine valid after a mirrored crash ended its lockstep run."""

        @invariant()
        def contract_holds(self) -> None:
            lock = self.lock
            if lock is None or not lock.violations:
                return
            for violation in lock.violations:
                key = (session.profile, lock.layout, violation.contract)
                if key in session.seen_findings:
                    continue
                session.seen_findings.add(key)
                path = lock.write_scenario(violation.step)
                finding = Finding(
                    session.profile,
                    lock.layout,
                    violation.contract,
                    violation.step,
                    violation.message,
                    str(path),
                    key in KNOWN_FINDINGS,
                )
                session.result.findings.append(finding)
                if session.progress:
                    tag = "known finding" if finding.known else "FINDING"
                    session.progress(
                        f"{tag}: {violation.contract} under {session.profile} with"
                        f" {lock.layout} at step {violation.step}: {violation.message}"
                        f" (scenario {path})"
                    )
            lock.violations.clear()
            lock.reference.violations.clear()
            unknown = [f for f in session.result.findings if not f.known]
            assert not unknown, f"contract broken: {unknown[0].to_json()}"

    LockstepMachine.__name__ = LockstepMachine.__qualname__ = f"Lockstep_{layout}_{aim}".replace(
        "-", "_"
    )
    return LockstepMachine


def _run_unit(
    session: _Session, layout: str, aim: str, examples: int, stateful_step_count: int
) -> None:
    """One Hypothesis run of ``examples`` examples for one (layout, aim)."""
    import hypothesis
    from hypothesis import HealthCheck, Phase, Verbosity, settings
    from hypothesis.errors import Unsatisfiable
    from hypothesis.stateful import run_state_machine_as_test

    machine = hypothesis.seed(unit_seed(session.seed, layout, aim))(
        make_machine(session, layout, aim)
    )
    unit_settings = settings(
        max_examples=examples,
        stateful_step_count=stateful_step_count,
        deadline=None,
        database=None,
        derandomize=False,
        # The first divergence stops the run: no shrinking, no replay of old failures.
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
        print_blob=False,
        # Divergences and findings are reported by this module, with their scenario files;
        # Hypothesis' own print of the failing rule sequence would only repeat them.
        verbosity=Verbosity.quiet,
    )
    try:
        run_state_machine_as_test(machine, settings=unit_settings)
    except (DivergenceFound, _TimeUp, Unsatisfiable):
        pass
    except AssertionError:
        if not session.result.unknown_findings:
            raise
    except Exception:
        # Hypothesis re-runs a failing example to report it; the re-run stops early (the
        # run is over) and Hypothesis calls that flaky. Keep what was found.
        if not (session.stopped or session.result.stopped_by_time):
            raise


def warm_up(layouts: list[str]) -> float:
    """Pay vLLM's one-off costs before the clock of the fuzz starts: its import and the
    first build of each method (vLLM inspects every model architecture once per process,
    seconds each). Returns the seconds spent. A build vLLM refuses is left to the fuzz."""
    from .live import LiveScheduler, Unsupported

    start = time.monotonic()
    for layout in layouts:
        method, parallel, dspark_layout = FUZZ_LAYOUTS[layout]
        config = EngineConfig(
            max_num_batched_tokens=32,
            max_num_seqs=4,
            max_model_len=64,
            block_size=16,
            num_gpu_blocks=16,
            speculative_config=SpeculativeConfig(method, 2, parallel, dspark_layout),
        )
        with contextlib.suppress(Unsupported):
            LiveScheduler(config)
    return time.monotonic() - start


def run_fuzz(
    *,
    profile: str,
    vllm_version: str,
    examples: int,
    seed: int,
    out_dir: str | Path,
    max_seconds: float | None = None,
    layouts: list[str] | None = None,
    progress: Callable[[str], None] | None = None,
    stateful_step_count: int = 80,
) -> FuzzResult:
    """``examples`` shared out over ``layouts`` and ``AIMS`` (``shares``), one Hypothesis
    run per unit, in a fixed order. With ``max_seconds``, unit ``i`` of ``n`` starts no
    example after ``start + max_seconds * (i + 1) / n`` but its first (the time a unit
    leaves unused passes to the next), so every unit gets a turn whatever the count of
    examples asked; a run cut by time is no longer reproducible by its seed alone, and
    says so (``stopped_by_time``)."""
    result = FuzzResult(profile=profile, vllm_version=vllm_version)
    layouts = list(layouts or FUZZ_LAYOUTS)
    result.warm_up_seconds = warm_up(layouts)
    if progress:
        progress(
            f"  vLLM warm-up (import, one build per method): {result.warm_up_seconds:.1f}s,"
            " not counted in the time of the fuzz"
        )
    start = time.monotonic()
    session = _Session(profile, result, seed, Path(out_dir), progress)
    units = shares(examples, layouts)
    for index, (layout, aim, count) in enumerate(units):
        if session.stopped:
            break
        if max_seconds:
            session.deadline = start + max_seconds * (index + 1) / len(units)
        session.unit_examples = 0
        steps_before = result.steps
        unit_start = time.monotonic()
        _run_unit(session, layout, aim, count, stateful_step_count)
        if progress:
            progress(
                f"  {layout + '/' + aim:<24} {result.examples_by_unit.get(f'{layout}/{aim}', 0):>4}"
                f" examples {result.steps - steps_before:>6} steps"
                f" {time.monotonic() - unit_start:>6.1f}s"
                f"  (total {result.examples} examples, {result.steps} steps,"
                f" {len(result.divergences)} divergences, {time.monotonic() - start:.0f}s)"
            )
    result.seconds = time.monotonic() - start
    return result
