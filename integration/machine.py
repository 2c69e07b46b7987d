"""The fuzz's state machines: one lockstep run per example, one machine per aim.

A Hypothesis ``RuleBasedStateMachine`` starts from a config drawn for its aim
(``aims.aimed_config``), then interleaves rules that add requests, abort them and run
engine steps with drawn acceptance and draft proposals. After every rule the invariant
holds or the run stops: the live decision equals the reference's (``Lockstep`` raises
``DivergenceFound``), and the reference's C1-C3 hold unless the break is a known finding
(``UnitRun.take_findings``).

``LockstepMachine`` holds the rules and the invariant every aim shares; each subclass
changes only an aim's request draws (prompt, output and priority, the opening crowd,
arrivals between steps). ``aims.machine_for`` binds one to a unit's ``UnitRun`` and to
its aim's configs.

The draws are part of the fuzz's result (a seed gives the same examples): a change to a
strategy, to a draw's order or label, or to a rule's name (Hypothesis orders the rules by
name) changes the seed-1 totals; nothing else does (``fuzz.run_unit`` keeps Hypothesis
from drawing the project's own literals).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, ClassVar

import hypothesis.strategies as st
from hypothesis import assume, reject
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from dualbudget.spec.config import EngineConfig, runs_async
from dualbudget.spec.profiles import profile_named

from .lockstep import ConfigRefused, DivergenceFound, Lockstep, MirroredCrash
from .monitor_run import LiveAlone
from .outcome import TimeUp, UnitRun
from .prompts import draw_prompt_ids

MAX_REQUESTS = 14
"""Requests one example adds at most."""


class LockstepMachine(RuleBasedStateMachine):
    """The rules and the invariant every aim shares; the draws are those of ``mixed``.

    A unit's machine is a subclass made by ``aims.machine_for``: it binds the unit's
    ``UnitRun`` and the initial rule that draws the aim's config."""

    run: ClassVar[UnitRun]
    initial_requests_low: ClassVar[int] = 1
    initial_requests_high: ClassVar[int] = 6
    draws_async_and_stops: ClassVar[bool] = True
    """Whether examples draw async scheduling and natural stops."""
    voids_simplest_example: ClassVar[bool] = False
    """Whether a unit's first example is void. Hypothesis opens every run with its
    simplest example: the opening crowd's least, one step, then rules that add and abort
    requests without another step. An aim whose event needs many steps of a growing crowd
    voids it rather than count it among its few examples."""

    def __init__(self) -> None:
        super().__init__()
        self.lock: Lockstep | None = None

    # -- the aim's draws (overridden per aim) ----------------------------------------------
    def prompt_strategy(self, limit: int, late: bool) -> st.SearchStrategy[int]:
        # One-token prompts join a decode batch padded to 1 + K; long ones get chunked.
        return st.one_of(st.just(1), st.integers(1, min(8, limit - 1)), st.integers(1, limit - 1))

    def output_strategy(self, limit: int) -> st.SearchStrategy[int]:
        # Long outputs run into max_model_len.
        return st.one_of(st.integers(1, 12), st.integers(1, limit), st.just(limit))

    def priority_strategy(self, late: bool) -> st.SearchStrategy[int]:
        # Later arrivals may outrank running requests (0 is the highest priority), so
        # that a victim can be one already scheduled in the step.
        return st.integers(0 if late else 2, 3)

    def async_strategy(self) -> st.SearchStrategy[bool]:
        # Hypothesis' simplest example, every unit's first, runs synchronously.
        return st.booleans()

    def arrive_between_steps(self, lock: Lockstep, data: st.DataObject) -> None:
        """Arrivals between two steps of one ``run_steps`` rule: none by default."""

    # -- the rules ----------------------------------------------------------------------
    def begin(self, config: EngineConfig, data: st.DataObject) -> None:
        """The initial rule's body: one example's lockstep run and its first steps."""
        run = self.run
        if run.stopped:
            reject()  # the first divergence stopped the run; void the rest
        if run.cancelled():
            raise TimeUp  # an earlier unit stopped the whole run
        voided = int(self.voids_simplest_example)
        if run.out_of_time() and run.started > voided:
            # A unit always gets its first example: vLLM's one-off costs (its import,
            # the first build of each draft architecture) must not starve a unit.
            run.stopped_by_time = True
            raise TimeUp
        run.started += 1
        if run.started <= voided:
            reject()  # Hypothesis' simplest example (``voids_simplest_example``)
        spec = config.speculative_config
        # Async scheduling (vLLM's default for these drafters) in about half the examples.
        if (
            self.draws_async_and_stops
            and spec is not None
            and runs_async(spec, profile_named(run.profile).release)
            and data.draw(self.async_strategy(), label="async_scheduling")
        ):
            config = replace(config, async_scheduling=True)
        try:
            # --monitor-only: the live scheduler alone, the contract monitor its judge.
            self.lock = (LiveAlone if run.monitor_only else Lockstep)(
                config,
                run.profile,
                seed=run.seed,
                out_dir=run.out_dir,
                label=f"{run.profile}-{run.layout}-{run.aim}{run.round_tag}-ex{run.started}",
            )
        except ConfigRefused as refused:
            run.refuse(str(refused))
            assume(False)
        except DivergenceFound as found:
            run.divergences.append(found.divergence)
            raise
        assert self.lock is not None
        run.examples += 1
        run.constructions.add(self.lock.construction.how)
        for _ in range(
            data.draw(
                st.integers(self.initial_requests_low, self.initial_requests_high),
                label="initial requests",
            )
        ):
            self._add(data)
        # Steps right away: Hypothesis opens every run with its simplest example (one
        # rule, no step), and each (layout, aim) unit is a run of its own.
        self._run_steps(data, data.draw(st.integers(1, 12), label="first steps"))

    def _add(self, data: st.DataObject) -> None:
        assert self.lock is not None
        limit = self.lock.config.max_model_len
        late = self.lock.step > 0
        prompt = data.draw(self.prompt_strategy(limit, late), label="prompt_len")
        ids = None
        if self.lock.config.enable_prefix_caching:
            ids = draw_prompt_ids(data, self.lock.config, self.lock.requests, prompt)
            prompt = len(ids)
        output = data.draw(self.output_strategy(limit), label="max_tokens")
        priority = 0
        if self.lock.config.scheduling_policy == "priority":
            priority = data.draw(self.priority_strategy(late), label="priority")
        self.lock.add(prompt, output, priority, ids)

    @precondition(lambda self: self.lock is not None and len(self.lock.requests) < MAX_REQUESTS)
    @rule(data=st.data())
    def add_request(self, data: st.DataObject) -> None:
        self._add(data)

    @precondition(
        lambda self: self.lock is not None
        and self.lock.config.scheduling_policy == "priority"
        and self.lock.step > 0
        and len(self.lock.requests) < MAX_REQUESTS
    )
    @rule(prompt=st.integers(1, 8), output=st.integers(4, 32))
    def add_urgent(self, prompt: int, output: int) -> None:
        """A late request that outranks the running ones: under KV pressure the
        victim is then a running request already scheduled in the step."""
        assert self.lock is not None
        self.lock.add(prompt, output, 0)

    @precondition(lambda self: self.lock is not None and bool(self.lock.unfinished()))
    @rule(data=st.data())
    def abort_request(self, data: st.DataObject) -> None:
        assert self.lock is not None
        # One rule pick in four aborts: the rules are picked uniformly, and aborting
        # as often as adding would leave few requests to schedule.
        if data.draw(st.integers(0, 3), label="abort?") == 0:
            rid = data.draw(st.sampled_from(self.lock.unfinished()), label="abort")
            self.lock.abort(rid)

    @precondition(lambda self: self.lock is not None)
    @rule(data=st.data(), steps=st.integers(1, 12))
    def run_steps(self, data: st.DataObject, steps: int) -> None:
        self._run_steps(data, steps)

    def _run_steps(self, data: st.DataObject, steps: int) -> None:
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

        natural_stops = self.draws_async_and_stops and data.draw(
            st.booleans(), label="natural stops"
        )

        def stop(rid: str, num_sampled: int) -> int:
            # Now and then one of the sampled tokens is EOS or a stop token.
            if not natural_stops or data.draw(st.integers(0, 7), label=f"stop {rid}?"):
                return 0
            return int(data.draw(st.integers(1, num_sampled), label=f"stop {rid} at"))

        for _ in range(steps):
            self.arrive_between_steps(lock, data)
            before = dict(lock.coverage)
            try:
                lock.run_step(accept, propose, stop)
            except DivergenceFound as found:
                self.run.divergences.append(found.divergence)
                raise
            except MirroredCrash as crash:
                self.run.take_crash(lock, crash)
                self.lock = None
                return
            finally:
                # The monitor's opinion of every step made, a diverging one included.
                self.run.take_monitor(lock)
            self.run.count_step(before, lock.coverage)

    @rule()
    def idle(self) -> None:
        """Keeps the machine valid after a mirrored crash ended its lockstep run."""

    @invariant()
    def contract_holds(self) -> None:
        """C1-C3 (the reference's per-step check) hold, or the break is a known finding."""
        if self.lock is not None and self.lock.violations:
            self.run.take_findings(self.lock)
        unknown = self.run.unknown_findings
        assert not unknown, f"contract broken: {unknown[0].to_json()}"


