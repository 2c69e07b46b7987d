"""Seeded synthetic workloads shaped like published serving traces.

A workload is a recipe for a Scenario: arrivals (all at once, Poisson or Gamma
inter-arrival times, in steps), prompt and output lengths (fixed, lognormal or Zipf),
and draft acceptance (per-position rates). The same seed gives the same scenario,
byte for byte; ``schedule``, ``fuzz`` and the trace-recording script all read it.

Prompts are lengths, but for a workload with ``PromptSharing``: its requests carry token
ids, for prefix caching (every prompt after one system prompt, some of them the next
turn of an earlier request). Any other prompt gets ids shared with no other request from
the driver when prefix caching is on (``reference.token_ids``).

Acceptance rates are *unconditional* per-position rates, the way serving benchmarks
publish them (the fraction of steps whose draft at position j was accepted). The scenario
format's ``per_position`` is conditional (position j accepted given j-1 was), so the
generator converts: ``p_j = a_j / a_(j-1)``.
"""

from __future__ import annotations

import bisect
import functools
import itertools
import json
import math
import random
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from dualbudget.spec.config import EngineConfig, SpeculativeConfig
from dualbudget.spec.errors import BadInput

from ..formats.scenario import Acceptance, RequestSpec, Scenario, scenario_to_json, validate
from ..token_ids import output_token_id, segment


class WorkloadError(BadInput):
    pass


@dataclass(frozen=True)
class Lengths:
    """A length distribution: ``fixed`` N, ``lognormal`` (median, sigma), or ``zipf``
    (rank ``r`` over ``minimum..maximum`` with weight ``r ** -value``), always clipped to
    ``[minimum, maximum]``."""

    kind: str
    value: float = 0.0
    sigma: float = 0.0
    minimum: int = 1
    maximum: int = 1 << 30

    def draw(self, rng: random.Random) -> int:
        if self.kind == "fixed":
            raw = self.value
        elif self.kind == "lognormal":
            raw = rng.lognormvariate(math.log(self.value), self.sigma)
        elif self.kind == "zipf":
            raw = self.minimum - 1 + _zipf_rank(rng, self.value, self.maximum - self.minimum + 1)
        else:
            raise WorkloadError(f"lengths: unknown kind {self.kind!r}")
        return max(self.minimum, min(self.maximum, round(raw)))


@dataclass(frozen=True)
class Arrivals:
    """``burst``: all at step 0. ``poisson``: exponential gaps of mean ``1/rate`` steps.
    ``gamma``: Gamma gaps of the given ``shape`` and mean ``1/rate`` (shape < 1 is
    burstier than Poisson)."""

    kind: str
    rate: float = 1.0
    shape: float = 1.0

    def steps(self, rng: random.Random, count: int) -> list[int]:
        if self.kind == "burst":
            return [0] * count
        if self.rate <= 0:
            raise WorkloadError(f"arrivals.rate: must be > 0, got {self.rate}")
        clock, steps = 0.0, []
        for _ in range(count):
            steps.append(int(clock))
            if self.kind == "poisson":
                clock += rng.expovariate(self.rate)
            elif self.kind == "gamma":
                clock += rng.gammavariate(self.shape, 1.0 / (self.shape * self.rate))
            else:
                raise WorkloadError(f"arrivals: unknown kind {self.kind!r}")
        return steps


@dataclass(frozen=True)
class PromptSharing:
    """What prompts share, for prefix caching. Every prompt starts with the same
    ``system_prompt_len`` ids, then its own turn of ``Workload.prompt_len`` ids; with
    probability ``follow_up`` a request (not the first) is instead the next turn of an
    earlier request, drawn uniformly: that request's prompt, its whole reply
    (``max_tokens`` of its output id, ``reference.token_ids``), then a new turn. A prompt
    is cut at ``max_model_len - 1`` ids."""

    system_prompt_len: int
    follow_up: float = 0.0


