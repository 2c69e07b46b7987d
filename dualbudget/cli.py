"""The ``dualbudget`` command line.

Each subcommand lives beside the code it drives and is imported only when run, so that
``dualbudget schedule`` never loads z3 and nothing but ``integration`` ever loads vLLM.
A subcommand is a function ``(argparse.Namespace) -> int`` (its exit code). Bad input
anywhere raises ``BadInput``: one line on stderr, exit code 2, no traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn, TypeVar

from dualbudget.reference.workload import PRESETS
from dualbudget.spec.contract import CONTRACT_IDS
from dualbudget.spec.errors import BadInput
from dualbudget.spec.methods import LAYOUT_NAMES
from dualbudget.spec.profiles import PROFILE_NAMES

FUZZ_EXAMPLES = 200
"""The examples of a fuzz, ``dualbudget fuzz`` and ``dualbudget check`` alike: every
(method, aim) unit gets its share (``integration.fuzz.shares``); about a minute on a
2-core machine, most of it vLLM's one-off import and model inspection."""
FUZZ_TOP_UP_ROUNDS = 2
"""Top-up rounds of a fuzz, ``dualbudget fuzz`` and ``dualbudget check`` alike: a unit
whose aim draws a required event some method left at zero runs again with a fresh seed
(``integration.fuzz.run_fuzz``). At 200 examples seeds 0, 3 and 4 left one to three such
events at zero under vLLM 0.32 (seed 1 none, so its run is unchanged)."""
BENCH_REPEAT = 7
"""Timed runs of ``dualbudget bench`` per workload and mode, interleaved; each mode's
figure is the median run (on a shared 2-core machine single runs of one stream vary by
up to 1.6x, so fewer runs let one slow spell move the ratio)."""


Number = TypeVar("Number", int, float)


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


