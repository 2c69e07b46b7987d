"""``dualbudget schedule`` through the real command line: output, findings, bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from dualbudget.reference.formats.scenario import load_scenario, parse_scenario, scenario_to_json
from tests.paths import REPO

EXAMPLES = sorted((REPO / "examples").glob("*.json"))
RECORD_KEYS = {
    "step",
    "num_scheduled_tokens",
    "target_tokens",
    "draft_rows",
    "scheduled_spec_tokens",
    "preempted",
    "finished",
    "budgets_left",
}


def schedule(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dualbudget", "schedule", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def base() -> dict[str, Any]:
    return {
        "format": "dualbudget-scenario",
        "version": 1,
        "profile": "vllm-0.32",
        "config": {
            "max_num_batched_tokens": 20,
            "max_num_seqs": 16,
            "max_model_len": 64,
            "block_size": 16,
            "num_gpu_blocks": 64,
            "speculative_config": {
                "method": "eagle3",
                "num_speculative_tokens": 4,
                "parallel_drafting": True,
            },
        },
        "requests": [
            {"id": "0", "prompt_len": 10, "max_tokens": 6},
            {"id": "1", "prompt_len": 10, "max_tokens": 6},
        ],
        "acceptance": {"fixed": 2},
    }


def write(tmp_path: Path, obj: Any) -> str:
    path = tmp_path / "scenario.json"
    path.write_text(obj if isinstance(obj, str) else json.dumps(obj))
    return str(path)


@pytest.mark.parametrize("example", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_examples_print_step_records(example: Path) -> None:
    done = schedule(str(example))
    assert done.returncode == 0, done.stderr
    records = [json.loads(line) for line in done.stdout.splitlines()]
    assert records and all(set(r) >= RECORD_KEYS for r in records)
    assert [r["step"] for r in records] == list(range(len(records)))
    finished = [rid for r in records for rid in r["finished"]]
    assert sorted(finished) == sorted(r.id for r in load_scenario(example).requests)


def test_upstream_example_first_step() -> None:
    done = schedule(str(REPO / "examples" / "upstream-p-eagle.json"), "--max-steps", "1")
    assert done.returncode == 0
    lines = done.stdout.splitlines()
    assert len(lines) == 1
    assert json.loads(lines[0])["num_scheduled_tokens"] == {"0": 10, "1": 4}


def test_profile_option_overrides_the_scenario(tmp_path: Path) -> None:
    # Under dual the P-EAGLE rows are charged C(q) = q + 3, so the first step is the same
    # {10, 4}; under global-reserve S' = 20 - 16 * 3 < 0 is refused (exit 2).
    path = write(tmp_path, base())
    done = schedule(path, "--profile", "dual", "--max-steps", "1")
    assert json.loads(done.stdout)["num_scheduled_tokens"] == {"0": 10, "1": 4}
    refused = schedule(path, "--profile", "global-reserve")
    assert refused.returncode == 2
    assert "max_num_batched_tokens" in refused.stderr


def test_a_contract_violation_exits_1_after_its_record(tmp_path: Path) -> None:
    obj = base()
    obj["config"]["max_num_seqs"] = 5
    obj["config"]["speculative_config"] = {
        "method": "dspark",
        "num_speculative_tokens": 4,
        "dspark_layout": "fill-in",
    }
    obj["requests"] = [{"id": str(i), "prompt_len": 2, "max_tokens": 3} for i in range(5)]
    obj["drafts"] = {"fixed": 0}
    done = schedule(write(tmp_path, obj))
    assert done.returncode == 1
    assert [json.loads(line)["step"] for line in done.stdout.splitlines()] == [0, 1]
    assert "C3" in done.stderr and "step 1" in done.stderr
    assert "Traceback" not in done.stderr


def test_to_json_round_trips() -> None:
    for example in EXAMPLES:
        sc = load_scenario(example)
        assert parse_scenario(json.loads(json.dumps(scenario_to_json(sc)))) == sc


def _edit(path: str, value: Any) -> Any:
    """base() with the key at ``path`` (dots, list indexes) set to ``value``."""
    obj = base()
    *parents, last = path.split(".")
    node: Any = obj
    for key in parents:
        node = node[int(key)] if key.isdigit() else node[key]
    node[int(last) if last.isdigit() else last] = value
    return obj


BAD = {
    "malformed-json": ('{"profile": "vllm-0.32", "config": {', "malformed JSON"),
    "unknown-method": (
        _edit("config.speculative_config.method", "medusa"),
        "speculative_config.method",
    ),
    "unknown-profile": (_edit("profile", "vllm-9"), "profile"),
    "k-zero": (
        _edit("config.speculative_config.num_speculative_tokens", 0),
        "num_speculative_tokens",
    ),
    "zero-budget": (_edit("config.max_num_batched_tokens", 0), "max_num_batched_tokens"),
    "negative-budget": (_edit("config.max_num_seqs", -3), "max_num_seqs"),
    "negative-cap": (_edit("config.max_num_scheduled_tokens", -1), "max_num_scheduled_tokens"),
    # vLLM 0.32 VllmConfig: B must exceed the draft slots (PARD, K = 4: 4 slots).
    "profile-rejects": (
        _edit(
            "config",
            {
                **base()["config"],
                "max_num_batched_tokens": 4,
                "max_num_seqs": 4,
                "speculative_config": {
                    "method": "draft_model",
                    "num_speculative_tokens": 4,
                    "parallel_drafting": True,
                },
            },
        ),
        "max_num_new_slots_for_drafting",
    ),
    "prompt-too-long": (_edit("requests.1.prompt_len", 64), "requests[1].prompt_len"),
    "duplicate-id": (_edit("requests.1.id", "0"), "requests[1].id"),
    "unknown-key": (_edit("config.max_num_batched_token", 20), "config.max_num_batched_token"),
    "kv-pool-too-small": (_edit("config.num_gpu_blocks", 4), "num_gpu_blocks"),
    "bad-acceptance": (_edit("acceptance", {"fixed": 1, "explicit": {}}), "acceptance"),
}


@pytest.mark.parametrize(("content", "field"), BAD.values(), ids=list(BAD))
def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, content: Any, field: str) -> None:
    done = schedule(write(tmp_path, content))
    assert done.returncode == 2
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert "Traceback" not in done.stderr
    assert field in lines[0]
    assert done.stdout == ""


def test_missing_file_is_bad_input(tmp_path: Path) -> None:
    done = schedule(str(tmp_path / "nope.json"))
    assert done.returncode == 2
    assert len(done.stderr.splitlines()) == 1


def test_a_stall_exits_1_naming_c4(tmp_path: Path) -> None:
    # Chunked prefill off and an 18-token prompt against an empty-step room of 17.
    obj = base()
    obj["config"].update(max_model_len=20, enable_chunked_prefill=False)
    obj["requests"] = [{"id": "r", "prompt_len": 18, "max_tokens": 2}]
    done = schedule(write(tmp_path, obj))
    assert done.returncode == 1
    assert "C4" in done.stderr and "stalled at step 0" in done.stderr
    assert len(done.stderr.splitlines()) == 1
