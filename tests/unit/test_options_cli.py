"""Every command's typed options: one home for each default, no namespace past the parser.

Each subcommand's flags parse into its options dataclass, field by field, and a flag's
default is its field's (so a default cannot be written twice, in the parser and in the
options); only the command line (``dualbudget/cli*.py``) takes an ``argparse.Namespace``.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import fnmatch
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dualbudget.cli import build_parser, field_default, main, options_from
from dualbudget.fuzz_cli import known_findings
from dualbudget.integration.mutation.operators import OPERATORS
from dualbudget.reference.runs.commands import ScheduleOptions
from tests.paths import REPO

LAYERS = ("spec", "reference", "proofs", "integration", "dualbudget")
"""The folders whose functions the namespace rule covers."""
COMMAND_LINE = "dualbudget/cli*.py"
"""The only modules whose functions may take the parser's namespace."""

REQUIRED: dict[str, tuple[list[str], dict[str, Any]]] = {
    "schedule": (["s.json"], {"scenario": "s.json"}),
    "replay": (["a.ndjson", "b.ndjson"], {"traces": ("a.ndjson", "b.ndjson")}),
    "workload": (["dspark-bench"], {"name": "dspark-bench"}),
    "report": (["--out", "review"], {"out": "review"}),
}
"""What each subcommand cannot do without: its arguments, and the fields they fill."""


def _subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    [sub] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(sub.choices)


SUBCOMMANDS = _subcommands()


def test_every_subcommand_of_the_readme_has_options() -> None:
    assert set(SUBCOMMANDS) == {
        "schedule", "workload", "prove", "fuzz", "replay", "bench", "check", "mutate",
        "simulate", "diff", "report", "settings", "matrix",
    }  # fmt: skip
    for name, parser in SUBCOMMANDS.items():
        assert dataclasses.is_dataclass(parser.get_default("options")), name


@pytest.mark.parametrize("name", sorted(SUBCOMMANDS))
def test_the_parsed_defaults_are_the_options_defaults(name: str) -> None:
    parser = SUBCOMMANDS[name]
    options = parser.get_default("options")
    fields = {field.name for field in dataclasses.fields(options)}
    flags = [a for a in parser._actions if not isinstance(a, argparse._HelpAction)]
    # Each flag has its field, and each field but the manifest's findings its flag.
    assert {a.dest for a in flags} == fields - {"known_findings"}
    for action in flags:
        default = field_default(options, action.dest)
        if default is dataclasses.MISSING:
            assert action.required, f"{name} {action.dest}: a field without a default"
        else:
            assert action.default == default, f"{name} {action.dest}"
    # Parsed with nothing optional, the options are the dataclass's own defaults.
    argv, given = REQUIRED.get(name, ([], {}))
    if "known_findings" in fields:
        given = {**given, "known_findings": known_findings()}
    parsed = options_from(build_parser().parse_args([name, *argv]), options)
    assert parsed == options(**given)
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(parsed, dataclasses.fields(options)[0].name, None)


def test_a_repeated_flag_replaces_its_default_then_gathers() -> None:
    parser = build_parser()
    # None: every method the detected release builds (FuzzOptions.layouts).
    assert parser.parse_args(["fuzz"]).layouts is None
    assert parser.parse_args(["prove"]).layouts == ()
    chosen = parser.parse_args(["fuzz", "--layout", "ngram", "--layout", "eagle"]).layouts
    assert chosen == ("ngram", "eagle")
    assert parser.parse_args(["simulate", "--profile", "dual"]).profiles == ("dual",)
    assert parser.parse_args(["prove", "--only", "C3"]).contracts == ("C3",)
    # ``nargs`` gathers a list; the options hold a tuple.
    mutate = SUBCOMMANDS["mutate"].get_default("options")
    args = parser.parse_args(["mutate", "--operators", OPERATORS[0]])
    assert options_from(args, mutate).operators == (OPERATORS[0],)


def test_a_flag_without_a_field_is_refused_when_the_parser_is_built() -> None:
    with pytest.raises(TypeError, match="ScheduleOptions has no field 'steps'"):
        field_default(ScheduleOptions, "steps")


def test_an_unknown_operator_is_bad_input_before_any_vllm(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["mutate", "--operators", "no-such-operator"]) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith("dualbudget mutate: error: --operators: unknown no-such-operator")


# -- no namespace past the command line -------------------------------------------------
def _modules(root: Path) -> Iterator[Path]:
    """Every module of the layers under ``root``, not following linked folders."""
    for layer in LAYERS:
        for folder, subfolders, files in os.walk(root / layer):
            subfolders[:] = [s for s in subfolders if not Path(folder, s).is_symlink()]
            yield from (Path(folder, f) for f in sorted(files) if f.endswith(".py"))


def namespace_takers(root: Path) -> list[str]:
    """``path:line function`` of every function outside the command line with a
    parameter annotated as argparse's namespace."""
    found = []
    for path in _modules(root):
        relative = path.relative_to(root).as_posix()
        if fnmatch.fnmatch(relative, COMMAND_LINE):
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            arguments = node.args
            parameters = [
                *arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs,
                *(a for a in (arguments.vararg, arguments.kwarg) if a is not None),
            ]  # fmt: skip
            for parameter in parameters:
                annotation = parameter.annotation
                if annotation is not None and re.search(r"\bNamespace\b", ast.unparse(annotation)):
                    found.append(f"{relative}:{node.lineno} {node.name}")
    return found


def test_only_the_command_line_takes_the_namespace() -> None:
    assert namespace_takers(REPO) == []


def test_the_namespace_rule_reports_a_planted_taker(tmp_path: Path) -> None:
    for layer in LAYERS:
        (tmp_path / layer).mkdir()
    taker = "import argparse\n\n\ndef stage(args: argparse.Namespace) -> int:\n    return 0\n"
    (tmp_path / "reference" / "runs").mkdir()
    (tmp_path / "reference" / "runs" / "commands.py").write_text(taker)
    (tmp_path / "dualbudget" / "simulate_cli.py").write_text(
        "from argparse import Namespace\n\n\nasync def run(*, args: 'Namespace') -> None: ...\n"
    )
    (tmp_path / "dualbudget" / "cli.py").write_text(taker)  # the command line may
    assert namespace_takers(tmp_path) == [
        "reference/runs/commands.py:4 stage",
        "dualbudget/simulate_cli.py:4 run",
    ]
