"""The ``dualbudget`` command line.

The only code that sees ``argparse``'s namespace: it parses the flags, builds the
subcommand's options (a frozen dataclass beside the stage it drives, one field per flag,
of the flag's destination name) and calls the stage ``(options) -> int`` (its exit code).
A flag's default is its field's default, read from the options class when the parser is
built, so no default is written twice. The options' modules import neither z3 nor vLLM
(a stage imports what it runs on inside itself), so that ``dualbudget schedule`` never
loads z3 and nothing but ``integration`` ever loads vLLM. Bad input anywhere raises
``BadInput``: one line on stderr, exit code 2, no traceback.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, NoReturn, TypeVar

from dualbudget.campaign.budget import parse_duration
from dualbudget.campaign.executor import EXECUTORS
from dualbudget.check import CheckOptions
from dualbudget.diff_cli import DEFAULT_SEARCH_LAYOUT, DiffOptions
from dualbudget.integration.commands import BenchOptions, FuzzOptions
from dualbudget.integration.mutate import MutateOptions
from dualbudget.matrix_cli import MatrixOptions
from dualbudget.proofs.commands import ProveOptions
from dualbudget.reference.runs.commands import ScheduleOptions
from dualbudget.reference.runs.replay import ReplayOptions
from dualbudget.reference.runs.simulate import CALIBRATIONS
from dualbudget.reference.runs.workload import DEFAULT_WORKLOAD, PRESETS, WorkloadOptions
from dualbudget.report import ReportOptions
from dualbudget.settings_cli import SettingsOptions
from dualbudget.simulate_cli import SimulateOptions
from dualbudget.spec.contract import CONTRACT_IDS
from dualbudget.spec.errors import BadInput
from dualbudget.spec.methods import LAYOUT_NAMES
from dualbudget.spec.profiles import PROFILE_NAMES

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

Number = TypeVar("Number", int, float)
Options = TypeVar("Options", bound="DataclassInstance")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def _at_least(
    minimum: Number, convert: Callable[[str], Number], what: str
) -> Callable[[str], Number]:
    """An argparse type: ``convert`` the text, refused unless it is ``>= minimum``."""

    def parse(text: str) -> Number:
        try:
            value = convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not {what}: {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
        return value

    return parse


_positive_int = _at_least(1, int, "an integer")
_nonnegative_int = _at_least(0, int, "an integer")
_nonnegative_float = _at_least(0.0, float, "a number")


def _duration(text: str) -> float:
    """An argparse type: seconds of a duration (``campaign.budget.parse_duration``)."""
    try:
        return parse_duration(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


class _Choose(argparse.Action):
    """A repeatable flag whose values gather in a tuple; its first use replaces the
    default (argparse's ``append`` would add to it, and a default of every layout or of
    the default profiles would then stay chosen)."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        chosen = getattr(namespace, self.dest)
        earlier = () if chosen is self.default else tuple(chosen)
        setattr(namespace, self.dest, (*earlier, values))


def field_default(options: type[Any], name: str) -> Any:
    """The default of the options' field ``name`` (``dataclasses.MISSING`` for a field
    without one); a name that is no field is a flag with nowhere to go."""
    for field in dataclasses.fields(options):
        if field.name == name:
            if field.default_factory is not dataclasses.MISSING:
                return field.default_factory()
            return field.default
    raise TypeError(f"{options.__name__} has no field {name!r} for its flag")


class _Command:
    """One subcommand's parser; each flag it adds takes its default from its field."""

    def __init__(
        self,
        sub: argparse._SubParsersAction[_Parser],
        name: str,
        options: type[Any],
        run: str,
        description: str,
    ) -> None:
        self.parser = sub.add_parser(name, help=description)
        self.parser.set_defaults(run=run, options=options)
        self.options = options

    def flag(
        self, *names: str, within: argparse._ActionsContainer | None = None, **kwargs: Any
    ) -> argparse.Action:
        """``add_argument`` (to the group ``within``, if given), with the default of the
        field the flag's destination names."""
        action = (within or self.parser).add_argument(*names, **kwargs)
        default = field_default(self.options, action.dest)
        if default is not dataclasses.MISSING:
            action.default = default
        return action


def _vllm_src_flag(command: _Command) -> None:
    command.flag(
        "--vllm-src", metavar="DIR",
        help="check the vLLM source tree DIR (holding vllm/): its Python over the installed"
        " vLLM's compiled parts, no build; its profile is detected by decisions",
    )  # fmt: skip


