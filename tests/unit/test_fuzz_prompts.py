"""Token ids under prefix caching, without vLLM: the scenario format carries prompts' ids,
the driver gives the events the ids both schedulers see, and the fuzz's prompts share
prefixes the way served traffic does (a system prompt, documents, repeats, later turns)."""

from __future__ import annotations

import dataclasses

import hypothesis.strategies as st
import pytest
from hypothesis import given, settings

from dualbudget.integration.prompts import PROMPT_KINDS, draw_prompt_ids, prompt_ids_of
from dualbudget.reference.events import AddRequest, ModelOutput
from dualbudget.reference.formats.scenario import (
    Acceptance,
    RequestSpec,
    Scenario,
    ScenarioError,
    parse_scenario,
    scenario_to_json,
)
from dualbudget.reference.runs.driver import EventDriver, ScenarioRun
from dualbudget.reference.token_ids import (
    FIRST_ID,
    STOP_TOKEN_ID,
    VOCAB_SIZE,
    output_token_id,
    sampled_token_ids,
    segment,
    unique_prompt,
)
from dualbudget.spec.config import EngineConfig, SpeculativeConfig
from dualbudget.spec.methods import layout_named


def _config(prefix_caching: bool) -> EngineConfig:
    return EngineConfig(
        max_num_batched_tokens=32,
        max_num_seqs=4,
        max_model_len=32,
        block_size=4,
        num_gpu_blocks=40,
        speculative_config=SpeculativeConfig.for_layout(layout_named("draft-model"), 2),
        enable_prefix_caching=prefix_caching,
    )


def _scenario(prefix_caching: bool) -> Scenario:
    shared = segment("system", 9)
    return Scenario(
        "vllm-0.32",
        _config(prefix_caching),
        (
            RequestSpec("a", 9, 4, prompt_token_ids=shared),
            RequestSpec("b", 9, 4, arrival_step=2, prompt_token_ids=shared),
            RequestSpec("c", 5, 3, arrival_step=2),
        ),
        Acceptance(fixed=1),
        stops={3: {"b": 1}},
    )


def test_a_scenario_with_ids_and_prefix_caching_reads_back_equal() -> None:
    scenario = _scenario(True)
    obj = scenario_to_json(scenario)
    assert obj["config"]["enable_prefix_caching"] is True
    assert obj["requests"][0]["prompt_token_ids"] == list(segment("system", 9))
    assert "prompt_token_ids" not in obj["requests"][2]
    assert parse_scenario(obj) == scenario


def test_a_scenario_without_prefix_caching_is_written_as_before() -> None:
    obj = scenario_to_json(
        dataclasses.replace(_scenario(False), requests=(RequestSpec("a", 3, 2),))
    )
    assert "enable_prefix_caching" not in obj["config"]
    assert set(obj["requests"][0]) == {"id", "prompt_len", "max_tokens", "arrival_step", "priority"}


@pytest.mark.parametrize(
    ("ids", "message"),
    [
        ([21, 22], "requests[0].prompt_token_ids: has 2 ids, but prompt_len is 3"),
        ([21, -1, 22], "requests[0].prompt_token_ids[1]: must be >= 0"),
        ("abc", "requests[0].prompt_token_ids: must be a list, got 'abc'"),
    ],
)
def test_bad_prompt_ids_are_refused_by_field(ids: object, message: str) -> None:
    obj = scenario_to_json(dataclasses.replace(_scenario(True), requests=(RequestSpec("a", 3, 2),)))
    obj["requests"][0]["prompt_token_ids"] = ids
    with pytest.raises(ScenarioError, match=message.replace("[", r"\[").replace("]", r"\]")):
        parse_scenario(obj)


def _events(scenario: Scenario) -> list[object]:
    run = ScenarioRun(scenario)
    return [event for step in run.steps() for event in step.events]