@dataclass(frozen=True)
class Workload:
    name: str
    config: EngineConfig
    num_requests: int
    arrivals: Arrivals
    prompt_len: Lengths
    output_len: Lengths
    acceptance_rates: tuple[float, ...] = ()
    """Unconditional per-position acceptance rates (see the module docstring)."""
    profile: str = "vllm-0.32"
    priorities: Sequence[int] = field(default=(0,))
    summary: str = ""
    sharing: PromptSharing | None = None
    """Prompts with a shared prefix (token ids in every request); None: no sharing."""

    def scenario(self, seed: int, profile: str | None = None) -> Scenario:
        rng = random.Random(f"{self.name}:{seed}")
        arrival_steps = self.arrivals.steps(rng, self.num_requests)
        limit = self.config.max_model_len
        prompts = None
        if self.sharing is not None:
            # A generator of its own: sharing draws nothing from the lengths' one.
            label = f"{self.name}:{seed}"
            prompts = PromptIds(self.sharing, label, random.Random(f"{label}:turns"), limit - 1)
        requests = []
        for i, arrival in enumerate(arrival_steps):
            turn = self.prompt_len.draw(rng)
            ids = None if prompts is None else prompts.next(str(i), turn)
            prompt = min(turn, limit - 1) if ids is None else len(ids)
            output = min(self.output_len.draw(rng), limit - prompt)
            if prompts is not None and ids is not None:
                prompts.done(str(i), ids, output)
            requests.append(
                RequestSpec(
                    id=str(i),
                    prompt_len=prompt,
                    max_tokens=output,
                    arrival_step=arrival,
                    priority=rng.choice(list(self.priorities)),
                    prompt_token_ids=ids,
                )
            )
        acceptance = Acceptance(
            fixed=None, per_position=conditional_rates(self.acceptance_rates), seed=seed
        )
        return validate(Scenario(profile or self.profile, self.config, tuple(requests), acceptance))


class PromptIds:
    """The prompts' ids under ``sharing``, one request after another."""

    def __init__(self, sharing: PromptSharing, label: str, rng: random.Random, limit: int) -> None:
        self.sharing = sharing
        self.label = label
        self.rng = rng
        self.limit = limit
        self.turns: list[tuple[str, tuple[int, ...], int]] = []
        """Every request so far: its id, prompt ids and max_tokens."""
        self.system = segment(f"{label}:system", sharing.system_prompt_len)

    def next(self, request_id: str, turn: int) -> tuple[int, ...]:
        """The prompt of ``request_id``, ending with a turn of ``turn`` ids of its own."""
        head = self.system
        earlier = self.turns
        if earlier and self.rng.random() < self.sharing.follow_up:
            rid, prompt, reply = earlier[self.rng.randrange(len(earlier))]
            head = prompt + (output_token_id(rid),) * reply
        return (head + segment(f"{self.label}:turn:{request_id}", turn))[: self.limit]

    def done(self, request_id: str, prompt: tuple[int, ...], max_tokens: int) -> None:
        self.turns.append((request_id, prompt, max_tokens))


def conditional_rates(unconditional: Sequence[float]) -> tuple[float, ...]:
    """Turn published per-position rates ``a_j`` into ``P(j accepted | j-1 accepted)``."""
    rates, previous = [], 1.0
    for j, rate in enumerate(unconditional):
        if not 0.0 <= rate <= previous:
            raise WorkloadError(
                f"acceptance_rates[{j}]: {rate} must lie in [0, {previous}] (rates cannot grow"
                " with the position)"
            )
        rates.append(rate / previous if previous > 0 else 0.0)
        previous = rate
    return tuple(rates)


def _zipf_rank(rng: random.Random, exponent: float, ranks: int) -> int:
    """A rank in ``1..ranks`` drawn with weight ``rank ** -exponent`` (inverse CDF)."""
    cumulative = _zipf_cumulative(exponent, ranks)
    return bisect.bisect_left(cumulative, rng.random() * cumulative[-1]) + 1


@functools.cache
def _zipf_cumulative(exponent: float, ranks: int) -> tuple[float, ...]:
    return tuple(itertools.accumulate(rank**-exponent for rank in range(1, ranks + 1)))


def _config(**overrides: object) -> EngineConfig:
    base: dict[str, object] = {
        "max_num_batched_tokens": 128,
        "max_num_seqs": 16,
        "max_model_len": 1024,
        "block_size": 16,
        "num_gpu_blocks": 1024,
    }
    base.update(overrides)
    return EngineConfig(**base)  # type: ignore[arg-type]


