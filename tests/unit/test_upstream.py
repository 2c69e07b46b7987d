"""The regression tests for upstream, as written: standalone (nothing of dualbudget,
nothing of vLLM's tests), valid and ruff-clean Python; predicted from the manifest's
findings and crash records; and the JUnit check that CI runs against them."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from dualbudget.cli import main
from dualbudget.integration.upstream import (
    MANIFEST_FORMAT,
    MANIFEST_NAME,
    check_junit,
    exhibits,
    load_crashes,
    read_junit,
    source,
)
from dualbudget.proofs.manifest import load_manifest
from dualbudget.reference.violations import VLLM_CRASHES
from dualbudget.spec.profiles import release_profile
from dualbudget.spec.releases import RELEASES
from tests.paths import REPO

RUFF = Path(sys.executable).with_name("ruff")


def _written(tmp_path: Path) -> list[Path]:
    paths = []
    for exhibit in exhibits():
        path = tmp_path / f"test_{exhibit.name}.py"
        path.write_text(source(exhibit, "0.32.0", exhibit.why("0.32.0")))
        paths.append(path)
    return paths


def test_generated_files_import_only_vllm_pytest_torch_and_the_standard_library(
    tmp_path: Path,
) -> None:
    allowed = {"json", "pytest", "torch", "vllm"}
    for path in _written(tmp_path):
        tree = ast.parse(path.read_text(), filename=str(path))
        roots = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                roots |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                assert node.level == 0 and node.module is not None, path.name
                roots.add(node.module.split(".")[0])
        assert roots <= allowed, f"{path.name} imports {sorted(roots - allowed)}"
        tests = [
            n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")
        ]
        assert len(tests) == 1, path.name
        assert any(isinstance(n, ast.Assert) for n in ast.walk(tests[0])), path.name


def test_generated_files_are_ruff_clean(tmp_path: Path) -> None:
    _written(tmp_path)
    rules = "E,F,W,I,B,UP,SIM,RUF"
    common = ["--isolated", "--line-length", "100"]
    lint = [str(RUFF), "check", *common, "--select", rules, str(tmp_path)]
    done = subprocess.run(lint, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout
    fmt = [str(RUFF), "format", *common, "--check", str(tmp_path)]
    done = subprocess.run(fmt, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout


def test_each_exhibit_names_a_finding_of_the_manifest_or_a_crash_record() -> None:
    manifest = load_manifest()
    crashes = load_crashes()
    names = [e.name for e in exhibits()]
    assert len(names) == len(set(names))
    for exhibit in exhibits():
        if exhibit.finding.startswith("crash/"):
            assert exhibit.finding.removeprefix("crash/") in crashes
            continue
        failing = [
            release.version
            for release in RELEASES.values()
            if manifest.expected(f"{release_profile(release).name}/{exhibit.finding}") == "fails"
        ]
        assert failing, f"{exhibit.finding}: no release's profile is expected to fail it"
    # Every crash record has its test: a crash the fuzz mirrors is a finding too. One
    # whose scheduler a generated test cannot build names the live test that reaches it.
    covered = {e.finding.removeprefix("crash/") for e in exhibits()}
    assert set(crashes) <= covered | {name for name, c in crashes.items() if c.test}
    assert not covered & {name for name, c in crashes.items() if c.test}


def test_a_crash_record_without_an_exhibit_names_a_live_test_that_exists() -> None:
    root = REPO
    named = [c for c in load_crashes().values() if c.test]
    assert named
    for crash in named:
        assert crash.test is not None
        path, _, function = crash.test.partition("::")
        assert f"def {function}(" in (root / path).read_text(), crash.name
        assert crash.name in VLLM_CRASHES


def test_every_crash_record_names_an_assertion_the_reference_mirrors() -> None:
    assert set(load_crashes()) <= set(VLLM_CRASHES)


def test_every_crash_record_says_where_and_how_it_is_reached() -> None:
    crashes = load_crashes()
    assert crashes
    for crash in crashes.values():
        assert crash.releases and set(crash.releases) <= set(RELEASES)
        for text in (crash.assertion, crash.config, crash.traffic, crash.why):
            assert len(text) > 20, crash.name


@pytest.mark.parametrize(
    ("finding", "version", "predicted"),
    [
        ("dspark-fill-in/C3", "0.32.0", True),
        ("dspark-fill-in/C3", "0.33.0", False),
        ("dflash/C5", "0.32.0", True),
        ("dflash/C5", "0.33.0", False),
        ("ngram-parallel/C4", "0.32.0", False),
        ("ngram-parallel/C4", "0.33.0", True),
        ("crash/padded-decode-cut-by-long-prefill-threshold", "0.33.0", True),
        ("dflash/C5", "0.34.0.dev1", False),
    ],
)
def test_predictions_follow_the_manifest(finding: str, version: str, predicted: bool) -> None:
    exhibit = next(e for e in exhibits() if e.finding == finding)
    assert exhibit.predicted(version) is predicted


def _junit(path: Path, cases: dict[str, str | None]) -> Path:
    body = []
    for name, failure in cases.items():
        inner = "" if failure is None else f'<failure message="{failure}">x</failure>'
        body.append(f'<testcase classname="m" name="{name}">{inner}</testcase>')
    path.write_text(f"<testsuites><testsuite>{''.join(body)}</testsuite></testsuites>")
    return path


def _manifest(folder: Path) -> Path:
    folder.mkdir()
    tests = [{"test": "test_a", "marker": "C3 buffer peak:"}]
    text = f'{{"format": "{MANIFEST_FORMAT}", "tests": {tests!r}}}'.replace("'", '"')
    (folder / MANIFEST_NAME).write_text(text)
    return folder


def test_check_junit_accepts_exactly_the_predicted_failures(tmp_path: Path) -> None:
    folder = _manifest(tmp_path / "up")
    good = _junit(tmp_path / "good.xml", {"test_a": "AssertionError: C3 buffer peak: 12 > 8"})
    assert check_junit(folder, good) == []
    passed = _junit(tmp_path / "passed.xml", {"test_a": None})
    assert check_junit(folder, passed) == [
        "test_a: predicted to fail with 'C3 buffer peak:', passed: passed"
    ]
    other = _junit(tmp_path / "other.xml", {"test_a": "ValueError: refused"})
    assert "predicted to fail" in check_junit(folder, other)[0]
    extra = _junit(tmp_path / "extra.xml", {"test_a": "C3 buffer peak: x", "test_b": "boom"})
    assert check_junit(folder, extra) == ["test_b: not predicted to fail, failed"]
    assert main(["report", "--upstream", str(folder), "--check-junit", str(good)]) == 0
    assert main(["report", "--upstream", str(folder), "--check-junit", str(extra)]) == 1


def test_report_flags_refuse_what_they_cannot_use(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["report", "--check-junit", str(tmp_path / "j.xml")]) == 2
    assert "--check-junit" in capsys.readouterr().err
    assert main(["report", "--upstream", str(tmp_path), "--check-junit", "j.xml"]) == 2
    assert MANIFEST_NAME in capsys.readouterr().err


def test_check_junit_has_one_case_per_stage_a_failed_stage_failing(tmp_path: Path) -> None:
    """``dualbudget check --junit F``, the verdict a vLLM CI job reads (docs/vllm-ci.md)."""
    from dualbudget.check import write_junit

    rows = [("proofs", "PASS", "exit 0, 36s"), ("fuzz", "FAIL", "vLLM 0.33.0, exit 1, 78s")]
    path = tmp_path / "check.xml"
    write_junit(rows, path)
    outcomes = read_junit(path)
    assert {name: o.outcome for name, o in outcomes.items()} == {
        "proofs": "passed",
        "fuzz": "failed",
    }
    assert "exit 1" in outcomes["fuzz"].message


@pytest.mark.parametrize(
    ("finding", "profile", "predicted"),
    [
        # A tree's predictions follow the profile its decisions match: pr-53080's rule
        # breaks none of the contract items the releases break...
        ("dspark-fill-in/C3", "pr-53080", False),
        ("dflash/C5", "dual", False),
        ("ngram-parallel/C4", "dual", False),
        # ... #52996 keeps 0.32's DSpark fill-in overflow ...
        ("dspark-fill-in/C3", "pr-52996", True),
        # ... and a tree keeps the crashes of the release it runs on (its padding).
        ("crash/padded-decode-cut-by-long-prefill-threshold", "pr-53080", True),
        ("crash/padded-decode-cut-by-long-prefill-threshold", "dual", True),
        ("dflash/C5", None, False),
    ],
)
def test_a_trees_predictions_follow_its_detected_profile(
    finding: str, profile: str | None, predicted: bool
) -> None:
    exhibit = next(e for e in exhibits() if e.finding == finding)
    assert exhibit.predicted_under(profile) is predicted
    if profile is not None and not finding.startswith("crash/"):
        assert exhibit.why_under(profile) != finding or not predicted
