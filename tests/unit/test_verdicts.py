"""No verdict without checked work: a fuzz passes only on live steps of every method it
covers, a crash is mirrored only where vLLM raises what the reference names, a vLLM the
adapter cannot drive is bad input naming its API, and ``check`` passes a stage only for
the work it names. Without vLLM: the adapter's seam is driven on stand-in classes."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from dualbudget.check import Verdict, fuzz_work, proofs_work
from dualbudget.integration import live as live_module
from dualbudget.integration.commands import verdict_of
from dualbudget.integration.detect import DETECTION_SCENARIOS, Detection, Failure
from dualbudget.integration.outcome import LIVE_ALONE_CRASH, FuzzResult, UnitRun
from dualbudget.integration.vllm_api import (
    ANY,
    AdapterFailure,
    LacksField,
    MayLack,
    adapter_failure_of,
    construct,
)
from dualbudget.reference.violations import VLLM_CRASHES, raised_as


def _unit(layout: str, steps: int, tmp_path: Path, **fields: Any) -> UnitRun:
    run = UnitRun("vllm-0.33", layout, "mixed", 1, tmp_path, frozenset())
    run.examples = 1 if steps else 0
    run.steps = steps
    for name, value in fields.items():
        setattr(run, name, value)
    return run


def _result(*units: UnitRun, monitor_only: bool = False) -> FuzzResult:
    result = FuzzResult(profile="vllm-0.33", vllm_version="0.33.0", monitor_only=monitor_only)
    for unit in units:
        result.merge(unit)
    return result


# -- the fuzz's verdict ---------------------------------------------------------------------
def test_a_run_that_checked_no_step_is_bad_input_naming_its_first_error(tmp_path: Path) -> None:
    unit = _unit("eagle", 0, tmp_path, examples=4)
    unit.mirrored_crashes = {LIVE_ALONE_CRASH: 4}
    unit.crash_scenarios = {LIVE_ALONE_CRASH: "crash.json"}
    code, verdict = verdict_of(_result(unit), ["eagle"], gate=False, new_crashes=[])
    assert code == 2
    assert verdict.startswith("ERROR: nothing checked (0 live steps in 4 examples)")
    assert "vLLM crashed, the first in crash.json" in verdict


def test_every_method_covered_needs_checked_steps(tmp_path: Path) -> None:
    result = _result(_unit("eagle", 12, tmp_path), _unit("dflash", 0, tmp_path, examples=2))
    code, verdict = verdict_of(result, ["eagle", "dflash"], gate=False, new_crashes=[])
    assert (code, verdict) == (1, "FAIL: no live step checked for dflash")


def test_a_pass_names_its_steps_and_methods(tmp_path: Path) -> None:
    result = _result(_unit("eagle", 12, tmp_path), _unit("ngram", 3, tmp_path))
    code, verdict = verdict_of(result, ["eagle", "ngram"], gate=False, new_crashes=[])
    assert code == 0
    assert verdict.startswith(
        "PASS: live vLLM and the reference agree on all 15 live steps of 2 methods"
    )


def test_vllm_crashing_alone_is_never_mirrored(tmp_path: Path) -> None:
    unit = _unit("eagle", 7, tmp_path)
    unit.mirrored_crashes = {LIVE_ALONE_CRASH: 1}
    unit.crash_scenarios = {LIVE_ALONE_CRASH: "crash.json"}
    code, verdict = verdict_of(
        _result(unit, monitor_only=True), ["eagle"], gate=False, new_crashes=[]
    )
    assert (code, verdict) == (1, "FAIL: vLLM failed on 1 examples with no reference beside it")


def test_alone_a_method_this_vllm_never_builds_is_named_not_passed(tmp_path: Path) -> None:
    refused = _unit("dflash", 0, tmp_path)
    refused.refuse("live: vLLM has no dflash")
    result = _result(_unit("eagle", 9, tmp_path), refused, monitor_only=True)
    code, verdict = verdict_of(result, ["eagle", "dflash"], gate=False, new_crashes=[])
    assert code == 0
    assert verdict.endswith(
        "(9 live steps of 1 methods; not built by this vLLM: dflash (live: vLLM has no dflash))"
    )
    # Beside the reference the same refusal leaves a method unchecked: no pass.
    lockstep = _result(_unit("eagle", 9, tmp_path), refused)
    assert verdict_of(lockstep, ["eagle", "dflash"], gate=False, new_crashes=[])[0] == 1


def test_alone_the_gate_asks_only_what_vllms_own_state_shows(tmp_path: Path) -> None:
    alone = _result(_unit("eagle", 9, tmp_path), monitor_only=True)
    required = alone.required("eagle")
    assert required and set(required) <= {
        "chunked_prefill",
        "preemption",
        "padded_decode",
        "rejected_drafts",
        "async_in_flight",
    }
    assert "prefix_hit" in _result(_unit("eagle", 9, tmp_path)).required("eagle")
    code, verdict = verdict_of(alone, ["eagle"], gate=True, new_crashes=[])
    assert code == 1 and verdict.startswith("FAIL: coverage at zero for eagle:")


# -- what the reference names a mirrored crash ------------------------------------------
def _raised_in(path: str, exc: BaseException) -> BaseException:
    """``exc`` as raised by code compiled under the file name ``path``."""
    code = compile("raise exc", path, "exec")
    try:
        exec(code, {"exc": exc})
    except BaseException as err:
        return err
    raise AssertionError("unreachable")


def test_a_crash_is_mirrored_only_where_vllm_raises_what_the_reference_names() -> None:
    site = "/venv/lib/python3.11/site-packages/vllm/v1/core/block_pool.py"
    assert raised_as(_raised_in(site, ValueError("no blocks")), "pool-short-of-counted-blocks")
    # Another exception, or the same one raised elsewhere, is vLLM failing otherwise.
    assert not raised_as(_raised_in(site, KeyError("x")), "pool-short-of-counted-blocks")
    scheduler = "/tree/vllm/v1/core/sched/scheduler.py"
    assert not raised_as(_raised_in(scheduler, ValueError()), "pool-short-of-counted-blocks")
    assert raised_as(_raised_in(scheduler, AssertionError()), "negative-output-placeholders")
    assert not raised_as(ValueError("never raised"), "pool-short-of-counted-blocks")
    assert set(VLLM_CRASHES) >= {"pool-short-of-counted-blocks", "negative-output-placeholders"}


# -- the adapter's seam ------------------------------------------------------------------
@dataclasses.dataclass
class _Output:
    """A stand-in for a vLLM constructor: one required field, one defaulted."""

    req_ids: list[str]
    sampled_token_ids: list[list[int]] = dataclasses.field(default_factory=list)


def test_a_field_the_installed_class_lacks_is_left_out_only_when_it_means_nothing() -> None:
    built = construct(_Output, req_ids=["a"], req_id_to_index=MayLack({"a": 0}, ANY))
    assert built == _Output(["a"])
    assert construct(_Output, req_ids=["a"], retention=MayLack(None)) == _Output(["a"])
    with pytest.raises(
        LacksField, match=r"_Output has no field 'retention' \(this config sets it to 4\)"
    ):
        construct(_Output, req_ids=["a"], retention=MayLack(4))


def test_a_field_the_adapter_needs_and_vllm_lacks_names_it() -> None:
    with pytest.raises(AdapterFailure, match="_Output takes no 'sampled_ids'"):
        construct(_Output, req_ids=["a"], sampled_ids=[[1]])
    with pytest.raises(AdapterFailure, match="_Output requires 'req_ids', which the adapter"):
        construct(_Output, sampled_token_ids=[[1]])


def test_an_error_inside_vllm_is_vllms_and_one_in_the_adapter_is_the_adapters() -> None:
    def inside_vllm(**_: Any) -> None:
        raise TypeError("vLLM's own")

    with pytest.raises(TypeError, match="vLLM's own") as caught:
        construct(inside_vllm)
    assert adapter_failure_of(caught.value) is None
    # An attribute read in the adapter's own module (its frame's file is live.py).
    adapter = str(Path(live_module.__file__).resolve())
    try:
        eval(compile("output.scheduled_spec_decode_tokens", adapter, "eval"), {"output": 0})
    except AttributeError as err:
        failure = adapter_failure_of(err, "ScheduleStep")
    assert failure is not None
    assert "the adapter cannot drive the installed vLLM: AttributeError" in str(failure)
    assert "scheduled_spec_decode_tokens" in str(failure) and "live.py" in str(failure)


# -- detection's nearest profile ---------------------------------------------------------
def test_no_match_names_the_profile_followed_longest() -> None:
    early, late = DETECTION_SCENARIOS[0].name, DETECTION_SCENARIOS[5].name
    found = Detection(
        None,
        "0.31.0",
        "decisions",
        failures={
            "vllm-0.32": Failure(early, "decision at step 0"),
            "vllm-0.33": Failure(late, "decision at step 3: reference a, live b"),
        },
    )
    assert found.nearest() == (
        "vllm-0.33",
        Failure(late, "decision at step 3: reference a, live b"),
    )
    assert found.nearest_verdict() == (
        f"FAIL: vLLM 0.31.0 decides as no profile; nearest vllm-0.33, which it first departs"
        f" from on {late}: decision at step 3: reference a, live b"
    )
    assert json.loads(json.dumps(found.to_json()))["nearest"]["profile"] == "vllm-0.33"


# -- check's rows -------------------------------------------------------------------------
def test_a_stage_that_checked_nothing_is_no_pass(tmp_path: Path) -> None:
    proofs, fuzz = tmp_path / "prove.json", tmp_path / "fuzz.json"
    proofs.write_text(json.dumps({"obligations": [{}, {}]}))
    fuzz.write_text(json.dumps({"steps": 0, "steps_by_method": {}}))
    verdict = Verdict()
    verdict.stage("proofs", lambda: 0, "", lambda: proofs_work(proofs))
    verdict.stage("fuzz", lambda: 0, "", lambda: fuzz_work(fuzz))
    assert [row[1] for row in verdict.rows] == ["PASS", "FAIL"]
    assert verdict.rows[0][2].startswith("checked 2 obligations; exit 0")
    assert verdict.rows[1][2].startswith("checked nothing; exit 0")
    assert (verdict.ok, verdict.exit_code) == (False, 1)
    fuzz.write_text(json.dumps({"steps": 40, "steps_by_method": {"eagle": 40, "ngram": 0}}))
    again = Verdict()
    again.stage("fuzz", lambda: 0, "", lambda: fuzz_work(fuzz))
    assert again.rows[0][1] == "PASS" and "checked 40 live steps of 1 methods" in again.rows[0][2]
    assert again.exit_code == 0


def test_checks_exit_code_is_its_worst_stages() -> None:
    verdict = Verdict()
    verdict.stage("proofs", lambda: 0, "", lambda: "3 obligations")
    verdict.fail("fuzz", "checked nothing; the adapter cannot drive the installed vLLM", 2)
    assert verdict.exit_code == 2
    assert Verdict().exit_code == 1  # no stage ran: nothing passed


def test_a_method_no_example_of_which_ran_is_named_not_counted(tmp_path: Path) -> None:
    # Fewer examples than methods: the last method's share is none.
    result = _result(_unit("eagle", 12, tmp_path))
    code, verdict = verdict_of(result, ["eagle", "dflash"], gate=False, new_crashes=[])
    assert code == 0
    assert "all 12 live steps of 1 methods; no example ran of dflash" in verdict
