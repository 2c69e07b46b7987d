"""``dualbudget check``, the main job: the proofs, then a short fuzz, then one verdict.

The fuzz is ``dualbudget fuzz`` with the coverage gate on (a fuzz that reached nothing
has checked nothing) and ``--fuzz-seconds`` as its time cap. Each stage takes its typed
options: the proofs run with ``ProveOptions``' defaults, which are ``dualbudget prove``'s
with no flags, and the fuzz with the ``FuzzOptions`` this job's own options make.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dualbudget.integration.commands import DEFAULT_OUT_DIR, FUZZ_EXAMPLES, FUZZ_TOP_UP_ROUNDS
from dualbudget.spec.errors import BadInput


@dataclass(frozen=True, kw_only=True)
class CheckOptions:
    """One ``dualbudget check`` run (``check``); its defaults are the flags'."""

    fuzz_examples: int = FUZZ_EXAMPLES
    fuzz_seconds: float = 180.0
    """The fuzz's time cap, in seconds."""
    seed: int = 1
    """The fuzz's seed."""
    jobs: int | None = None
    """Worker processes of the fuzz; None: one per core."""
    json_path: str | None = None
    """Where the verdict goes as JSON; None: nowhere."""
    junit_path: str | None = None
    """Where the verdict goes as JUnit XML, one test case per stage (a CI's test report);
    None: nowhere."""
    out_dir: str = DEFAULT_OUT_DIR
    """Where divergence scenarios and the fuzz's own JSON report go."""
    scheduler_cls: str | None = None
    """An import path of a vLLM ``Scheduler`` subclass to check instead of vLLM's."""
    top_up_rounds: int = FUZZ_TOP_UP_ROUNDS
    vllm_src: str | None = None
    """A vLLM source tree whose Python the fuzz runs over the installed vLLM."""


@dataclass
class Verdict:
    """The rows of the verdict table: (stage, PASS/FAIL, what it did). A stage passes
    only when it exits 0 and names the work it checked (obligations, live steps): a stage
    that checked nothing is no pass."""

    rows: list[tuple[str, str, str]] = field(default_factory=list)
    codes: list[int] = field(default_factory=list)

    def stage(
        self,
        name: str,
        run: Callable[[], int],
        detail: str,
        work: Callable[[], str | None],
        note: str = "",
    ) -> None:
        """Run one stage; its exit code (2 on bad input) and ``work()`` (what it
        checked, read once it ran; None: nothing) become a row."""
        print(f"\n== {name}", flush=True)
        t0 = time.perf_counter()
        try:
            code, said = run(), f"{detail}exit "
        except BadInput as err:
            code, said = 2, f"{detail}error: {err}; exit "
        checked = work()
        verdict = "PASS" if code == 0 and checked else "FAIL"
        what = f"checked {checked}; " if checked else "checked nothing; "
        self.rows.append(
            (name, verdict, f"{what}{said}{code}, {time.perf_counter() - t0:.0f}s{note}")
        )
        self.codes.append(code if code else int(not checked))

    def fail(self, name: str, detail: str, code: int) -> None:
        """A stage that could not run: a FAIL row with its exit code."""
        self.rows.append((name, "FAIL", detail))
        self.codes.append(code)

    @property
    def ok(self) -> bool:
        return bool(self.rows) and all(verdict == "PASS" for _, verdict, _ in self.rows)

    @property
    def exit_code(self) -> int:
        """0 when every stage passed; else the worst stage's (2, bad input or a vLLM the
        adapter cannot drive, over 1, a failure found)."""
        return 0 if self.ok else max(self.codes, default=1) or 1


def run_proofs(json_path: Path) -> int:
    from dualbudget.proofs.commands import ProveOptions, prove

    return int(prove(ProveOptions(json_path=str(json_path))))


