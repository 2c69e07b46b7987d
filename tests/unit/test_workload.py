"""The seeded workload generator: same seed, same scenario; shapes as documented."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys

import pytest

from dualbudget.reference.formats.scenario import parse_scenario, scenario_to_json
from dualbudget.reference.runs.workload import (
    PRESETS,
    Arrivals,
    Lengths,
    WorkloadError,
    conditional_rates,
    preset,
)
from dualbudget.reference.token_ids import output_token_id, segment


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_a_seed_gives_the_same_scenario_and_another_seed_another(name: str) -> None:
    first = scenario_to_json(preset(name).scenario(seed=5))
    assert first == scenario_to_json(preset(name).scenario(seed=5))
    assert parse_scenario(first) == preset(name).scenario(seed=5)
    if name != "dspark-bench":  # fixed lengths, one burst: only acceptance draws differ
        assert first["requests"] != scenario_to_json(preset(name).scenario(seed=6))["requests"]


def test_the_dspark_bench_preset_is_the_published_run() -> None:
    scenario = preset("dspark-bench").scenario(seed=0)
    config = scenario.config
    assert len(scenario.requests) == 4096
    assert {(r.prompt_len, r.max_tokens, r.arrival_step) for r in scenario.requests} == {
        (64, 512, 0)
    }
    assert (config.max_num_seqs, config.max_num_batched_tokens) == (16, 128)
    spec = config.speculative_config
    assert spec is not None and (spec.method, spec.num_speculative_tokens) == ("dspark", 7)
    # Published unconditional per-position rates a_j; the scenario holds a_j / a_(j-1).
    published = (0.6235, 0.4530, 0.3304, 0.2610, 0.2214, 0.1798, 0.1601)
    per_position = scenario.acceptance.per_position
    assert per_position is not None
    reached = 1.0
    for rate, conditional in zip(published, per_position, strict=True):
        reached *= conditional
        assert reached == pytest.approx(rate)


def test_the_system_prompt_preset_shares_its_prefix() -> None:
    workload = preset("chat-system-prompt")
    assert workload.sharing is not None
    n, label = workload.sharing.system_prompt_len, "chat-system-prompt:0"
    scenario = workload.scenario(seed=0)
    assert scenario.config.enable_prefix_caching
    system = segment(f"{label}:system", n)
    limit = scenario.config.max_model_len - 1
    earlier: list[tuple[int, ...]] = []
    follow_ups = 0
    for r in scenario.requests:
        ids = r.prompt_token_ids
        assert ids is not None and len(ids) == r.prompt_len <= limit
        assert ids[:n] == system  # every prompt, follow-up turns too
        if ids != system + segment(f"{label}:turn:{r.id}", r.prompt_len - n):
            # A follow-up: an earlier request's prompt and whole reply, then its own turn.
            assert any(ids[: len(e)] == e[: len(ids)] for e in earlier)
            follow_ups += 1
        earlier.append(ids + (output_token_id(r.id),) * r.max_tokens)
    assert 0.15 < follow_ups / len(scenario.requests) < 0.35  # follow_up = 0.25
    # Another seed, another system prompt; the other presets carry no ids.
    other = workload.scenario(seed=1).requests[0].prompt_token_ids
    assert other is not None and other[:n] != system
    for name in sorted(set(PRESETS) - {"chat-system-prompt"}):
        assert preset(name).sharing is None
        assert all(r.prompt_token_ids is None for r in preset(name).scenario(seed=0).requests)


def test_conditional_rates_refuse_growing_rates() -> None:
    assert conditional_rates((0.5, 0.25)) == (0.5, 0.5)
    with pytest.raises(WorkloadError, match=r"acceptance_rates\[1\]"):
        conditional_rates((0.4, 0.6))


def test_arrivals() -> None:
    import random

    assert Arrivals("burst").steps(random.Random(0), 5) == [0] * 5
    steps = Arrivals("poisson", rate=2.0).steps(random.Random(0), 2000)
    assert steps == sorted(steps)
    # 2000 arrivals at 2 per step span about 1000 steps.
    assert 900 < steps[-1] < 1100
    bursty = Arrivals("gamma", rate=2.0, shape=0.3).steps(random.Random(0), 2000)
    assert 800 < bursty[-1] < 1200
    with pytest.raises(WorkloadError, match="rate"):
        Arrivals("poisson", rate=0).steps(random.Random(0), 3)


def test_lengths() -> None:
    import random

    rng = random.Random(0)
    lognormal = [Lengths("lognormal", 300, 0.9, 4, 1500).draw(rng) for _ in range(3000)]
    assert 250 < statistics.median(lognormal) < 350
    assert min(lognormal) >= 4 and max(lognormal) <= 1500
    zipf = [Lengths("zipf", 1.1, minimum=10, maximum=500).draw(rng) for _ in range(3000)]
    assert min(zipf) == 10 and max(zipf) <= 500
    assert zipf.count(10) > zipf.count(11) > zipf.count(20)  # heavier at the low ranks
    assert Lengths("fixed", 64).draw(rng) == 64
    with pytest.raises(WorkloadError, match="unknown kind"):
        Lengths("uniform", 3).draw(rng)


def test_the_command_writes_a_scenario() -> None:
    run = subprocess.run(
        [sys.executable, "-m", "dualbudget", "workload", "chat-poisson", "--seed", "2"],
        capture_output=True,
        text=True,
        check=True,
    )
    scenario = parse_scenario(json.loads(run.stdout))
    assert len(scenario.requests) == 256
    bad = subprocess.run(
        [sys.executable, "-m", "dualbudget", "workload", "nope"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert bad.returncode == 2 and "unknown workload 'nope'" in bad.stderr
    assert bad.stderr.count("\n") == 1