def _live_flags(command: _Command) -> None:
    """The fuzz's flags that ``fuzz`` and ``check`` share."""
    _vllm_src_flag(command)
    command.flag(
        "--scheduler-cls", metavar="MODULE.CLASS",
        help="check this vLLM Scheduler subclass (module:Class or module.Class, as vLLM's"
        " --scheduler-cls) instead of vLLM's own",
    )  # fmt: skip
    command.flag(
        "--top-up-rounds", type=_nonnegative_int, metavar="N",
        help="rounds that rerun, with fresh seeds, the units whose aim draws a required"
        " coverage event left at zero (default %(default)s; 0, or --no-coverage-gate: none)",
    )  # fmt: skip


def _jobs_flag(
    command: _Command, what: str, jobs_type: Callable[[str], int] = _positive_int
) -> None:
    command.flag("--jobs", type=jobs_type, metavar="N", help=what)


def _executor_flags(
    command: _Command, jobs: str, jobs_type: Callable[[str], int] = _positive_int
) -> None:
    """Where a command's units run (``campaign.executor``, docs/campaigns.md): the one
    declaration of ``--executor``, ``--jobs`` (``jobs``: what its width means to this
    command) and ``--ray-address`` for every command on the seam."""
    command.flag(
        "--executor", choices=EXECUTORS,
        help="local processes (--jobs of them) or Ray actors (default %(default)s)",
    )  # fmt: skip
    _jobs_flag(command, jobs, jobs_type)
    command.flag(
        "--ray-address", metavar="ADDR",
        help="the Ray cluster of --executor ray (auto: the one `ray start` left here;"
        " default: $RAY_ADDRESS, else a local Ray for the run)",
    )  # fmt: skip


def _campaign_flags(command: _Command) -> None:
    """A campaign's flags (``campaign.store``): for the commands that keep their units."""
    command.flag(
        "--campaign", metavar="DIR",
        help="keep every finished unit in DIR/campaign.sqlite; a rerun with DIR resumes",
    )  # fmt: skip


def _simulate_flags(command: _Command) -> None:
    source = command.parser.add_mutually_exclusive_group()
    command.flag(
        "--workload", within=source, action=_Choose, metavar="NAME",
        help=f"a preset (default: {DEFAULT_WORKLOAD}); repeatable with --sweep",
    )  # fmt: skip
    command.flag("--scenario", within=source, metavar="FILE", help="a scenario JSON file")
    command.flag(
        "--trace", within=source, metavar="FILE",
        help="a recorded dualbudget trace: its config, arrivals and measured acceptance",
    )  # fmt: skip
    command.flag("--seed", type=int, help="the preset's seed (default %(default)s)")
    cached = ", ".join(name for name, w in PRESETS.items() if w.config.enable_prefix_caching)
    command.flag(
        "--enable-prefix-caching", action=argparse.BooleanOptionalAction,
        help="vLLM's prefix caching on or off (default: the workload's own setting, off"
        f" unless it says otherwise; presets with it on: {cached}; the report's first"
        " line says which holds)",
    )  # fmt: skip
    command.flag(
        "--profile", dest="profiles", action=_Choose, metavar="NAME",
        help=f"repeatable (default: {', '.join(SimulateOptions.profiles)})",
    )  # fmt: skip
    command.flag("--max-num-batched-tokens", type=int, metavar="B")
    command.flag("--max-num-seqs", type=int, metavar="N")
    command.flag("--speculative-config", metavar="JSON", help="as vLLM takes it")
    command.flag(
        "--calibration", metavar="NAME",
        help=f"the step-time coefficients: {', '.join(CALIBRATIONS)} (default %(default)s)",
    )  # fmt: skip
    for name in ("a", "b", "c"):
        command.flag(
            f"--step-time-{name}", type=float, metavar="S",
            help="override this coefficient of the calibration (seconds)",
        )  # fmt: skip
    command.flag("--max-steps", type=int, help="stop each run after N steps")
    command.flag("--json", dest="json_path", metavar="FILE")
    command.flag("--plot", metavar="DIR", help="write PNG plots here")
    command.flag("--quiet", action="store_true", help="no progress lines")
    _sweep_flags(command)


