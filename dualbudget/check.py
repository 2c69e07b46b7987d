"""``dualbudget check``, the main job: the proofs, then a short fuzz, then one verdict.

The fuzz is ``dualbudget fuzz`` with the coverage gate on (a fuzz that reached nothing
has checked nothing) and ``--fuzz-seconds`` as its time cap. Each stage is called with
typed parameters; the proofs stage takes the namespace ``dualbudget prove`` would get
with no flags, made by the command line's own parser, so that no flag is named twice.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from dualbudget.spec.errors import BadInput


@dataclass
class Verdict:
    """The rows of the verdict table: (stage, PASS/FAIL, what it did)."""

    rows: list[tuple[str, str, str]] = field(default_factory=list)

    def stage(self, name: str, run: Callable[[], int], detail: str, note: str = "") -> None:
        """Run one stage; its exit code (2 on bad input) becomes a row."""
        print(f"\n== {name}", flush=True)
        t0 = time.perf_counter()
        try:
            code, said = run(), f"{detail}exit "
        except BadInput as err:
            code, said = 2, f"{detail}error: {err}; exit "
        verdict = "PASS" if code == 0 else "FAIL"
        self.rows.append((name, verdict, f"{said}{code}, {time.perf_counter() - t0:.0f}s{note}"))

    @property
    def ok(self) -> bool:
        return all(verdict == "PASS" for _, verdict, _ in self.rows)


def run_proofs() -> int:
    from dualbudget.cli import build_parser
    from dualbudget.proofs.commands import prove

    return int(prove(build_parser().parse_args(["prove"])))


def run_check(
    *,
    fuzz_examples: int,
    fuzz_seconds: float | None,
    seed: int,
    jobs: int,
    json_path: str | None = None,
    out_dir: str | None = None,
    scheduler_cls: str | None = None,
    top_up_rounds: int = 0,
) -> int:
    from dualbudget.fuzz_cli import check_scheduler_cls, known_findings
    from dualbudget.integration.commands import (
        DEFAULT_OUT_DIR,
        FuzzOptions,
        quiet_vllm,
        run_fuzz_stage,
        write_json,
    )
    from dualbudget.integration.live import installed_vllm_version

    check_scheduler_cls(scheduler_cls)  # bad input stops the job before any stage
    started = time.perf_counter()
    verdict = Verdict()
    verdict.stage("proofs", run_proofs, "")

    quiet_vllm()
    version = installed_vllm_version()
    if version is None:
        verdict.rows.append(("fuzz", "FAIL", f"vLLM is not installed in {sys.executable}"))
    else:
        folder = Path(out_dir or DEFAULT_OUT_DIR)
        folder.mkdir(parents=True, exist_ok=True)
        options = FuzzOptions(
            examples=fuzz_examples,
            seed=seed,
            known_findings=known_findings(),
            jobs=jobs,
            max_seconds=fuzz_seconds,
            json_path=folder / "check-fuzz.json",
            out_dir=folder,
            scheduler_cls=scheduler_cls,
            top_up_rounds=top_up_rounds,
        )
        checked = f", scheduler {scheduler_cls}" if scheduler_cls else ""
        verdict.stage(
            "fuzz",
            lambda: run_fuzz_stage(options),
            f"vLLM {version}{checked}, {fuzz_examples} examples, seed {seed}, ",
            f" (report {options.json_path})",
        )
    rows = verdict.rows
    width = max(len(r[0]) for r in rows)
    print("\n== verdict")
    for name, passed, detail in rows:
        print(f"{name:<{width}}  {passed:<4}  {detail}")
    print(f"overall: {'PASS' if verdict.ok else 'FAIL'} in {time.perf_counter() - started:.0f}s")
    report = {name: passed for name, passed, _ in rows}
    write_json(json_path, {"rows": [list(r) for r in rows], "pass": verdict.ok, **report})
    return 0 if verdict.ok else 1


def check(args: argparse.Namespace) -> int:
    from dualbudget.fuzz_cli import default_jobs

    return run_check(
        fuzz_examples=args.fuzz_examples,
        fuzz_seconds=args.fuzz_seconds,
        seed=args.seed,
        jobs=args.jobs or default_jobs(),
        json_path=args.json,
        out_dir=args.out_dir,
        scheduler_cls=args.scheduler_cls,
        top_up_rounds=args.top_up_rounds,
    )