PRESETS: dict[str, Workload] = {
    workload.name: workload
    for workload in (
        Workload(
            "dspark-bench",
            _config(speculative_config=SpeculativeConfig("dspark", 7, True, "anchor")),
            num_requests=4096,
            arrivals=Arrivals("burst"),
            prompt_len=Lengths("fixed", 64),
            output_len=Lengths("fixed", 512),
            # Per-position acceptance of a published GPU run of DSpark on an 8B model.
            acceptance_rates=(0.6235, 0.4530, 0.3304, 0.2610, 0.2214, 0.1798, 0.1601),
            profile="vllm-0.33",
            summary="4096 x (64 prompt, 512 output) at once, max_num_seqs=16, B=128, K=7",
        ),
        Workload(
            "chat-poisson",
            _config(
                max_num_batched_tokens=256,
                max_num_seqs=32,
                max_model_len=2048,
                num_gpu_blocks=512,
                speculative_config=SpeculativeConfig("eagle3", 4, True),
            ),
            num_requests=256,
            arrivals=Arrivals("poisson", rate=2.0),
            prompt_len=Lengths("lognormal", 300, 0.9, 4, 1500),
            output_len=Lengths("lognormal", 150, 0.8, 1, 512),
            acceptance_rates=(0.7, 0.5, 0.35, 0.25),
            profile="vllm-0.32",
            summary="Poisson arrivals, lognormal chat-like lengths, P-EAGLE K=4",
        ),
        Workload(
            "long-prompts",
            _config(
                max_num_batched_tokens=512,
                max_num_seqs=8,
                max_model_len=8192,
                num_gpu_blocks=2048,
                speculative_config=SpeculativeConfig("dflash", 7, True),
            ),
            num_requests=32,
            arrivals=Arrivals("gamma", rate=0.05, shape=0.5),
            prompt_len=Lengths("zipf", 1.1, minimum=512, maximum=6000),
            output_len=Lengths("lognormal", 200, 0.5, 16, 1024),
            acceptance_rates=(0.6, 0.4, 0.3, 0.2, 0.15, 0.1, 0.08),
            profile="vllm-0.33",
            summary="low concurrency, long Zipf prompts, bursty Gamma arrivals, DFlash K=7",
        ),
        Workload(
            "chat-system-prompt",
            _config(
                max_num_batched_tokens=256,
                max_num_seqs=32,
                max_model_len=2048,
                num_gpu_blocks=1024,
                speculative_config=SpeculativeConfig("eagle3", 4, True),
                enable_prefix_caching=True,
            ),
            num_requests=256,
            arrivals=Arrivals("poisson", rate=2.0),
            # The user's turn; every prompt is the system prompt or an earlier prompt first.
            prompt_len=Lengths("lognormal", 100, 0.9, 4, 1000),
            output_len=Lengths("lognormal", 150, 0.8, 1, 512),
            acceptance_rates=(0.7, 0.5, 0.35, 0.25),
            profile="vllm-0.33",
            sharing=PromptSharing(system_prompt_len=512, follow_up=0.25),
            summary="chat-poisson's arrivals and outputs, every prompt after one 512-token"
            " system prompt, a quarter of them follow-up turns; prefix caching on, P-EAGLE K=4",
        ),
    )
}


DEFAULT_WORKLOAD = "dspark-bench"
"""The preset ``dualbudget simulate`` and ``dualbudget diff`` run when given no workload,
scenario or trace."""


def preset(name: str) -> Workload:
    try:
        return PRESETS[name]
    except KeyError:
        raise WorkloadError(f"unknown workload {name!r} (known: {', '.join(PRESETS)})") from None


@dataclass(frozen=True, kw_only=True)
class WorkloadOptions:
    """One ``dualbudget workload NAME`` run; the command line fills it from its flags."""

    name: str
    """A preset of ``PRESETS``."""
    seed: int = 0
    profile: str | None = None
    """None: the preset's own profile."""
    out: str | None = None
    """The file the scenario goes to; None: standard output."""


def write_workload(options: WorkloadOptions) -> int:
    """``dualbudget workload NAME``: the preset's scenario JSON, for ``schedule`` and
    the recording scripts."""
    scenario = preset(options.name).scenario(options.seed, options.profile)
    text = json.dumps(scenario_to_json(scenario), indent=1) + "\n"
    if options.out:
        Path(options.out).write_text(text)
    else:
        sys.stdout.write(text)
    return 0
