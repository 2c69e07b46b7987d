"""``dualbudget diff``: where two profiles decide differently.

On a workload or a scenario: the reference under each profile, step by step
(``reference/runs/diff.py``), the first step whose decisions differ and the totals side by
side. With ``--search``: z3 first (``proofs/same_decisions.py``): where it proves the two
profiles make the same decisions for every config in ``SEARCH_BOUNDS``, that is the answer
(``"proved_equal": true``); else a seeded Hypothesis search, bounded in examples and in
seconds, for the scenario within those bounds that maximises the gap in steps to drain
(then in target tokens per step), written as a scenario file ``dualbudget schedule``
runs.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dualbudget.reference.formats.scenario import (
    Acceptance,
    RequestSpec,
    Scenario,
    dump_scenario,
    load_scenario,
    validate,
)
from dualbudget.reference.runs.diff import Comparison, compare
from dualbudget.reference.runs.workload import DEFAULT_WORKLOAD, preset
from dualbudget.spec.config import EngineConfig, SpeculativeConfig, runs_async
from dualbudget.spec.errors import BadInput
from dualbudget.spec.methods import layout_named
from dualbudget.spec.policies import StepParams
from dualbudget.spec.profiles import profile_named

if TYPE_CHECKING:
    # z3 is imported by the search's proof only, when it runs.
    from dualbudget.proofs.same_decisions import Bounds, SameDecisions, Separation

DEFAULT_SEARCH_LAYOUT = "dflash"
DEFAULT_OUT = Path("out") / "diff"


@dataclass(frozen=True, kw_only=True)
class DiffOptions:
    """One ``dualbudget diff`` run (``diff_command``); its defaults are the flags'."""

    profiles: tuple[str, ...] = ()
    """Exactly two: A, then B."""
    layout: tuple[str, ...] = ()
    """The method layout; empty: the workload's (``DEFAULT_SEARCH_LAYOUT`` for a search).
    Several only with ``search``: each layout searched on its own."""
    workload: str | None = None
    """A preset; None, and no ``scenario`` either: ``DEFAULT_WORKLOAD``."""
    scenario: str | None = None
    """A scenario JSON file."""
    search: bool = False
    """Search for the widest difference instead of running one workload."""
    seed: int = 0
    """The preset's and the search's seed."""
    examples: int = 500
    """The search's examples."""
    max_seconds: float = 90.0
    """The search's time cap."""
    out: str | None = None
    """Where the search writes its scenario; None: under ``DEFAULT_OUT``."""
    json_path: str | None = None
    seeds: int = 1
    """The search runs the seeds ``seed`` .. ``seed + seeds - 1``, each ``examples``
    examples: one unit per layout and seed."""
    executor: str = "local"
    """Where the search's units run: ``local`` processes (``jobs``) or ``ray``."""
    jobs: int = 1
    """Processes of the local executor (``ray``: actors; 0 there: one per CPU)."""
    ray_address: str | None = None
    """The Ray cluster of ``--executor ray``; None: a local Ray started for the run."""


@dataclass(frozen=True)
class SearchBounds:
    """The realistic bounds of ``--search`` (and of its z3 check, for the config)."""

    b: tuple[int, int] = (512, 2048)
    m: tuple[int, int] = (16, 256)
    k: tuple[int, int] = (1, 8)
    requests: tuple[int, int] = (1, 160)
    prompt: tuple[int, int] = (1, 1024)
    output: tuple[int, int] = (1, 96)
    arrival: tuple[int, int] = (0, 16)
    headroom: tuple[int, int] = (0, 64)
    """max_model_len minus the longest request (prompt + output)."""

    def for_z3(self) -> Bounds:
        """The part of the bounds z3's check reads: the config's, and the most requests."""
        from dualbudget.proofs.same_decisions import Bounds

        return Bounds(self.b, self.m, self.k, requests=self.requests[1])

    def text(self) -> str:
        return (
            f"max_num_batched_tokens {_r(self.b)}, max_num_seqs {_r(self.m)} (<= B), K"
            f" {_r(self.k)}, {_r(self.requests)} requests, prompts {_r(self.prompt)} and"
            f" outputs {_r(self.output)} tokens, arrivals at steps {_r(self.arrival)},"
            f" max_model_len {_r(self.headroom)} past the longest request, KV pool from"
            " tight to ample, fixed acceptance 0..K, async scheduling on or off (where vLLM"
            " allows it with the method), fcfs or priority scheduling (priorities 0..2)"
        )


def _r(bounds: tuple[int, int]) -> str:
    return f"{bounds[0]}..{bounds[1]}"


