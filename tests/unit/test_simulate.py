"""The simulator's step counts and statistics on small workloads worked by hand, and the
``dualbudget simulate`` command line (exit codes, the ``--json`` schema)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dualbudget import TRACES
from dualbudget.cli import main
from dualbudget.reference.formats.scenario import Scenario, parse_scenario
from dualbudget.reference.runs.simulate import (
    StepTimeModel,
    dist,
    percentile,
    simulate,
    to_json,
)
from dualbudget.reference.runs.workload import preset
from dualbudget.reference.scheduler import OBSERVED, PREFIX_OBSERVED
from dualbudget.reference.token_ids import segment


def scenario_json(
    requests: list[tuple[int, int]],
    budget: int,
    *,
    spec: dict[str, Any] | None = None,
    accepted: int = 0,
    profile: str = "dual",
) -> dict[str, Any]:
    config: dict[str, Any] = {
        "max_num_batched_tokens": budget,
        "max_num_seqs": 4,
        "max_model_len": 64,
        "block_size": 4,
        "num_gpu_blocks": 64,
    }
    if spec is not None:
        config["speculative_config"] = spec
    return {
        "profile": profile,
        "config": config,
        "requests": [
            {"id": str(i), "prompt_len": p, "max_tokens": m} for i, (p, m) in enumerate(requests)
        ],
        "acceptance": {"fixed": accepted},
    }


def scenario(*args: Any, **kwargs: Any) -> Scenario:
    return parse_scenario(scenario_json(*args, **kwargs))


DSPARK3 = {"method": "dspark", "num_speculative_tokens": 3}


def test_percentiles_are_nearest_rank() -> None:
    assert percentile([4, 1, 3, 2], 50) == 2  # ceil(0.5 * 4) = 2nd smallest
    assert percentile(list(range(1, 101)), 99) == 99
    assert percentile([7], 99) == 7
    assert dist([1, 2, 3, 10]) == {"mean": 4.0, "p50": 2, "p99": 10, "max": 10}


def test_one_request_without_drafts() -> None:
    # prompt 4, 3 outputs, B = 8, no speculative decoding:
    # step 0: the whole prompt, q = 4, samples output 1   (first output: TTFT 1 step)
    # step 1: q = 1, output 2
    # step 2: q = 1, output 3 = max_tokens: finished
    # step 3: nothing scheduled; vLLM steps once more to report the finished id
    r = simulate(scenario([(4, 3)], 8), "dual")
    assert r.steps == 4
    assert r.target_per_step == [4, 1, 1, 0]
    assert r.draft_per_step == [0, 0, 0, 0]
    assert r.requests_per_step == [1, 1, 1, 0]
    assert r.ttft_steps() == [1]
    assert r.first_scheduled_steps() == [0]
    assert r.steps_per_output_token() == [1.0]  # outputs at steps 0..2: 2 steps / 2 tokens
    assert r.output_tokens == 3
    assert r.peak_rows == 4
    assert r.violations == [] and r.stall is None


def test_chunked_prefill_delays_the_first_token() -> None:
    # prompt 10 in a budget of 4: chunks 4, 4, 2 (the last one samples output 1, so
    # TTFT = step 2 - arrival 0 + 1 = 3 steps), then q = 1 for output 2, then the report step.
    r = simulate(scenario([(10, 2)], 4), "dual")
    assert r.target_per_step == [4, 4, 2, 1, 0]
    assert r.ttft_steps() == [3]
    assert r.summary()["ttft_steps"] == {"mean": 3.0, "p99": 3}


def test_accepted_drafts_cut_steps_per_token() -> None:
    # ngram K = 2 (no draft forward: D = 0), every draft accepted. prompt 4, 7 outputs:
    # step 0: q = 4 -> output 1; step 1: q = 1 + 2 = 3, 3 sampled -> 4;
    # step 2: q = 3 -> 7 = max_tokens; step 3: the report step.
    r = simulate(
        scenario([(4, 7)], 16, spec={"method": "ngram", "num_speculative_tokens": 2}, accepted=2),
        "dual",
    )
    assert r.target_per_step == [4, 3, 3, 0]
    assert r.draft_per_step == [0, 0, 0, 0]
    assert r.output_tokens == 7
    assert r.steps_per_output_token() == [pytest.approx(1 / 3)]  # steps 0..2 over 6 tokens


@pytest.mark.parametrize("profile", ["vllm-0.32", "vllm-0.33", "dual"])
def test_dspark_rows_when_the_budget_is_loose(profile: str) -> None:
    # dspark anchor layout, K = 3: C(q) = K = 3 draft rows per scheduled request.
    # Two requests, prompt 2, 2 outputs, B = 16 (no policy binds):
    # step 0: prefill q = 2 each: T = 4, D = 2 * 3 = 6
    # step 1: q = 1 + 3 drafts each: T = 8, D = 6; output 2 each (nothing accepted)
    # step 2: the report step.
    r = simulate(scenario([(2, 2), (2, 2)], 16, spec=DSPARK3), profile)
    assert r.target_per_step == [4, 8, 0]
    assert r.draft_per_step == [6, 6, 0]
    assert r.peak_rows == 8


def test_vllm_032_reserve_costs_steps_on_dspark() -> None:
    # Four requests, prompt 1, 3 outputs, B = 16, dspark K = 3, nothing accepted.
    # vllm-0.32 reserves slots = K - 1 = 2 per request: cost q + 2, stop at budget <= 2.
    #   step 0: four prefills of q = 1: cost 4 * 3 = 12 <= 16; T = 4, D = 4 * 3 = 12
    #   step 1: decodes of q = 1 + 3 = 4 cost 6: r0 (16 -> 10), r1 (-> 4), r2 gets
    #           q = 4 - 2 = 2 (-> 0), r3 nothing: T = 4 + 4 + 2 = 10, D = 3 * 3 = 9
    #   step 2: the same: r0, r1, r2 reach 3 outputs; r3 still at 1
    #   steps 3, 4: r3 alone, q = 4, D = 3; step 5: the report step -> 6 steps
    #   r3's outputs at steps 0, 3, 4: 4 steps over 2 tokens.
    # vllm-0.33 and dual charge dspark no slots: 4 * 4 = 16 fits every decode step:
    #   T = 4, 16, 16, then the report step -> 4 steps.
    s = scenario([(1, 3)] * 4, 16, spec=DSPARK3)
    old = simulate(s, "vllm-0.32")
    assert old.steps == 6
    assert old.target_per_step == [4, 10, 10, 4, 4, 0]
    assert old.draft_per_step == [12, 9, 9, 3, 3, 0]
    assert old.requests_per_step == [4, 3, 3, 1, 1, 0]
    assert sorted(old.steps_per_output_token()) == [1.0, 1.0, 1.0, 2.0]
    for profile in ("vllm-0.33", "dual"):
        new = simulate(s, profile)
        assert new.steps == 4
        assert new.target_per_step == [4, 16, 16, 0]
        assert new.draft_per_step == [12, 12, 12, 0]
        assert new.output_tokens == old.output_tokens == 12


def test_time_model_and_json_schema() -> None:
    r = simulate(scenario([(4, 3)], 8), "dual")
    model = StepTimeModel(a=1.0, b=0.5, c=0.0)
    # step seconds: 1 + 0.5 * [4, 1, 1, 0] = 3, 1.5, 1.5, 1 -> ends 3, 4.5, 6, 7
    assert r.step_end_times(model) == [3.0, 4.5, 6.0, 7.0]
    t = r.timing(model)
    assert t["seconds"] == 7.0
    assert t["ttft_s_mean"] == 3.0  # first output at the end of step 0
    assert t["itl_s_mean"] == 1.5  # (6 - 3) / 2
    assert t["output_tokens_per_s"] == pytest.approx(3 / 7)
    doc = to_json("w", [r])
    assert set(doc) == DOCUMENT_KEYS
    assert set(doc["profiles"][0]) == SCHEMA_KEYS


DOCUMENT_KEYS = {"workload", "calibration", "enable_prefix_caching", "profiles"}
SCHEMA_KEYS = {
    "profile",
    "steps",
    "requests_per_step",
    "target_tokens_per_step",
    "draft_rows_per_step",
    "peak_rows",
    "ttft_steps",
    "output_tokens",
    "seconds",
    "tokens_per_s",
    "prefix_cache",
}
PREFIX_KEYS = {
    "hit_tokens",
    "prompt_tokens",
    "hit_rate",
    "requests",
    "requests_with_hit",
    "events",
}


def test_cli_simulate_writes_the_issue_schema(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "s.json"
    path.write_text(json.dumps(scenario_json([(1, 3)] * 4, 16, spec=DSPARK3)))
    out = tmp_path / "out.json"
    code = main(["simulate", "--scenario", str(path), "--json", str(out), "--jobs", "2"])
    assert code == 0
    doc = json.loads(out.read_text())
    assert set(doc) == DOCUMENT_KEYS
    assert doc["enable_prefix_caching"] is False
    assert [p["profile"] for p in doc["profiles"]] == ["vllm-0.32", "vllm-0.33", "dual"]
    for p in doc["profiles"]:
        assert set(p) == SCHEMA_KEYS
        for key in ("requests_per_step", "target_tokens_per_step", "draft_rows_per_step"):
            assert set(p[key]) == {"mean", "p50", "p99", "max"}
        assert set(p["ttft_steps"]) == {"mean", "p99"}
        assert set(p["prefix_cache"]) == PREFIX_KEYS
        assert set(p["prefix_cache"]["events"]) == set(PREFIX_OBSERVED)
    assert [p["steps"] for p in doc["profiles"]] == [6, 4, 4]
    text = capsys.readouterr().out
    assert "ratio steps" in text and "0.667" in text  # 4 / 6
    assert "only as good as the coefficients" in text


def test_cli_simulate_overrides_and_profile(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    path.write_text(json.dumps(scenario_json([(1, 3)] * 4, 16, spec=DSPARK3)))
    out = tmp_path / "out.json"
    # B = 32: the 0.32 reserve no longer binds, four steps like the others.
    code = main(
        [
            "simulate",
            "--scenario",
            str(path),
            "--profile",
            "vllm-0.32",
            "--max-num-batched-tokens",
            "32",
            "--json",
            str(out),
        ]
    )
    assert code == 0
    assert json.loads(out.read_text())["profiles"][0]["steps"] == 4


@pytest.mark.parametrize(
    "extra",
    [
        ["--profile", "no-such-profile"],
        ["--speculative-config", "{not json"],
        ["--speculative-config", '{"method": "nope", "num_speculative_tokens": 2}'],
        ["--max-num-batched-tokens", "0"],
        ["--step-time-a", "-1"],
    ],
)
def test_cli_simulate_bad_input_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str]
) -> None:
    path = tmp_path / "s.json"
    path.write_text(json.dumps(scenario_json([(4, 3)], 8)))
    assert main(["simulate", "--scenario", str(path), *extra]) == 2
    err = capsys.readouterr().err
    assert err.startswith("dualbudget simulate: error:") and err.count("\n") == 1


def test_cli_simulate_missing_scenario_exits_2(tmp_path: Path) -> None:
    assert main(["simulate", "--scenario", str(tmp_path / "missing.json")]) == 2
    assert main(["simulate", "--workload", "no-such-preset"]) == 2


SHARED = segment("test-simulate:shared", 8)
PREFIX_SCENARIO: dict[str, Any] = {
    # block_size 4, no drafts, a loose budget. r0: 8 shared ids + 1, arrives at step 0;
    # at step 1 r1 (the 8 shared ids + 2 of its own) and r2 (r0's prompt again) arrive.
    # Step 0 schedules r0's 9 prompt tokens and caches its 2 full blocks (the shared ids).
    # Step 1: r0 decodes 1; r1 hits both blocks, which r0 holds (8 tokens, 2 left to
    # compute); r2's 2 full blocks hit too, 8 = num_tokens - 1: a full hit, one token.
    # Hits: 16 of 28 prompt tokens, 2 of 3 requests. Without caching r1 and r2 prefill.
    "profile": "vllm-0.33",
    "config": {
        "max_num_batched_tokens": 32,
        "max_num_seqs": 4,
        "max_model_len": 64,
        "block_size": 4,
        "num_gpu_blocks": 64,
        "enable_prefix_caching": True,
    },
    "requests": [
        {"id": "r0", "prompt_len": 9, "max_tokens": 3, "prompt_token_ids": [*SHARED, 30]},
        {
            "id": "r1", "prompt_len": 10, "max_tokens": 3, "arrival_step": 1,
            "prompt_token_ids": [*SHARED, 31, 32],
        },
        {
            "id": "r2", "prompt_len": 9, "max_tokens": 3, "arrival_step": 1,
            "prompt_token_ids": [*SHARED, 30],
        },
    ],
}  # fmt: skip


def test_prefix_hits_worked_by_hand() -> None:
    assert set(PREFIX_OBSERVED) <= set(OBSERVED)  # the scheduler's own counters, by name
    on = simulate(parse_scenario(PREFIX_SCENARIO), "vllm-0.33")
    assert on.target_per_step[:2] == [9, 1 + 2 + 1]
    stats = on.prefix
    assert (stats.requests, stats.requests_with_hit) == (3, 2)
    assert (stats.hit_tokens, stats.prompt_tokens) == (16, 28)
    assert stats.hit_rate == pytest.approx(16 / 28)
    assert stats.events["prefix_hit"] == 2
    assert stats.events["full_prefix_hit"] == 1
    assert stats.events["hit_on_running_block"] > 0
    assert stats.events["cached_block_evicted"] == stats.events["resume_rehit"] == 0
    off_json = {**PREFIX_SCENARIO, "config": {**PREFIX_SCENARIO["config"]}}
    off_json["config"]["enable_prefix_caching"] = False
    off = simulate(parse_scenario(off_json), "vllm-0.33")
    assert off.target_per_step[:2] == [9, 1 + 10 + 9]
    assert not off.prefix_caching
    assert off.prefix.to_json() == {
        "hit_tokens": 0,
        "prompt_tokens": 0,
        "hit_rate": 0.0,
        "requests": 0,
        "requests_with_hit": 0,
        "events": dict.fromkeys(PREFIX_OBSERVED, 0),
    }


@pytest.mark.parametrize(
    ("profile", "hits", "step_1", "full_hits"),
    [
        # 0.32, an eagle drafter: the last hit block is dropped. r1 and r2 each hit block 0
        # (4 tokens): step 1 is r0's decode 1 + 2 drafts, r1's 6 left, r2's 5 left.
        ("vllm-0.32", 4 + 4, 3 + 6 + 5, 0),
        # 0.33: each block's hash covers the next token too (1 lookahead), and a request
        # hashes num_tokens - 1 of its tokens: block 1 of r1 is followed by 31, r0's by 30,
        # so r1 hits block 0 only (6 left), r2 both (8 = num_tokens - 1: a full hit, one
        # token, padded to 1 + K = 3 while r0 decodes).
        ("vllm-0.33", 4 + 8, 3 + 6 + 3, 1),
    ],
)
def test_prefix_hits_per_release_under_eagle_and_async(
    profile: str, hits: int, step_1: int, full_hits: int
) -> None:
    # PREFIX_SCENARIO with EAGLE-3 K=2 and async scheduling: the releases hit differently.
    config = {
        **PREFIX_SCENARIO["config"],
        "async_scheduling": True,
        "speculative_config": {"method": "eagle3", "num_speculative_tokens": 2},
    }
    r = simulate(parse_scenario({**PREFIX_SCENARIO, "config": config}), profile)
    assert r.target_per_step[:2] == [9, step_1]
    assert (r.prefix.hit_tokens, r.prefix.prompt_tokens, r.prefix.requests_with_hit) == (
        hits,
        28,
        2,
    )
    assert r.prefix.events["full_prefix_hit"] == full_hits


def test_cli_simulate_the_system_prompt_preset_on_and_off(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # chat-system-prompt turns prefix caching on: every profile hits, in the table and the
    # JSON; --no-enable-prefix-caching turns it off: no hit, and the table says off.
    out = tmp_path / "on.json"
    argv = ["simulate", "--workload", "chat-system-prompt", "--quiet"]
    assert main([*argv, "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "enable_prefix_caching=True" in text.splitlines()[0]
    (with_hit,) = [line for line in text.splitlines() if line.startswith("requests with a hit")]
    doc = json.loads(out.read_text())
    assert doc["enable_prefix_caching"] is True
    for p in doc["profiles"]:
        prefix = p["prefix_cache"]
        assert prefix["requests"] == 256 and prefix["requests_with_hit"] > 0
        assert 0 < prefix["hit_tokens"] <= prefix["prompt_tokens"]
        assert prefix["hit_rate"] == prefix["hit_tokens"] / prefix["prompt_tokens"]
        assert prefix["events"]["prefix_hit"] >= prefix["requests_with_hit"]
        # The table's cells say the same.
        assert f"{prefix['hit_tokens']} / {prefix['prompt_tokens']}" in text
        assert f"{prefix['requests_with_hit']} / 256" in with_hit
    off = tmp_path / "off.json"
    assert main([*argv, "--no-enable-prefix-caching", "--json", str(off)]) == 0
    text = capsys.readouterr().out
    assert "enable_prefix_caching=False" in text.splitlines()[0]
    assert "prefix hit tokens / prompt  off" in text
    doc = json.loads(off.read_text())
    assert doc["enable_prefix_caching"] is False
    for p in doc["profiles"]:
        assert p["prefix_cache"]["hit_tokens"] == p["prefix_cache"]["requests_with_hit"] == 0
        assert p["prefix_cache"]["hit_rate"] == 0


C3_WITNESS = {
    # vllm-0.32 charges dspark fill-in K - 1 = 0 slots but the drafter reads K + 1 = 2 rows
    # per request: with B = 1, one prefill token gives T = 1, D = 2 > B (C3 broken, step 0).
    "profile": "vllm-0.32",
    "config": {
        "max_num_batched_tokens": 1,
        "max_num_seqs": 1,
        "max_model_len": 18,
        "block_size": 16,
        "num_gpu_blocks": 5,
        "speculative_config": {
            "method": "dspark",
            "num_speculative_tokens": 1,
            "parallel_drafting": True,
            "dspark_layout": "fill-in",
        },
    },
    "requests": [{"id": "r0", "prompt_len": 1, "max_tokens": 1}],
}


def test_a_broken_contract_is_recorded_not_raised() -> None:
    r = simulate(parse_scenario(C3_WITNESS), "vllm-0.32")
    assert r.peak_rows == 2 > r.budget == 1
    assert [(v["contract"], v["count"], v["first_step"]) for v in r.violations] == [("C3", 1, 0)]


def test_cli_says_a_profile_breaks_c3_and_which_refuse(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "w.json"
    path.write_text(json.dumps(C3_WITNESS))
    assert main(["simulate", "--scenario", str(path)]) == 0
    text = capsys.readouterr().out
    assert "CONTRACT C3 BROKEN under vllm-0.32" in text
    assert "REFUSED vllm-0.33" in text and "REFUSED dual" in text
    # Every profile refusing is bad input.
    assert main(["simulate", "--scenario", str(path), "--profile", "dual"]) == 2


def test_cli_report_quick_writes_the_document(tmp_path: Path) -> None:
    # --quick: no proofs, 64 requests per standard workload (a few seconds).
    assert main(["report", "--out", str(tmp_path), "--quick"]) == 0
    text = (tmp_path / "design-review.md").read_text()
    for heading in (
        "## The contract",
        "## Proof verdicts",
        "## Differential and trace-replay status",
        "### long-prompts",
        "### dspark-bench",
        "### chat-poisson",
    ):
        assert heading in text
    assert "**C6 dominance**" in text
    assert "all decisions agree" in text  # the bundled traces replay
    for name in ("long-prompts", "dspark-bench", "chat-poisson"):
        for plot in ("rows_per_step", "requests_per_step", "ttft"):
            assert (tmp_path / f"{name}-{plot}.png").stat().st_size > 0
            assert f"]({name}-{plot}.png)" in text
    assert "differential fuzz is **not in this document**" in text


def test_report_includes_a_fuzz_result_and_flags_vacuous_coverage(tmp_path: Path) -> None:
    from dualbudget.report import differential_lines

    fuzz = {
        "vllm_version": "0.32.0", "profile": "vllm-0.32", "examples": 9, "steps": 70,
        "divergences": [{"step": 4, "scenario": "d.json"}],
        "coverage": {"padded_decode": 3},
        "coverage_by_method": {"eagle": {"padded_decode": 3}, "dflash": {"padded_decode": 0}},
    }  # fmt: skip
    path = tmp_path / "fuzz.json"
    path.write_text(json.dumps(fuzz))
    lines = "\n".join(differential_lines(path))
    assert "vLLM 0.32.0 (profile vllm-0.32): 9 examples, 70 steps, 1 divergences" in lines
    assert "at zero (partly vacuous): dflash:padded_decode" in lines
    assert "divergence at step 4: scenario `d.json`" in lines
    path.write_text("{}")
    assert main(["report", "--out", str(tmp_path), "--quick", "--fuzz-json", str(path)]) == 2


def test_cli_simulate_refuses_a_trace_it_cannot_hit_on(capsys: pytest.CaptureFixture[str]) -> None:
    # A trace's requests carry no token ids: with the cache on, every request would get ids
    # of its own and no hit; refused by name, not simulated with silent zeros.
    trace = str(TRACES / "engine-ngram-k3-fcfs.ndjson")
    assert main(["simulate", "--trace", trace, "--enable-prefix-caching"]) == 2
    err = capsys.readouterr().err
    assert "--no-enable-prefix-caching" in err and err.count("\n") == 1
    assert main(["simulate", "--trace", trace, "--quiet", "--profile", "vllm-0.32"]) == 0


def test_cli_simulate_a_prefix_cached_trace_hits(tmp_path: Path) -> None:
    # A version-3 trace recorded with prefix caching: its requests get ids from vLLM's
    # block hashes (reference/formats/trace.py), so the what-if hits where vLLM's hashes matched.
    trace = str(TRACES / "engine-draft-model-k3-prefix.ndjson")
    on, off = tmp_path / "on.json", tmp_path / "off.json"
    argv = ["simulate", "--trace", trace, "--quiet", "--profile", "vllm-0.32"]
    assert main([*argv, "--json", str(on)]) == 0
    assert main([*argv, "--no-enable-prefix-caching", "--json", str(off)]) == 0
    hit = json.loads(on.read_text())["profiles"][0]["prefix_cache"]
    assert 0 < hit["hit_tokens"] < hit["prompt_tokens"] and hit["requests_with_hit"] > 0
    assert json.loads(off.read_text())["profiles"][0]["prefix_cache"]["hit_tokens"] == 0


@pytest.mark.live
def test_the_system_prompt_preset_runs_in_lockstep_with_vllm(profile: str) -> None:
    # The installed vLLM, prefix caching on, schedules the preset as the reference does
    # (the same hits, or the scheduled tokens would differ): 300 steps, hits from step 1 on.
    from dualbudget.integration.lockstep import run_in_lockstep
    from dualbudget.integration.testing import built_by_the_release

    scenario = built_by_the_release(preset("chat-system-prompt").scenario(seed=0), profile)
    steps, divergence = run_in_lockstep(scenario, max_steps=300)
    assert divergence is None, divergence.report()
    assert steps == 300
    assert simulate(scenario, profile, max_steps=300).prefix.hit_tokens > 0