def _live_arguments(parser: argparse.ArgumentParser) -> None:
    """The fuzz's flags that ``fuzz`` and ``check`` share."""
    parser.add_argument(
        "--scheduler-cls", metavar="MODULE.CLASS",
        help="check this vLLM Scheduler subclass (module:Class or module.Class, as vLLM's"
        " --scheduler-cls) instead of vLLM's own",
    )  # fmt: skip
    parser.add_argument(
        "--jobs", type=_positive_int, default=None, metavar="N",
        help="worker processes of the fuzz (default: one per core); any N, the same result",
    )  # fmt: skip
    parser.add_argument(
        "--top-up-rounds", type=_nonnegative_int, default=FUZZ_TOP_UP_ROUNDS, metavar="N",
        help="rounds that rerun, with fresh seeds, the units whose aim draws a required"
        " coverage event left at zero (default %(default)s; 0, or --no-coverage-gate: none)",
    )  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="dualbudget", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    schedule = sub.add_parser("schedule", help="run the reference scheduler on a scenario")
    schedule.add_argument("scenario", help="scenario JSON file")
    schedule.add_argument("--profile", choices=PROFILE_NAMES, help="override the scenario's")
    schedule.add_argument("--max-steps", type=_positive_int, help="stop after N steps")
    schedule.set_defaults(run="dualbudget.reference.commands:schedule")

    replay = sub.add_parser("replay", help="check recorded vLLM traces against the reference")
    replay.add_argument("traces", nargs="+", metavar="TRACE", help="dualbudget-trace NDJSON")
    replay.add_argument("--profile", choices=PROFILE_NAMES, help="default: from vllm_version")
    replay.add_argument("--json", metavar="FILE", help="one summary per trace (docs/traces.md)")
    replay.set_defaults(run="dualbudget.reference.replay:replay")

    workload = sub.add_parser("workload", help="write a seeded synthetic workload scenario")
    workload.add_argument("name", help=f"a preset: {', '.join(PRESETS)}")
    workload.add_argument("--seed", type=int, default=0)
    workload.add_argument("--profile", choices=PROFILE_NAMES, help="override the preset's")
    workload.add_argument("--out", metavar="FILE", help="default: standard output")
    workload.set_defaults(run="dualbudget.reference.workload:command")

    prove = sub.add_parser("prove", help="prove every policy against the contract with z3")
    prove.add_argument("--profile", action="append", choices=PROFILE_NAMES)
    prove.add_argument("--layout", action="append", choices=LAYOUT_NAMES)
    prove.add_argument("--only", action="append", choices=CONTRACT_IDS, metavar="CONTRACT")
    prove.add_argument("--mutants", action="store_true", help="also run the mutant suite")
    prove.add_argument(
        "--reach", action="store_true", help="also the reach of each finding (proofs/reach.py)"
    )
    prove.add_argument("--json", metavar="FILE")
    prove.add_argument("--junit", metavar="FILE")
    prove.add_argument("--witness-dir", metavar="DIR", help="where witness scenarios go")
    prove.set_defaults(run="dualbudget.proofs.commands:prove")

    fuzz = sub.add_parser("fuzz", help="lockstep-fuzz the installed vLLM against the reference")
    fuzz.add_argument("--examples", type=_positive_int, default=FUZZ_EXAMPLES)
    fuzz.add_argument("--seed", type=int, default=0)
    fuzz.add_argument("--profile", choices=PROFILE_NAMES, help="default: detected")
    fuzz.add_argument("--max-seconds", type=_nonnegative_float)
    fuzz.add_argument("--json", metavar="FILE")
    fuzz.add_argument("--out-dir", metavar="DIR", help="where divergence scenarios go")
    fuzz.add_argument("--replay", metavar="SCENARIO", help="lockstep one scenario file and stop")
    fuzz.add_argument("--layout", action="append", choices=LAYOUT_NAMES, help="only these")
    fuzz.add_argument(
        "--no-coverage-gate", action="store_true", help="do not fail on a coverage counter at 0"
    )
    _live_arguments(fuzz)
    fuzz.set_defaults(run="dualbudget.fuzz_cli:fuzz")

    bench = sub.add_parser("bench", help="steps/s of the reference, the live vLLM, lockstep")
    bench.add_argument("--json", metavar="FILE")
    bench.add_argument(
        "--repeat", type=_positive_int, default=BENCH_REPEAT, metavar="N",
        help="timed runs per workload and mode (default %(default)s); the median is reported",
    )  # fmt: skip
    bench.add_argument("--profile", choices=PROFILE_NAMES, help="default: detected")
    bench.set_defaults(run="dualbudget.integration.commands:bench")

    check = sub.add_parser("check", help="the main job: proofs, a short fuzz, one verdict")
    check.add_argument(
        "--fuzz-examples", type=_positive_int, default=FUZZ_EXAMPLES, help="examples of the fuzz"
    )
    check.add_argument(
        "--fuzz-seconds", type=_nonnegative_float, default=180.0, help="time cap of the fuzz"
    )
    check.add_argument("--seed", type=int, default=1)
    check.add_argument("--json", metavar="FILE")
    check.add_argument("--out-dir", metavar="DIR", help="where divergence scenarios go")
    _live_arguments(check)
    check.set_defaults(run="dualbudget.check:check")

    mutate = sub.add_parser("mutate", help="plant budget bugs in the installed vLLM, fuzz each")
    mutate.add_argument("--json", metavar="FILE")
    mutate.add_argument("--operators", nargs="+", metavar="OP", help="default: all")
    mutate.add_argument("--examples", type=_positive_int, help="fuzz examples per mutant")
    mutate.add_argument("--seed", type=int, default=1)
    mutate.add_argument("--jobs", type=_positive_int, help="worker processes (default: cores)")
    mutate.add_argument("--profile", choices=PROFILE_NAMES, help="default: detected")
    mutate.add_argument("--out-dir", metavar="DIR", help="where the killers' scenarios go")
    mutate.set_defaults(run="dualbudget.mutate_cli:mutate")

    from dualbudget.simulate_cli import add_arguments

    simulate = sub.add_parser("simulate", help="what a budget policy costs on a workload")
    add_arguments(simulate)
    simulate.set_defaults(run="dualbudget.simulate_cli:simulate_command")

    from dualbudget.diff_cli import add_arguments as add_diff_arguments

    diff = sub.add_parser("diff", help="where two profiles decide differently")
    add_diff_arguments(diff)
    diff.set_defaults(run="dualbudget.diff_cli:diff_command")

    report = sub.add_parser("report", help="write the design-review document")
    report.add_argument("--out", metavar="DIR", required=True)
    report.add_argument("--seed", type=int, default=0, help="seed of the standard workloads")
    report.add_argument("--quick", action="store_true", help="smaller workloads, no proofs")
    report.add_argument(
        "--fuzz-json", metavar="FILE", help="a `dualbudget fuzz --json` result to include"
    )
    report.add_argument(
        "--calibration",
        metavar="NAME",
        help="the step-time model's calibration, as `dualbudget simulate --calibration`",
    )
    report.set_defaults(run="dualbudget.report:report")
    return parser


def _resolve(target: str) -> object:
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    command = _resolve(args.run)
    try:
        code = command(args)  # type: ignore[operator]
    except BadInput as err:
        print(f"dualbudget {args.command}: error: {err}", file=sys.stderr)
        return 2
    return int(code)