SEARCH_BOUNDS = SearchBounds()


def _profiles(options: DiffOptions) -> tuple[str, str]:
    names = list(options.profiles)
    if len(names) != 2:
        raise BadInput(f"--profile: give exactly two profiles (A and B), got {len(names)}")
    for name in names:
        profile_named(name)
    return names[0], names[1]


def _with_layout(scenario: Scenario, layout: str | None) -> Scenario:
    if layout is None:
        return scenario
    row = layout_named(layout)
    k = scenario.config.num_speculative_tokens or 1
    config = replace(scenario.config, speculative_config=SpeculativeConfig.for_layout(row, k))
    return validate(replace(scenario, config=config))


def _source(options: DiffOptions) -> tuple[str, Scenario]:
    if options.workload and options.scenario:
        raise BadInput("--workload and --scenario: give one of them, not both")
    if options.scenario:
        return options.scenario, load_scenario(options.scenario)
    name = options.workload or DEFAULT_WORKLOAD
    return f"{name} (seed {options.seed})", preset(name).scenario(options.seed)


def diff_command(options: DiffOptions) -> int:
    a, b = _profiles(options)
    for layout in options.layout:
        layout_named(layout)
    if options.search:
        if options.workload or options.scenario:
            raise BadInput("--search: searches its own scenarios; no --workload or --scenario")
        if options.examples < 1 or options.max_seconds <= 0:
            raise BadInput("--examples must be >= 1 and --max-seconds > 0")
        return _search_command(options, a, b)
    if len(options.layout) > 1:
        raise BadInput("--layout: give one layout, or several with --search")
    if options.seeds != 1:
        raise BadInput("--seeds: only with --search")
    name, scenario = _source(options)
    scenario = _with_layout(scenario, options.layout[0] if options.layout else None)
    result = compare(scenario, a, b)
    print(f"workload: {name}, {len(scenario.requests)} requests")
    print_comparison(result, sys.stdout)
    if options.json_path:
        data = {**result.to_json(), "scenario": name}
        Path(options.json_path).write_text(json.dumps(data, indent=1) + "\n")
    return 0


def print_comparison(result: Comparison, out: Any) -> None:
    a, b = result.profiles
    if result.first is None:
        print(f"{a} and {b} make the same decision in every step", file=out)
    else:
        first = result.first
        print(f"first differing step: {first.step} (requests {', '.join(first.requests[:8])})")
        for profile, decision in first.decisions.items():
            scheduled = decision["num_scheduled_tokens"]
            print(
                f"  {profile}: {len(scheduled)} requests, T={decision['target_tokens']},"
                f" D={decision['draft_rows']}, preempted {decision['preempted'] or 'none'}",
                file=out,
            )
    keys = ("steps", "target_tokens", "draft_rows", "output_tokens", "tokens_per_step")
    print(f"{'totals':<16} {a:>14} {b:>14}", file=out)
    ta, tb = (t.to_json() for t in result.totals)
    for key in (*keys, "preemptions", "drained", "violations"):
        print(f"{key:<16} {ta[key]!s:>14} {tb[key]!s:>14}", file=out)


# -- the search --------------------------------------------------------------------------


@dataclass(frozen=True)
class SearchUnit:
    """One search of ``diff --search``: a layout and a seed; its answer is what
    ``diff --search --layout LAYOUT --seed SEED`` gives on its own (a time cap aside:
    ``max_seconds`` holds per unit, and a capped search depends on the machine)."""

    a: str
    b: str
    layout: str
    seed: int
    examples: int
    max_seconds: float
    at: tuple[Separation, ...] = ()
    """Where z3 separates the two profiles: the search's first candidates are built there."""


def prove_layout(unit: tuple[str, str, str]) -> SameDecisions:
    """z3's answer for one layout (``proofs/same_decisions.py``): whether ``a`` and ``b``
    make the same decisions for every config in ``SEARCH_BOUNDS``, and why (or why not,
    with the configs that separate them)."""
    from dualbudget.proofs.same_decisions import same_decisions

    a, b, layout = unit
    return same_decisions(a, b, layout, SEARCH_BOUNDS.for_z3())


def search_unit(unit: SearchUnit) -> Found:
    """The seeded search of one unit (module level: the executor's workers import it)."""
    return search(unit.a, unit.b, unit.layout, unit.seed, unit.examples, unit.max_seconds, unit.at)