class BudgetMachine(LockstepMachine):
    def prompt_strategy(self, limit: int, late: bool) -> st.SearchStrategy[int]:
        # Prompts long against the buffer: their chunks meet the input budget.
        return st.one_of(st.integers(limit // 2, limit - 1), st.integers(1, limit - 1))


class PreemptMachine(LockstepMachine):
    # A crowd from the start, so that the pool fills early.
    initial_requests_low = 3

    def prompt_strategy(self, limit: int, late: bool) -> st.SearchStrategy[int]:
        return st.integers(1, min(12, limit - 1))

    def output_strategy(self, limit: int) -> st.SearchStrategy[int]:
        # Long outputs keep the batch decoding and growing into the pool.
        return st.one_of(st.just(limit), st.integers(limit // 2, limit))

    def priority_strategy(self, late: bool) -> st.SearchStrategy[int]:
        if late:
            # Mostly outranking: a late request admitted behind worse ones is what
            # makes a victim out of a request scheduled before it.
            return st.sampled_from([0, 0, 1, 2, 3])
        return super().priority_strategy(late)

    def arrive_between_steps(self, lock: Lockstep, data: st.DataObject) -> None:
        # Urgent arrivals between steps too, not only between rule picks; each is a
        # chance of a victim already scheduled in its step.
        if (
            len(lock.requests) < MAX_REQUESTS
            and data.draw(st.integers(0, 5), label="urgent arrival?") == 0
        ):
            lock.add(
                data.draw(st.integers(1, 8), label="urgent prompt_len"),
                data.draw(st.integers(4, 32), label="urgent max_tokens"),
                0,
            )


class HybridMachine(PreemptMachine):
    """PreemptMachine's crowd and long outputs, with prompts up to ``max_model_len``: a
    prompt spanning several blocks is what a budget cuts off a block boundary (where
    Mamba's align mode moves the cut back) and what a sliding window slides over. With
    prefix caching on, arrivals between steps share prefixes with those before them."""

    def prompt_strategy(self, limit: int, late: bool) -> st.SearchStrategy[int]:
        return st.integers(1, limit - 1)

    def arrive_between_steps(self, lock: Lockstep, data: st.DataObject) -> None:
        if not lock.config.enable_prefix_caching:
            super().arrive_between_steps(lock, data)
        elif (
            len(lock.requests) < MAX_REQUESTS
            and data.draw(st.integers(0, 1), label="shared arrival?") == 0
        ):
            # Prompts sharing prefixes with those before them (``_add``), every other
            # step: hits for every group to find, and for a window evicted behind them
            # to cut.
            self._add(data)


class PaddedMachine(LockstepMachine):
    def prompt_strategy(self, limit: int, late: bool) -> st.SearchStrategy[int]:
        # Short prompts decode soon; one-token late arrivals join them padded.
        if late:
            return st.one_of(st.just(1), st.just(1), st.integers(1, 4))
        return st.integers(1, 8)

    def output_strategy(self, limit: int) -> st.SearchStrategy[int]:
        # Long outputs keep the batch decoding and growing into the pool.
        return st.one_of(st.just(limit), st.integers(limit // 2, limit))


class RefundMachine(LockstepMachine):
    """The ``refund`` aim's arrivals: one short prompt at a time, on most steps one more,
    each outranking every request before it (priority ``requests_high`` minus the
    requests so far). Each is admitted behind the running ones, so the running order
    (the order of admission) runs from the worst priority to the best, and the victim
    (vLLM preempts the max (priority, arrival time)) is the first scheduled: a request
    behind it short of a block preempts it with a refund, and the requests behind that
    one meet the budget it restored. A preempted request readmitted runs last, the worst:
    arrivals that outrank it keep it waiting, so they run on for up to ``requests_high``
    requests (the other aims' ``MAX_REQUESTS`` would end them early in the run)."""

    initial_requests_low = initial_requests_high = 1
    requests_high: ClassVar[int] = 120
    # One request alone for one step preempts nothing: the simplest example would take
    # one of the aim's three or four examples per method.
    voids_simplest_example = True
    # Its arrival order is built for one synchronous refund: stops and steps in flight
    # would break it up.
    draws_async_and_stops = False

    def prompt_strategy(self, limit: int, late: bool) -> st.SearchStrategy[int]:
        return st.integers(1, 6)

    def output_strategy(self, limit: int) -> st.SearchStrategy[int]:
        # Each lives through a few preemptions of those before it, then makes room.
        return st.integers(limit // 4, limit // 2)

    def priority_strategy(self, late: bool) -> st.SearchStrategy[int]:
        assert self.lock is not None
        return st.just(self.requests_high - len(self.lock.requests))

    def arrive_between_steps(self, lock: Lockstep, data: Any) -> None:
        if len(lock.requests) < self.requests_high and data.draw(
            st.integers(0, 15), label="arrival?"
        ):
            limit = lock.config.max_model_len
            lock.add(
                data.draw(self.prompt_strategy(limit, True), label="late prompt_len"),
                data.draw(self.output_strategy(limit), label="late max_tokens"),
                self.requests_high - len(lock.requests),
            )


class TokenMachine(LockstepMachine):
    def prompt_strategy(self, limit: int, late: bool) -> st.SearchStrategy[int]:
        # Prompts long against the token budget: their chunks meet it.
        return st.one_of(st.integers(limit // 2, limit - 1), st.integers(1, limit - 1))


class EdgeMachine(LockstepMachine):
    def prompt_strategy(self, limit: int, late: bool) -> st.SearchStrategy[int]:
        return st.one_of(st.just(1), st.integers(1, max(1, limit - 1)))

    def output_strategy(self, limit: int) -> st.SearchStrategy[int]:
        return st.one_of(st.just(limit), st.integers(1, limit))

    def arrive_between_steps(self, lock: Lockstep, data: Any) -> None:
        # One-token arrivals every other step: each joins the decodes of that step, padded
        # or not by the rule under test (a decode here lives a step or two).
        if (
            lock.step > 0
            and len(lock.requests) < MAX_REQUESTS
            and data.draw(st.booleans(), label="one-token arrival?")
        ):
            lock.add(1, data.draw(st.integers(1, lock.config.max_model_len), label="max_tokens"))


class LoneMachine(LockstepMachine):
    # One request alone in the first steps (the ``lone`` aim).
    initial_requests_low = initial_requests_high = 1

    def prompt_strategy(self, limit: int, late: bool) -> st.SearchStrategy[int]:
        # Longer than the threshold (the lone aim draws it at most 8, below limit - 1).
        assert self.lock is not None
        return st.integers(self.lock.config.long_prefill_token_threshold + 1, limit - 1)


class PrefixMachine(LockstepMachine):
    """The ``prefix`` aim's requests: a crowd from the start and, between steps, more
    arrivals whose prompts share prefixes with those before them (``prompts``), so that
    repeats and later turns meet their originals still running, finished (their blocks
    cached and free) or preempted; up to ``requests_high`` of them."""

    initial_requests_low = 2
    requests_high: ClassVar[int] = 24

    def prompt_strategy(self, limit: int, late: bool) -> st.SearchStrategy[int]:
        # Several blocks long, now and then most of max_model_len.
        return st.one_of(st.integers(limit // 4, limit // 2), st.integers(1, limit - 1))

    def output_strategy(self, limit: int) -> st.SearchStrategy[int]:
        # Short ones finish and free their cached blocks; long ones grow into the pool.
        return st.one_of(st.integers(1, 8), st.integers(limit // 2, limit))

    def arrive_between_steps(self, lock: Lockstep, data: st.DataObject) -> None:
        if (
            len(lock.requests) < self.requests_high
            and data.draw(st.integers(0, 2), label="shared arrival?") == 0
        ):
            self._add(data)


class EngineCallMachine(PrefixMachine):
    """The ``engine_calls`` aim's runs: the prefix aim's requests, and the engine's own
    calls on the scheduler between steps. Every example, Hypothesis' simplest included,
    resets the prefix cache with its running requests preempted after its first steps,
    steps on (resuming them while their output in flight is dropped, under async
    scheduling, which the simplest example runs where the drafter does), then pauses and
    resumes; the rules repeat both at drawn moments."""

    def output_strategy(self, limit: int) -> st.SearchStrategy[int]:
        # Outputs long enough to be running, with an output in flight, at the reset.
        return st.integers(4, limit)

    def async_strategy(self) -> st.SearchStrategy[bool]:
        # The simplest example async where the drafter runs it: its reset then finds an
        # output in flight to drop, in every unit's first example.
        return st.sampled_from([True, False])

    def begin(self, config: EngineConfig, data: st.DataObject) -> None:
        super().begin(config, data)
        if self.lock is None:
            return
        self.lock.reset_prefix_cache(True)
        self._run_steps(data, data.draw(st.integers(1, 4), label="steps after reset"))
        self._pause(data)

    def _pause(self, data: st.DataObject) -> None:
        if self.lock is None:
            return
        state = data.draw(st.sampled_from(["paused_all", "paused_new"]), label="pause")
        self.lock.set_pause_state(state)
        self._run_steps(data, data.draw(st.integers(1, 3), label="paused steps"))
        if self.lock is not None:
            self.lock.set_pause_state("unpaused")

    @precondition(lambda self: self.lock is not None)
    @rule(data=st.data())
    def pause_for_steps(self, data: st.DataObject) -> None:
        self._pause(data)

    @precondition(lambda self: self.lock is not None)
    @rule(reset_running_requests=st.booleans())
    def reset_prefix_cache(self, reset_running_requests: bool) -> None:
        assert self.lock is not None
        self.lock.reset_prefix_cache(reset_running_requests)
