"""The command line of the fuzz, without vLLM: every flag of ``fuzz`` and ``check``
reaches its typed stage (a renamed flag fails here, not silently in ``check``), the
known findings come from the proofs' manifest, and one example count serves both."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from dualbudget import check as check_module
from dualbudget import fuzz_cli
from dualbudget.cli import build_parser, main, options_from
from dualbudget.integration import commands
from dualbudget.integration.commands import FUZZ_EXAMPLES, FUZZ_TOP_UP_ROUNDS
from dualbudget.proofs.commands import ProveOptions
from dualbudget.proofs.manifest import causes, expected_findings, outside_model_findings


def recorder(seen: list[Any]) -> Callable[[Any], int]:
    """A stand-in stage: keeps the options it is called with, exit code 0."""

    def stage(options: Any) -> int:
        seen.append(options)
        return 0

    return stage


def test_the_known_findings_are_the_manifests_per_step_ones() -> None:
    known = fuzz_cli.known_findings()
    assert ("vllm-0.32", "dspark-fill-in", "C3") in known
    assert ("vllm-0.32", "dflash", "C5") in known  # the contract monitor's
    checked = ("C1", "C2", "C3", "C4", "C5", "C7", "C8", "C9", "C10", "C11", "C12", "C13")
    proven = {key for key in expected_findings() if key[2] in checked}
    assert known == proven | outside_model_findings()
    assert fuzz_cli.step_checked() == checked
    # An admission stricter than needed (C4-converse) is no empty step.
    assert ("vllm-0.33", "ngram-parallel", "C4") in known
    # A C4 break elsewhere is known only by a cause outside the model (vLLM's padding, its
    # whole-prompt rule, multi-module MTP's reserve), and so only under a config that
    # meets its condition.
    on_eagle = [cause.name for cause in causes() if cause.key == ("vllm-0.33", "eagle", "C4")]
    assert on_eagle == [
        "outside_model.padding-stall",
        "outside_model.unchunked-prompt-stall",
        "outside_model.prefill-lookahead-stall",
    ]


def test_fuzz_and_check_share_one_example_count() -> None:
    parser = build_parser()
    assert parser.parse_args(["fuzz"]).examples == FUZZ_EXAMPLES
    assert parser.parse_args(["check"]).fuzz_examples == FUZZ_EXAMPLES
    assert parser.parse_args(["fuzz"]).top_up_rounds == FUZZ_TOP_UP_ROUNDS
    assert parser.parse_args(["check"]).top_up_rounds == FUZZ_TOP_UP_ROUNDS
    assert check_module.CheckOptions().fuzz_examples == FUZZ_EXAMPLES
    assert check_module.CheckOptions().top_up_rounds == FUZZ_TOP_UP_ROUNDS


def test_every_fuzz_flag_reaches_the_stage(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[commands.FuzzOptions] = []
    monkeypatch.setattr(commands, "run_fuzz_stage", recorder(seen))
    monkeypatch.setattr(fuzz_cli, "check_scheduler_cls", lambda path: None)
    argv = ["fuzz", "--examples", "9", "--seed", "4", "--jobs", "3", "--profile", "vllm-0.33"]
    argv += ["--max-seconds", "7", "--json", "f.json", "--out-dir", "d", "--layout", "ngram"]
    argv += ["--no-coverage-gate", "--scheduler-cls", "my.Scheduler", "--top-up-rounds", "0"]
    assert main(argv) == 0
    assert main(["fuzz", "--replay", "s.json", "--profile", "dual"]) == 0
    options, replay = seen
    assert replay == commands.FuzzOptions(
        known_findings=fuzz_cli.known_findings(), replay="s.json", profile="dual"
    )
    assert options == commands.FuzzOptions(
        examples=9,
        seed=4,
        known_findings=fuzz_cli.known_findings(),
        jobs=3,
        profile="vllm-0.33",
        max_seconds=7.0,
        json_path="f.json",
        out_dir="d",
        layouts=("ngram",),
        coverage_gate=False,
        scheduler_cls="my.Scheduler",
        top_up_rounds=0,
    )


def test_every_check_flag_reaches_the_stages(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[check_module.CheckOptions] = []
    monkeypatch.setattr(check_module, "check", recorder(seen))
    argv = ["check", "--fuzz-examples", "5", "--fuzz-seconds", "9", "--seed", "2"]
    argv += ["--json", "c.json", "--out-dir", "d", "--jobs", "2", "--scheduler-cls", "a:B"]
    argv += ["--top-up-rounds", "3"]
    assert main(argv) == 0
    assert seen == [
        check_module.CheckOptions(
            fuzz_examples=5,
            fuzz_seconds=9.0,
            seed=2,
            jobs=2,
            json_path="c.json",
            out_dir="d",
            scheduler_cls="a:B",
            top_up_rounds=3,
        )
    ]


def test_the_proofs_stage_runs_prove_with_the_parsers_own_defaults(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from dualbudget.proofs import commands as proofs_commands

    seen: list[ProveOptions] = []
    monkeypatch.setattr(proofs_commands, "prove", recorder(seen))
    assert check_module.run_proofs(Path("p.json")) == 0
    [options] = seen
    # The parser's defaults but for the JSON the stage reads its checked work from.
    assert options == ProveOptions(json_path="p.json")
    defaults = options_from(build_parser().parse_args(["prove"]), ProveOptions)
    assert options == dataclasses.replace(defaults, json_path="p.json")
