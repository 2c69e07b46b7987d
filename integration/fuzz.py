"""Stateful differential fuzzing of the live vLLM scheduler against the reference.

A Hypothesis ``RuleBasedStateMachine`` draws a config (method, K, budgets, chunked
prefill, long-prefill threshold, a KV pool small enough to force preemption, FCFS or
priority), then interleaves rules that add requests, abort them and run engine steps
with drawn acceptance and draft proposals. After every step the invariants hold or the
run stops: the live decision equals the reference's (``Lockstep``), and the reference's
C1-C3 hold (a break is a *finding*; see ``KNOWN_FINDINGS``).

Coverage is counted per method (``lockstep.COVERAGE_EVENTS``) so that a run that never
reached an event says so; ``FuzzResult.zero_coverage`` lists the (method, event) pairs
still at zero.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dualbudget.reference.kv import cdiv
from dualbudget.spec.config import EngineConfig, SpeculativeConfig
from dualbudget.spec.methods import LAYOUT_NAMES

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
    stopped_by_time: bool = False
    seconds: float = 0.0

    def totals(self) -> dict[str, int]:
        return {
            event: sum(per.get(event, 0) for per in self.coverage.values())
            for event in COVERAGE_EVENTS
        }

    def zero_coverage(self, layouts: list[str] | None = None) -> list[str]:
        zeros = []
        for layout in layouts or list(FUZZ_LAYOUTS):
            per = self.coverage.get(layout, {})
            zeros += [f"{layout}:{e}" for e in COVERAGE_EVENTS if per.get(e, 0) == 0]
        return zeros

    @property
    def unknown_findings(self) -> list[Finding]:
        return [f for f in self.findings if not f.known]


class _Session:
    def __init__(
        self,
        profile: str,
        result: FuzzResult,
        seed: int,
        out_dir: Path,
        deadline: float | None,
        layouts: list[str],
        progress: Callable[[str], None] | None,
    ) -> None:
        self.profile = profile
        self.result = result
        self.seed = seed
        self.out_dir = out_dir
        self.deadline = deadline
        self.layouts = layouts
        self.progress = progress
        self.counter = 0
        self.seen_findings: set[tuple[str, str, str]] = set()

    def out_of_time(self) -> bool:
        return self.deadline is not None and time.monotonic() > self.deadline


def _config_strategy(st: Any, layouts: list[str]) -> Any:
    @st.composite
    def configs(draw: Any) -> EngineConfig:
        layout = draw(st.sampled_from(layouts))
        method, parallel, dspark_layout = FUZZ_LAYOUTS[layout]
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

    return configs()


def make_machine(session: _Session) -> type:
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

    class LockstepMachine(RuleBasedStateMachine):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.lock: Lockstep | None = None

        @initialize(config=_config_strategy(st, session.layouts), data=st.data())
        def start(self, config: EngineConfig, data: Any) -> None:
            if session.result.divergences:
                reject()  # the first divergence stopped the run; void the rest
            if session.out_of_time():
                session.result.stopped_by_time = True
                reject()
            session.counter += 1
            try:
                self.lock = Lockstep(
                    config,
                    session.profile,
                    seed=session.seed,
                    out_dir=session.out_dir,
                    label=f"{session.profile}-ex{session.counter}",
                )
            except ConfigRefused:
                session.result.refused_configs += 1
                assume(False)
            except DivergenceFound as found:
                session.result.divergences.append(found.divergence)
                raise
            assert self.lock is not None
            result = session.result
            layout = self.lock.layout
            result.examples += 1
            result.examples_by_layout[layout] = result.examples_by_layout.get(layout, 0) + 1
            result.constructions.setdefault(layout, set()).add(self.lock.construction.how)
            for _ in range(data.draw(st.integers(1, 6), label="initial requests")):
                self._add(data)

        def _add(self, data: Any) -> None:
            assert self.lock is not None
            limit = self.lock.config.max_model_len
            # One-token prompts join a decode batch padded to 1 + K; long ones get chunked.
            prompt = data.draw(
                st.one_of(st.just(1), st.integers(1, min(8, limit - 1)), st.integers(1, limit - 1)),
                label="prompt_len",
            )
            # Long outputs run into max_model_len.
            output = data.draw(
                st.one_of(st.integers(1, 12), st.integers(1, limit), st.just(limit)),
                label="max_tokens",
            )
            priority = 0
            if self.lock.config.scheduling_policy == "priority":
                # Later arrivals may outrank running requests (0 is the highest priority),
                # so that a victim can be one already scheduled in the step.
                low = 0 if self.lock.step > 0 else 2
                priority = data.draw(st.integers(low, 3), label="priority")
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

        def teardown(self) -> None:
            if session.progress and session.counter % 20 == 0 and self.lock is not None:
                r = session.result
                session.progress(
                    f"  {r.examples} examples, {r.steps} steps,"
                    f" {len(r.divergences)} divergences, {time.monotonic() - _t0[0]:.0f}s"
                )

    return LockstepMachine


_t0 = [0.0]


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
    import hypothesis
    from hypothesis import HealthCheck, Phase, settings
    from hypothesis.errors import Unsatisfiable
    from hypothesis.stateful import run_state_machine_as_test

    result = FuzzResult(profile=profile, vllm_version=vllm_version)
    _t0[0] = start = time.monotonic()
    deadline = start + max_seconds if max_seconds else None
    session = _Session(
        profile,
        result,
        seed,
        Path(out_dir),
        deadline,
        list(layouts or FUZZ_LAYOUTS),
        progress,
    )
    machine = hypothesis.seed(seed)(make_machine(session))
    fuzz_settings = settings(
        max_examples=examples,
        stateful_step_count=stateful_step_count,
        deadline=None,
        database=None,
        derandomize=False,
        # The first divergence stops the run: no shrinking, no replay of old failures.
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
        print_blob=False,
    )
    try:
        run_state_machine_as_test(machine, settings=fuzz_settings)
    except DivergenceFound:
        pass
    except Unsatisfiable:
        pass
    except AssertionError:
        if not result.unknown_findings:
            raise
    except Exception as err:  # hypothesis wraps a flaky failure; keep what we found
        if not (result.divergences or result.unknown_findings):
            raise
        del err
    result.seconds = time.monotonic() - start
    return result