def _read(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def proofs_work(path: Path) -> str | None:
    """The obligations a proof run decided, from its JSON."""
    data = _read(path)
    decided = len(data.get("obligations", ())) if data else 0
    return f"{decided} obligations" if decided else None


def fuzz_work(path: Path) -> str | None:
    """The live steps a fuzz checked, from its JSON (per method where it says)."""
    data = _read(path)
    steps = int(data.get("steps", 0)) if data else 0
    if not steps or data is None:
        return None
    methods = data.get("steps_by_method") or {}
    return f"{steps} live steps of {sum(1 for n in methods.values() if n)} methods"


def check(options: CheckOptions) -> int:
    from dualbudget.fuzz_cli import check_scheduler_cls, known_findings
    from dualbudget.integration.commands import FuzzOptions, run_fuzz_stage, write_json
    from dualbudget.integration.live import installed_vllm_version, quiet_vllm
    from dualbudget.integration.vllm_source import provenance, use_vllm_source

    use_vllm_source(options.vllm_src)  # before any import of vLLM, the scheduler class's too
    scheduler_cls = options.scheduler_cls
    check_scheduler_cls(scheduler_cls)  # bad input stops the job before any stage
    started = time.perf_counter()
    verdict = Verdict()
    folder = Path(options.out_dir)
    folder.mkdir(parents=True, exist_ok=True)
    proofs_json = folder / "check-prove.json"
    proofs_json.unlink(missing_ok=True)
    verdict.stage("proofs", lambda: run_proofs(proofs_json), "", lambda: proofs_work(proofs_json))

    quiet_vllm()
    version = installed_vllm_version()
    if version is None:
        verdict.fail("fuzz", f"checked nothing; vLLM is not installed in {sys.executable}", 2)
    else:
        fuzz_json = folder / "check-fuzz.json"
        fuzz_json.unlink(missing_ok=True)
        fuzz = FuzzOptions(
            examples=options.fuzz_examples,
            seed=options.seed,
            known_findings=known_findings(),
            jobs=options.jobs,
            max_seconds=options.fuzz_seconds,
            json_path=fuzz_json,
            out_dir=folder,
            scheduler_cls=scheduler_cls,
            top_up_rounds=options.top_up_rounds,
            vllm_src=options.vllm_src,
        )
        checked = f", scheduler {scheduler_cls}" if scheduler_cls else ""
        verdict.stage(
            "fuzz",
            lambda: run_fuzz_stage(fuzz),
            f"vLLM {version}{checked}, {fuzz.examples} examples, seed {fuzz.seed}, ",
            lambda: fuzz_work(fuzz_json),
            f" (report {fuzz.json_path})",
        )
        origin = provenance()  # the fuzz row names vllm.v1.core modules not the tree's
        if origin is not None and not origin.all_from_tree:
            name, passed, said = verdict.rows[-1]
            verdict.rows[-1] = (name, passed, f"{said}; {origin.note()}")
    rows = verdict.rows
    width = max(len(r[0]) for r in rows)
    print("\n== verdict")
    for name, passed, detail in rows:
        print(f"{name:<{width}}  {passed:<4}  {detail}")
    print(f"overall: {'PASS' if verdict.ok else 'FAIL'} in {time.perf_counter() - started:.0f}s")
    report = {name: passed for name, passed, _ in rows}
    write_json(options.json_path, {"rows": [list(r) for r in rows], "pass": verdict.ok, **report})
    if options.junit_path:
        write_junit(rows, Path(options.junit_path))
    return verdict.exit_code


def write_junit(rows: list[tuple[str, str, str]], path: Path) -> None:
    """The verdict as JUnit XML: a stage that did not pass is a failure carrying its row."""
    from xml.etree import ElementTree

    suite = ElementTree.Element("testsuite", name="dualbudget.check", tests=str(len(rows)))
    suite.set("failures", str(sum(passed != "PASS" for _, passed, _ in rows)))
    for name, passed, detail in rows:
        case = ElementTree.SubElement(suite, "testcase", classname="dualbudget.check", name=name)
        if passed != "PASS":
            ElementTree.SubElement(case, "failure", message=detail)
    ElementTree.ElementTree(suite).write(path, encoding="unicode", xml_declaration=True)