def _search_command(options: DiffOptions, a: str, b: str) -> int:
    layouts = _search_layouts(options)
    proofs, units, answers, wall = _run_search(options, a, b, layouts)
    print(f"bounds: {SEARCH_BOUNDS.text()}; layout {', '.join(layouts)}")
    for layout, proof in proofs.items():
        print(f"z3 ({layout}): {proof.reason}")
    data: dict[str, Any] = {
        "profiles": [a, b],
        "layout": layouts[0],
        "layouts": {
            layout: {
                "proved_equal": proof.equal,
                "reason": proof.reason,
                "separated_at": [asdict(at) for at in proof.separations],
            }
            for layout, proof in proofs.items()
        },
        "bounds": SEARCH_BOUNDS.text(),
    }
    if not units:
        data.update({"differs": False, "proved_equal": True, "reason": proofs[layouts[0]].reason})
    else:
        data.update(_searched(options, a, b, proofs, units, answers, wall))
    if options.json_path:
        Path(options.json_path).write_text(json.dumps(data, indent=1) + "\n")
    return 0


def _search_layouts(options: DiffOptions) -> list[str]:
    """The layouts ``--search`` runs, once its options are known to be sound."""
    from dualbudget.campaign.executor import EXECUTORS

    if options.seeds < 1:
        raise BadInput("--seeds: must be >= 1")
    if options.executor not in EXECUTORS:
        raise BadInput(f"--executor: unknown {options.executor!r} (known: {', '.join(EXECUTORS)})")
    if options.jobs < 0 or (options.jobs == 0 and options.executor == "local"):
        raise BadInput("--jobs: must be >= 1 (0: every CPU of a Ray cluster)")
    return list(dict.fromkeys(options.layout or (DEFAULT_SEARCH_LAYOUT,)))


def _run_search(
    options: DiffOptions, a: str, b: str, layouts: list[str]
) -> tuple[dict[str, SameDecisions], list[SearchUnit], list[Found], float]:
    """z3's answer per layout, then a search unit per seed of every layout z3 does not
    prove equal, on the chosen executor; the units, their answers and the wall time."""
    from dualbudget.campaign.executor import ExecutorUnavailable, UnitFailed, executor_for

    started = time.perf_counter()
    try:
        with executor_for(options.executor, options.jobs, options.ray_address) as executor:
            proofs = dict(
                zip(
                    layouts,
                    executor.map(prove_layout, [(a, b, layout) for layout in layouts], layouts),
                    strict=True,
                )
            )
            units = [
                SearchUnit(
                    a,
                    b,
                    layout,
                    seed,
                    options.examples,
                    options.max_seconds,
                    proofs[layout].separations,
                )
                for layout in layouts
                if not proofs[layout].equal
                for seed in range(options.seed, options.seed + options.seeds)
            ]
            ids = [f"{u.layout} seed {u.seed}" for u in units]
            answers = list(executor.map(search_unit, units, ids))
    except UnitFailed as err:
        raise BadInput(f"--search: {err}") from None
    except ExecutorUnavailable as err:
        raise BadInput(f"--executor {options.executor}: {err}") from None
    return proofs, units, answers, time.perf_counter() - started


def _searched(
    options: DiffOptions,
    a: str,
    b: str,
    proofs: dict[str, SameDecisions],
    units: list[SearchUnit],
    answers: list[Found],
    wall: float,
) -> dict[str, Any]:
    """What a search that ran found, printed, its scenario written: the JSON's fields."""
    best = _best(units, answers)
    layout = units[best].layout if best is not None else units[0].layout
    data: dict[str, Any] = {
        "layout": layout,
        "proved_equal": False,
        "separated_by": proofs[layout].reason,
        "examples": sum(found.examples for found in answers),
        "seconds": round(wall, 1),
        "time_capped": any(found.time_capped for found in answers),
        "units": [
            {
                "layout": unit.layout,
                "seed": unit.seed,
                "examples": found.examples,
                "at_separation": found.at_separation,
                "differs": found.best is not None,
                "score": list(_score(found.best[1])) if found.best else None,
            }
            for unit, found in zip(units, answers, strict=True)
        ],
    }
    if best is None:
        tried = sum(found.at_separation for found in answers)
        print(
            f"no difference found in {data['examples']} examples ({wall:.0f} s), {tried} of"
            " them built where z3 separates the profiles: there the separation never reaches"
            " a decision within the bounds (a request count, a length, an arrival or the KV"
            " pool keeps the separating item from binding)"
        )
        data.update({"differs": False, "first_step": None, "totals": None, "scenario": None})
        return data
    found = answers[best]
    assert found.best is not None
    scenario, result = found.best
    seed = units[best].seed
    out = Path(options.out) if options.out else DEFAULT_OUT / f"{a}-vs-{b}-{layout}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    dump_scenario(scenario, out)
    print(
        f"widest difference in {data['examples']} examples ({wall:.0f} s), layout"
        f" {layout} seed {seed}: {len(scenario.requests)} requests,"
        f" B={scenario.config.max_num_batched_tokens},"
        f" max_num_seqs={scenario.config.max_num_seqs},"
        f" K={scenario.config.num_speculative_tokens}; scenario {out}"
    )
    print_comparison(result, sys.stdout)
    data.update({**result.to_json(), "scenario": str(out)})
    return data