def _sweep_flags(command: _Command) -> None:
    from dualbudget.reference.runs.sweep import GRID_ALIASES, GRID_KEYS

    command.flag(
        "--sweep", action="store_true",
        help="simulate every --grid cell x --profile x --workload as units, into one table",
    )  # fmt: skip
    command.flag(
        "--grid", nargs="+", metavar="KEY=V1,V2",
        help=f"the sweep's grid; keys: {', '.join((*GRID_KEYS, *GRID_ALIASES))}",
    )  # fmt: skip
    command.flag("--num-requests", type=int, metavar="N", help="the sweep's requests per preset")
    command.flag(
        "--differ-above", type=float, metavar="X",
        help="mark a cell whose profiles differ by more than this fraction (default %(default)s)",
    )  # fmt: skip
    command.flag("--csv", dest="csv_path", metavar="FILE", help="the sweep's table as CSV")
    _executor_flags(
        command, "processes (default: min(cores, profiles); --sweep: cores, or Ray's CPUs)"
    )


def _diff_flags(command: _Command) -> None:
    command.flag(
        "--profile", dest="profiles", action=_Choose, metavar="NAME", help="twice: A, then B"
    )
    command.flag(
        "--layout", action=_Choose, metavar="L",
        help=f"the method layout (default: the workload's; {DEFAULT_SEARCH_LAYOUT} with --search;"
        " repeatable with --search)",
    )  # fmt: skip
    command.flag("--workload", metavar="NAME", help=f"a preset (default {DEFAULT_WORKLOAD})")
    command.flag("--scenario", metavar="FILE", help="a scenario JSON file")
    command.flag("--search", action="store_true", help="search for the widest difference")
    command.flag("--seed", type=int, help="the preset's and the search's seed")
    command.flag("--examples", type=int, help="search examples (default %(default)s)")
    command.flag("--max-seconds", type=float, help="search time cap (default %(default)s)")
    command.flag("--out", metavar="FILE", help="where --search writes its scenario")
    command.flag("--json", dest="json_path", metavar="FILE")
    command.flag(
        "--seeds", type=_positive_int, metavar="N",
        help="--search runs seeds SEED..SEED+N-1, one unit per layout and seed",
    )  # fmt: skip
    _executor_flags(
        command, "--search's width (default %(default)s; 0: every CPU of a Ray cluster)",
        _nonnegative_int,
    )  # fmt: skip


def _schedule_flags(schedule: _Command) -> None:
    schedule.flag("scenario", help="scenario JSON file")
    schedule.flag("--profile", choices=PROFILE_NAMES, help="override the scenario's")
    schedule.flag("--max-steps", type=_positive_int, help="stop after N steps")


def _replay_flags(replay: _Command) -> None:
    replay.flag("traces", nargs="+", metavar="TRACE", help="dualbudget-trace NDJSON")
    replay.flag("--profile", choices=PROFILE_NAMES, help="default: from vllm_version")
    replay.flag(
        "--json", dest="json_path", metavar="FILE", help="one summary per trace (docs/traces.md)"
    )


def _workload_flags(workload: _Command) -> None:
    workload.flag("name", help=f"a preset: {', '.join(PRESETS)}")
    workload.flag("--seed", type=int)
    workload.flag("--profile", choices=PROFILE_NAMES, help="override the preset's")
    workload.flag("--out", metavar="FILE", help="default: standard output")


def _prove_flags(prove: _Command) -> None:
    prove.flag("--profile", dest="profiles", action=_Choose, choices=PROFILE_NAMES)
    prove.flag("--layout", dest="layouts", action=_Choose, choices=LAYOUT_NAMES)
    prove.flag("--only", dest="contracts", action=_Choose, choices=CONTRACT_IDS, metavar="CONTRACT")
    prove.flag("--mutants", action="store_true", help="also run the mutant suite")
    prove.flag(
        "--reach", action="store_true", help="also the reach of each finding (proofs/reach.py)"
    )
    prove.flag("--json", dest="json_path", metavar="FILE")
    prove.flag("--junit", dest="junit_path", metavar="FILE")
    prove.flag("--witness-dir", type=Path, metavar="DIR", help="where witness scenarios go")
    _executor_flags(prove, "--reach's width (default: the proofs' pool's)", _nonnegative_int)