def test_the_driver_gives_every_event_its_ids_with_prefix_caching_on() -> None:
    events = _events(_scenario(True))
    adds = {e.request_id: e for e in events if isinstance(e, AddRequest)}
    assert adds["a"].prompt_token_ids == adds["b"].prompt_token_ids == segment("system", 9)
    # A request given no ids gets ids of its own.
    assert adds["c"].prompt_token_ids == unique_prompt("c", 5)
    outputs = [e for e in events if isinstance(e, ModelOutput)]
    assert outputs
    for output in outputs:
        assert set(output.token_ids) == {r for r, n in output.num_sampled.items() if n > 0}
        for rid, ids in output.token_ids.items():
            assert ids == sampled_token_ids(
                rid, output.num_sampled[rid], output.stopped.get(rid, 0)
            )
    stopped = [o for o in outputs if o.stopped]
    assert stopped and stopped[0].token_ids["b"][0] == STOP_TOKEN_ID


def test_the_driver_gives_no_ids_with_prefix_caching_off() -> None:
    events = _events(_scenario(False))
    assert all(e.prompt_token_ids is None for e in events if isinstance(e, AddRequest))
    assert all(not e.token_ids for e in events if isinstance(e, ModelOutput))


def test_a_run_written_back_carries_its_prompts_ids() -> None:
    scenario = _scenario(True)
    driver = EventDriver.of(scenario)
    assert parse_scenario(scenario_to_json(driver.scenario(0))).requests[0].prompt_token_ids == (
        segment("system", 9)
    )


def test_sampled_ids_are_the_request_s_own_but_the_stop() -> None:
    assert sampled_token_ids("7", 3) == (output_token_id("7"),) * 3
    assert sampled_token_ids("7", 3, 2) == (
        output_token_id("7"),
        STOP_TOKEN_ID,
        output_token_id("7"),
    )
    for ids in (segment("x", 50), unique_prompt("y", 50), (output_token_id("z"),)):
        assert all(FIRST_ID <= i < VOCAB_SIZE and i != STOP_TOKEN_ID for i in ids)
    assert segment("x", 50)[:20] == segment("x", 20)  # a shorter prompt shares the prefix


@settings(max_examples=200, database=None, deadline=None)
@given(data=st.data(), block_size=st.sampled_from([2, 4, 8]), max_model_len=st.integers(8, 64))
def test_the_fuzz_s_prompts_share_prefixes_and_fit(
    data: st.DataObject, block_size: int, max_model_len: int
) -> None:
    config = dataclasses.replace(_config(True), block_size=block_size, max_model_len=max_model_len)
    earlier: list[RequestSpec] = []
    for i in range(6):
        prompt_len = data.draw(st.integers(1, max_model_len - 1))
        ids = draw_prompt_ids(data, config, earlier, prompt_len)
        assert 1 <= len(ids) < max_model_len
        assert all(FIRST_ID <= t < VOCAB_SIZE for t in ids)
        earlier.append(
            RequestSpec(str(i), len(ids), data.draw(st.integers(1, 16)), prompt_token_ids=ids)
        )


def test_every_prompt_kind_is_drawn_and_each_shares_what_it_says() -> None:
    """Each kind's ids, by the draws that pick it: a repeat is the earlier prompt (or its
    full-hit cut), a turn starts with the earlier prompt and its output id."""
    config = _config(True)
    earlier = [RequestSpec("0", 10, 5, prompt_token_ids=segment("own:0", 10))]
    seen: dict[str, tuple[int, ...]] = {}

    @settings(max_examples=300, database=None, deadline=None)
    @given(data=st.data())
    def draw(data: st.DataObject) -> None:
        ids = draw_prompt_ids(data, config, earlier, 10)
        first = prompt_ids_of(earlier[0])
        if ids[:9] == first[:9] and len(ids) in (9, 10) and ids == first[: len(ids)]:
            seen["repeat"] = ids
        elif ids[:10] == first and len(ids) > 10 and ids[10] == output_token_id("0"):
            seen["turn"] = ids
        elif ids[:1] == segment("system", 1):
            seen["system"] = ids
        elif ids[:1] in (segment("document:0", 1), segment("document:1", 1)):
            seen["document"] = ids
        elif ids == segment("own:1", len(ids)):
            seen["fresh"] = ids
        if len(ids) > config.block_size and (len(ids) - 1) % config.block_size == 0:
            seen["full-hit length"] = ids

    draw()
    assert set(seen) == {*PROMPT_KINDS, "full-hit length"}