def _best(units: Sequence[SearchUnit], answers: Sequence[Found]) -> int | None:
    """The unit whose difference is widest (``_score``); the first in unit order on a tie,
    so the answer does not depend on which unit finished first."""
    best: int | None = None
    for i, found in enumerate(answers):
        if found.best is None:
            continue
        if best is None or _score(found.best[1]) > _score(_comparison(answers[best])):
            best = i
    return best


def _comparison(found: Found) -> Comparison:
    assert found.best is not None
    return found.best[1]


@dataclass
class Found:
    best: tuple[Scenario, Comparison] | None
    examples: int
    seconds: float
    time_capped: bool
    at_separation: int = 0
    """Of ``examples``, those built where z3 separates the profiles (``candidates_at``)."""


def _score(result: Comparison) -> tuple[int, float, int]:
    ta, tb = result.totals
    return (
        abs(result.steps_gap()),
        abs(ta.tokens_per_step - tb.tokens_per_step),
        1 if result.differs else 0,
    )


def candidates_at(a: str, b: str, layout: str, at: Separation) -> list[Scenario]:
    """Scenarios on the config where z3 separates ``a`` from ``b`` (``at``), within
    ``SEARCH_BOUNDS``: requests all arriving at once, one more than the lower cap on
    running requests and as many as the bounds allow, short prompts and outputs, sync and
    (where the release runs the method so) async, no draft accepted and all of them."""
    bounds = SEARCH_BOUNDS
    row = layout_named(layout)
    k, b_, m = at.k, at.b, at.max_num_seqs
    most = bounds.requests[1]
    counts = sorted({min(_caps(a, row, b_, m, k), _caps(b, row, b_, m, k)) + 1, most})
    config = EngineConfig(
        max_num_batched_tokens=b_,
        max_num_seqs=m,
        max_model_len=bounds.prompt[1] + bounds.output[1],
        block_size=16,
        num_gpu_blocks=1,
        speculative_config=SpeculativeConfig.for_layout(row, k),
    )
    spec = config.speculative_config
    assert spec is not None
    modes = (False, True) if runs_async(spec, profile_named(a).release) else (False,)
    found = []
    for n in (count for count in counts if count <= most):
        for prompt, output in ((1, 4), (4, 16)):
            # Ample blocks: the KV pool never binds before the caps do.
            blocks = (n + 1) * -(-(config.max_model_len + k + 1) // config.block_size) + 1
            for asynchronous in modes:
                for accepted in sorted({0, k}):
                    requests = tuple(RequestSpec(str(i), prompt, output, 0, 0) for i in range(n))
                    shaped = replace(config, num_gpu_blocks=blocks, async_scheduling=asynchronous)
                    found.append(Scenario(a, shaped, requests, Acceptance(fixed=accepted)))
    return found


def search(
    a: str,
    b: str,
    layout: str,
    seed: int,
    examples: int,
    max_seconds: float,
    at: Sequence[Separation] = (),
) -> Found:
    """The candidates where z3 separates the profiles (``candidates_at``), then the seeded
    Hypothesis search (generate and target phases, no shrinking): each example a scenario
    within ``SEARCH_BOUNDS``, scored by the gap in steps to drain, then in tokens per
    step; the best that differs at all is kept."""
    import hypothesis.strategies as st
    from hypothesis import HealthCheck, Phase, given, settings, target
    from hypothesis import seed as hypothesis_seed

    from dualbudget.integration.seeded import without_source_constants

    started = time.perf_counter()
    state: dict[str, Any] = {"best": None, "score": (-1, -1.0, -1), "examples": 0, "capped": False}

    def consider(scenario: Scenario) -> tuple[int, float, int] | None:
        """The scenario's score, kept when it is the widest difference yet; None where
        either profile refuses it."""
        try:
            scenario = validate(scenario)
            validate(replace(scenario, profile=b))
        except BadInput:
            return None
        state["examples"] += 1
        result = compare(scenario, a, b)
        score = _score(result)
        if result.differs and score > state["score"]:
            state["best"], state["score"] = (scenario, result), score
        return score

    for separation in at:
        for candidate in candidates_at(a, b, layout, separation):
            consider(candidate)
    at_separation = state["examples"]

    @st.composite
    def scenarios(draw: Any) -> Scenario:
        return _drawn_scenario(draw, a, b, layout)

    @hypothesis_seed(seed)
    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        phases=[Phase.generate, Phase.target],
        suppress_health_check=list(HealthCheck),
    )
    @given(scenarios())
    def probe(scenario: Scenario) -> None:
        if time.perf_counter() - started > max_seconds:
            state["capped"] = True
            return
        score = consider(scenario)
        if score is not None:
            target(float(score[0]), label="steps gap")
            target(score[1], label="tokens per step gap")

    with without_source_constants():
        probe()
    seconds = time.perf_counter() - started
    return Found(state["best"], state["examples"], seconds, state["capped"], at_separation)