def _fuzz_flags(fuzz: _Command) -> None:
    fuzz.flag("--examples", type=_positive_int, help="default %(default)s")
    fuzz.flag("--seed", type=int)
    fuzz.flag("--profile", choices=PROFILE_NAMES, help="default: detected")
    fuzz.flag("--max-seconds", type=_nonnegative_float)
    fuzz.flag("--json", dest="json_path", metavar="FILE")
    fuzz.flag("--out-dir", metavar="DIR", help="where divergence scenarios go")
    fuzz.flag("--replay", metavar="SCENARIO", help="lockstep one scenario file and stop")
    fuzz.flag("--layout", dest="layouts", action=_Choose, choices=LAYOUT_NAMES, help="only these")
    fuzz.flag(
        "--no-coverage-gate", dest="coverage_gate", action="store_false",
        help="do not fail on a coverage counter at 0",
    )  # fmt: skip
    fuzz.flag(
        "--monitor-only", action="store_true",
        help="check the live scheduler against the contract monitor alone, no reference"
        " (chosen when no profile matches)",
    )  # fmt: skip
    _live_flags(fuzz)
    _executor_flags(
        fuzz, "worker processes (Ray: actors) of the fuzz (default: one per core); any N,"
        " the same result",
    )  # fmt: skip
    _campaign_flags(fuzz)
    fuzz.flag(
        "--budget", type=_duration, metavar="DURATION",
        help="with --campaign: draw new seeds (--examples each, round-robin over layouts and"
        " aims) until DURATION (8h, 90m, 30s) is spent, then merge everything in DIR",
    )  # fmt: skip


def _bench_flags(bench: _Command) -> None:
    bench.flag("--json", dest="json_path", metavar="FILE")
    bench.flag(
        "--repeat", type=_positive_int, metavar="N",
        help="timed runs per workload and mode (default %(default)s); the median is reported",
    )  # fmt: skip
    bench.flag("--profile", choices=PROFILE_NAMES, help="default: detected")
    _vllm_src_flag(bench)


def _check_flags(check: _Command) -> None:
    check.flag("--fuzz-examples", type=_positive_int, help="examples of the fuzz")
    check.flag("--fuzz-seconds", type=_nonnegative_float, help="time cap of the fuzz, 0: none")
    check.flag("--seed", type=int)
    check.flag("--json", dest="json_path", metavar="FILE")
    check.flag("--junit", dest="junit_path", metavar="FILE", help="the verdict as JUnit XML")
    check.flag("--out-dir", metavar="DIR", help="where divergence scenarios go")
    _live_flags(check)
    _jobs_flag(check, "worker processes of the fuzz (default: one per core)")


def _mutate_flags(mutate: _Command) -> None:
    mutate.flag("--json", dest="json_path", metavar="FILE")
    mutate.flag("--operators", nargs="+", metavar="OP", help="default: all")
    mutate.flag("--examples", type=_positive_int, help="fuzz examples per mutant")
    mutate.flag("--seed", type=int)
    _executor_flags(mutate, "mutants at once (default: cores; Ray: its CPUs)")
    _campaign_flags(mutate)
    mutate.flag("--profile", choices=PROFILE_NAMES, help="default: detected")
    mutate.flag("--out-dir", metavar="DIR", help="where the killers' scenarios go")
    _vllm_src_flag(mutate)


def _report_flags(report: _Command) -> None:
    report.flag("--out", metavar="DIR", help="the document's folder (required unless --upstream)")
    report.flag("--seed", type=int, help="seed of the standard workloads")
    report.flag("--quick", action="store_true", help="smaller workloads, no proofs")
    report.flag("--fuzz-json", metavar="FILE", help="a `dualbudget fuzz --json` result to include")
    report.flag(
        "--calibration", metavar="NAME",
        help="the step-time model's calibration, as `dualbudget simulate --calibration`",
    )  # fmt: skip
    report.flag(
        "--upstream", metavar="DIR",
        help="instead: a standalone vLLM pytest file per finding the installed vLLM exhibits",
    )  # fmt: skip
    report.flag(
        "--check-junit", metavar="FILE",
        help="with --upstream: compare a pytest JUnit XML of DIR with its manifest",
    )  # fmt: skip
    _vllm_src_flag(report)


def _settings_flags(settings: _Command) -> None:
    settings.flag("--json", action="store_true", help="the table as JSON")


def _matrix_flags(matrix: _Command) -> None:
    matrix.flag("--releases", metavar="V1,V2", help="default: requirements/matrix.txt")
    matrix.flag("--examples", type=_positive_int, help="fuzz examples (default %(default)s)")
    matrix.flag("--seed", type=int)
    _executor_flags(matrix, "releases at once (default %(default)s)")
    _campaign_flags(matrix)
    matrix.flag("--keep-envs", action="store_true", help="keep each release's environment")
    matrix.flag("--cache-dir", metavar="DIR", help="the environments (default %(default)s)")
    matrix.flag("--json-dir", metavar="DIR", help="one JSON per release (default %(default)s)")
    matrix.flag("--doc", metavar="FILE", help="the table's document (default %(default)s)")
    matrix.flag("--render", metavar="DIR", help="only re-render --doc from the JSONs of DIR")


