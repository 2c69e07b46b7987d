"""The reference's compiled build (reference/compiled.py): it decides as its sources do,
and a build that is not theirs (stale, partial, holding modules no longer compiled) is
refused by name, never run."""

from __future__ import annotations

import importlib.machinery
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from dualbudget.reference import compiled
from dualbudget.reference.compiled import (
    BUILD_INPUTS,
    COMPILED_MODULES,
    GROUP,
    INTERPRETED,
    CompiledBuildError,
    build_name,
    extension_modules,
    select,
    write_digests,
)

ROOT = Path(__file__).resolve().parent.parent
SUFFIX = importlib.machinery.EXTENSION_SUFFIXES[0]


def test_the_suite_runs_the_sources() -> None:
    # tests/conftest.py: a planted difference must reach every caller.
    assert os.environ[INTERPRETED] == "1"
    assert build_name() == "interpreted"


def _runs(interpreted: str) -> dict[str, Any]:
    env = {**os.environ, INTERPRETED: interpreted}
    done = subprocess.run(
        [sys.executable, "-m", "tests.compiled_runs"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def test_the_compiled_build_decides_as_the_sources_do() -> None:
    if not extension_modules(compiled.FOLDER):
        pytest.skip(
            "no compiled build in this checkout (DUALBUDGET_MYPYC=1 pip install"
            " --no-build-isolation -e ., as scripts/lib.sh's ensure_core_env does)"
        )
    built, sources = _runs("0"), _runs("1")
    assert (built["build"], sources["build"]) == ("mypyc", "interpreted")
    # Every step's record, free blocks and counters, stream by stream, and every replay.
    assert len(built["runs"]) == len(sources["runs"]) > 200
    for index, (mine, theirs) in enumerate(zip(built["runs"], sources["runs"], strict=True)):
        assert mine == theirs, f"scenario {index}: {_first_difference(mine, theirs)}"
    assert built["traces"] == sources["traces"], _first_difference(
        built["traces"], sources["traces"]
    )
    assert all(trace["steps_checked"] > 0 for trace in built["traces"])


def _first_difference(built: Any, sources: Any, where: str = "") -> str:
    """Where two results of tests/compiled_runs.py first differ, and how (the build's
    value, then the sources'), instead of both whole."""
    if isinstance(built, dict) and isinstance(sources, dict) and built.keys() == sources.keys():
        for key in built:
            if built[key] != sources[key]:
                return _first_difference(built[key], sources[key], f"{where}[{key!r}]")
    if isinstance(built, list) and isinstance(sources, list) and len(built) == len(sources):
        for index, (mine, theirs) in enumerate(zip(built, sources, strict=True)):
            if mine != theirs:
                return _first_difference(mine, theirs, f"{where}[{index}]")
    return f"at {where or 'the top'}: build {built!r}, sources {sources!r}"


@pytest.fixture
def fake_build(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A folder holding the compiled modules' sources, the build's inputs beside it and a
    complete build of them (empty files named as extension modules: ``select`` reads
    names and digests, never code)."""
    folder = tmp_path / "reference"
    folder.mkdir()
    for name in COMPILED_MODULES:
        (folder / f"{name}.py").write_text(f"NAME = {name!r}\n")
        (folder / f"{name}{SUFFIX}").write_bytes(b"")
    for source in BUILD_INPUTS:
        (folder / source).parent.mkdir(exist_ok=True)
        (folder / source).write_text(f"SOURCE = {source!r}\n")
    (folder / f"{GROUP}__mypyc{SUFFIX}").write_bytes(b"")
    write_digests(folder)
    monkeypatch.setenv(INTERPRETED, "0")
    return folder


def test_the_first_difference_is_named_with_its_path() -> None:
    built = {"runs": [{"steps": [{"free": 3}, {"free": 4}]}]}
    sources = {"runs": [{"steps": [{"free": 3}, {"free": 5}]}]}
    assert (
        _first_difference(built, sources)
        == "at ['runs'][0]['steps'][1]['free']: build 4, sources 5"
    )
    assert _first_difference([1], [1, 2]) == "at the top: build [1], sources [1, 2]"


def test_a_build_of_the_sources_is_taken(fake_build: Path) -> None:
    before = list(sys.meta_path)
    select("fake", fake_build)
    assert sys.meta_path == before


def test_a_build_of_other_sources_is_refused(fake_build: Path) -> None:
    (fake_build / "kv.py").write_text("NAME = 'kv, edited'\n")
    with pytest.raises(CompiledBuildError, match=r"compiled from other sources of kv\.py"):
        select("fake", fake_build)


def test_a_build_of_other_kernel_templates_is_refused(fake_build: Path) -> None:
    # The kernel classes are written from the stored templates: a template changed since
    # the build makes it stale, although no compiled module's own source changed.
    (fake_build / "../spec/compiled_book.py").write_text("TEMPLATES = {}\n")
    with pytest.raises(CompiledBuildError, match=r"other sources of \.\./spec/compiled_book\.py"):
        select("fake", fake_build)


def test_a_partial_build_is_refused(fake_build: Path) -> None:
    (fake_build / f"scheduler{SUFFIX}").unlink()
    with pytest.raises(CompiledBuildError, match="lacks scheduler"):
        select("fake", fake_build)


def test_a_build_holding_a_module_no_longer_compiled_is_refused(fake_build: Path) -> None:
    (fake_build / f"events{SUFFIX}").write_bytes(b"")
    with pytest.raises(CompiledBuildError, match=r"not compiled any more \(events\)"):
        select("fake", fake_build)


def test_a_build_without_its_digests_is_refused(fake_build: Path) -> None:
    (fake_build / compiled.DIGESTS_FILE).unlink()
    with pytest.raises(CompiledBuildError, match="compiled from other sources"):
        select("fake", fake_build)


def test_the_sources_are_run_on_request(fake_build: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A stale build stands aside when the sources are asked for.
    (fake_build / "kv.py").write_text("NAME = 'kv, edited'\n")
    monkeypatch.setenv(INTERPRETED, "1")
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    select("fake", fake_build)
    spec = sys.meta_path[0].find_spec("fake.kv", None)
    assert spec is not None and spec.origin == str(fake_build / "kv.py")
    assert sys.meta_path[0].find_spec("fake.trace", None) is None


def test_an_unknown_choice_is_refused(fake_build: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(INTERPRETED, "yes")
    with pytest.raises(CompiledBuildError, match=f"{INTERPRETED}='yes'"):
        select("fake", fake_build)