def _drawn_scenario(draw: Any, a: str, b: str, layout: str) -> Scenario:
    """One scenario of ``search``'s Hypothesis search, drawn within ``SEARCH_BOUNDS``."""
    import hypothesis.strategies as st

    bounds = SEARCH_BOUNDS
    row = layout_named(layout)
    release_a = profile_named(a).release
    k = draw(st.integers(*bounds.k))
    b_ = draw(st.integers(*bounds.b))
    seqs = range(bounds.m[0], min(bounds.m[1], b_) + 1)
    # Half the draws where the two caps on running requests differ (when they can):
    # the item z3 names when it separates vllm-0.33 from dual.
    apart = [x for x in seqs if _caps(a, row, b_, x, k) != _caps(b, row, b_, x, k)]
    pool = apart if apart and draw(st.booleans()) else list(seqs)
    m = draw(st.sampled_from(pool))
    cap = min(_caps(a, row, b_, m, k), _caps(b, row, b_, m, k))
    busy = st.integers(min(cap + 1, bounds.requests[1]), bounds.requests[1])
    n = draw(st.one_of(st.integers(*bounds.requests), busy))
    # A scale per scenario for the lengths and the arrivals, so that short requests
    # arriving together come up as often as the full ranges: a queue longer than a cap
    # on running requests only forms from short requests.
    longest_prompt = draw(st.sampled_from((4, 16, 64, bounds.prompt[1])))
    longest_output = draw(st.sampled_from((4, 16, bounds.output[1])))
    latest = draw(st.sampled_from((bounds.arrival[0], bounds.arrival[1])))
    prompt = st.integers(bounds.prompt[0], longest_prompt)
    output = st.integers(bounds.output[0], longest_output)
    arrival = st.integers(bounds.arrival[0], latest)
    sizes = draw(st.lists(st.tuples(prompt, output, arrival), min_size=n, max_size=n))
    longest = max(p + o for p, o, _ in sizes)
    max_model_len = longest + draw(st.integers(*bounds.headroom))
    block = 16
    per_request = -(-(max_model_len + k + 1) // block)
    ample = (n + 1) * per_request + 1
    blocks = draw(st.one_of(st.just(ample), st.integers(per_request + 1, ample)))
    config = EngineConfig(
        max_num_batched_tokens=b_,
        max_num_seqs=m,
        max_model_len=max_model_len,
        block_size=block,
        num_gpu_blocks=blocks,
        speculative_config=SpeculativeConfig.for_layout(row, k),
    )
    # Async only where the scenario's release runs this drafter async (the check of
    # profile B's release follows, in validation).
    spec = config.speculative_config
    assert spec is not None
    asynchronous = runs_async(spec, release_a) and draw(st.booleans())
    policy = draw(st.sampled_from(("fcfs", "priority")))
    priority = st.integers(0, 2) if policy == "priority" else st.just(0)
    config = replace(config, async_scheduling=asynchronous, scheduling_policy=policy)
    requests = tuple(
        RequestSpec(str(i), p, o, s, draw(priority))
        for i, (p, o, s) in enumerate(sorted(sizes, key=_arr))
    )
    accepted = draw(st.integers(0, k))
    return Scenario(a, config, requests, Acceptance(fixed=accepted))


def _caps(profile: str, row: Any, b: int, m: int, k: int) -> int:
    """The profile's cap on running requests at a config (``max_active_requests``)."""
    policy = profile_named(profile).policy
    return int(policy.max_active_requests(StepParams(b, b, m, k, row)))


def _arr(size: tuple[int, int, int]) -> int:
    return size[2]