class Subcommand(NamedTuple):
    """One subcommand: the options record it fills, the function that runs it (by path,
    imported only when chosen), its one-line help and the function that adds its flags."""

    name: str
    options: type[Any]
    run: str
    description: str
    add_flags: Callable[[_Command], None]


SUBCOMMANDS: tuple[Subcommand, ...] = (
    Subcommand(
        "schedule",
        ScheduleOptions,
        "dualbudget.reference.runs.commands:schedule",
        "run the reference scheduler on a scenario",
        _schedule_flags,
    ),
    Subcommand(
        "replay",
        ReplayOptions,
        "dualbudget.reference.runs.replay:replay",
        "check recorded vLLM traces against the reference",
        _replay_flags,
    ),
    Subcommand(
        "workload",
        WorkloadOptions,
        "dualbudget.reference.runs.workload:write_workload",
        "write a seeded synthetic workload scenario",
        _workload_flags,
    ),
    Subcommand(
        "prove",
        ProveOptions,
        "dualbudget.prove_cli:prove",
        "prove every policy against the contract with z3",
        _prove_flags,
    ),
    Subcommand(
        "fuzz",
        FuzzOptions,
        "dualbudget.fuzz_cli:fuzz",
        "lockstep-fuzz the installed vLLM against the reference",
        _fuzz_flags,
    ),
    Subcommand(
        "bench",
        BenchOptions,
        "dualbudget.integration.commands:bench",
        "steps/s of the reference, the live vLLM, lockstep",
        _bench_flags,
    ),
    Subcommand(
        "check",
        CheckOptions,
        "dualbudget.check:check",
        "the main job: proofs, a short fuzz, one verdict",
        _check_flags,
    ),
    Subcommand(
        "mutate",
        MutateOptions,
        "dualbudget.integration.mutate:run_mutate_stage",
        "plant budget bugs in the installed vLLM, fuzz each",
        _mutate_flags,
    ),
    Subcommand(
        "simulate",
        SimulateOptions,
        "dualbudget.simulate_cli:simulate_command",
        "what a budget policy costs on a workload",
        _simulate_flags,
    ),
    Subcommand(
        "diff",
        DiffOptions,
        "dualbudget.diff_cli:diff_command",
        "where two profiles decide differently",
        _diff_flags,
    ),
    Subcommand(
        "report",
        ReportOptions,
        "dualbudget.report:report",
        "write the design-review document",
        _report_flags,
    ),
    Subcommand(
        "settings",
        SettingsOptions,
        "dualbudget.settings_cli:settings_command",
        "the vLLM settings that change decisions: defaults, modelled or refused",
        _settings_flags,
    ),
    Subcommand(
        "matrix",
        MatrixOptions,
        "dualbudget.matrix_cli:matrix_command",
        "every vLLM release in its own environment: detected, fuzzed, one table",
        _matrix_flags,
    ),
)
"""In the order ``dualbudget --help`` lists them."""


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="dualbudget", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for command in SUBCOMMANDS:
        command.add_flags(
            _Command(sub, command.name, command.options, command.run, command.description)
        )
    return parser


def options_from(args: argparse.Namespace, options: type[Options]) -> Options:
    """The subcommand's options: each field from the flag of its name (a list, as
    ``nargs`` gathers it, as a tuple), but ``known_findings``, which no flag sets: the
    proofs' manifest's (``fuzz_cli.known_findings``)."""
    values: dict[str, Any] = {}
    for field in dataclasses.fields(options):
        if field.name == "known_findings":
            from dualbudget.fuzz_cli import known_findings

            values[field.name] = known_findings()
            continue
        value = getattr(args, field.name)
        values[field.name] = tuple(value) if isinstance(value, list) else value
    return options(**values)


def _resolve(target: str) -> Callable[[Any], int]:
    module, _, name = target.partition(":")
    stage: Callable[[Any], int] = getattr(importlib.import_module(module), name)
    return stage


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    stage = _resolve(args.run)
    try:
        code = stage(options_from(args, args.options))
    except BadInput as err:
        print(f"dualbudget {args.command}: error: {err}", file=sys.stderr)
        return 2
    return int(code)
