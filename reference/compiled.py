"""The reference's compiled build: the modules every scheduling step runs through,
compiled by mypyc from the very sources beside them (docs/reference.md, "The compiled
build"). The sources stay the reference that people read and tests patch; the build only
runs them faster, and is used only while it matches them byte for byte.

``setup.py`` reads ``COMPILED_MODULES`` and ``write_digests`` from this file by path, before
the package can be imported: it imports nothing of the project's.
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

KERNELS_MODULE = "budget_kernels"
"""The one compiled module with no source in the repository: the budget kernel's classes,
which ``setup.py`` writes from ``budget_kernel.kernel_module_source`` before it compiles."""

COMPILED_MODULES = (
    "budget_kernel",
    KERNELS_MODULE,
    "state",
    "prefix_cache",
    "kv",
    "kv_single_type",
    "kv_hybrid",
    "kv_hybrid_caching",
    "kv_coordinator",
    "scheduler",
    "async_scheduler",
)
"""The modules of ``dualbudget.reference`` that mypyc compiles: the scheduling loop, its
budget kernel, the KV managers and the state they change. A compiled module calls the
others natively, so the build is all of them or none."""

BUILD_INPUTS = ("../spec/compiled_book.py", "../spec/kernel.py")
"""Files beside the package's folder that ``KERNELS_MODULE`` is written from: the stored
templates and the interface the methods are typed by. The build records their digests too,
so that a template changed since the build refuses it as an edited source does."""

GROUP = "native"
"""The build's shared library, ``dualbudget.reference.native__mypyc``: the code of every
compiled module (mypyc's ``group_name``), inside the package so that an editable install
finds it."""

DIGESTS_FILE = "compiled-sources.sha256"
"""Beside the modules: the SHA-256 of each source the build was compiled from."""

INTERPRETED = "DUALBUDGET_INTERPRETED"
"""The environment variable that makes the reference run its sources even where a compiled
build sits beside them: ``1`` (the test suites set it, so that a test may plant a
difference in a method) or ``0``."""

FOLDER = Path(__file__).resolve().parent


class CompiledBuildError(ImportError):
    """The compiled build beside the sources cannot be used: built from other sources, or
    only part of it present."""


DIGESTED = (*(f"{name}.py" for name in COMPILED_MODULES), *BUILD_INPUTS)
"""What the build records a digest of, by path relative to the package's folder: each
compiled module's source and the ``BUILD_INPUTS``."""


def source_digests(folder: Path) -> dict[str, str]:
    """The SHA-256 of each of ``DIGESTED`` in ``folder``; a file that is not there has none."""
    return {
        source: hashlib.sha256((folder / source).read_bytes()).hexdigest()
        for source in DIGESTED
        if (folder / source).exists()
    }


def write_digests(folder: Path) -> None:
    """Record what the build about to be compiled is compiled from (``setup.py``)."""
    lines = [f"{digest}  {source}\n" for source, digest in source_digests(folder).items()]
    (folder / DIGESTS_FILE).write_text("".join(lines))


def _recorded_digests(folder: Path) -> dict[str, str]:
    path = folder / DIGESTS_FILE
    if not path.exists():
        return {}
    recorded = {}
    for line in path.read_text().splitlines():
        digest, _, source = line.partition("  ")
        recorded[source] = digest
    return recorded


def extension_files(folder: Path) -> dict[str, Path]:
    """The modules of ``folder`` built for this interpreter (extension modules), by name."""
    # Most specific first (``.cpython-311-...so`` before ``.so``), as the import system
    # tries them: each file is named by the first that fits.
    suffixes = importlib.machinery.EXTENSION_SUFFIXES
    found = {}
    for path in folder.iterdir():
        suffix = next((s for s in suffixes if path.name.endswith(s)), None)
        if suffix is not None:
            found[path.name[: -len(suffix)]] = path
    return found


def extension_modules(folder: Path) -> list[str]:
    """The names of ``extension_files``, sorted."""
    return sorted(extension_files(folder))


def interpreted_requested() -> bool:
    """Whether ``DUALBUDGET_INTERPRETED`` asks for the sources; refuses any value but 0 and 1."""
    value = os.environ.get(INTERPRETED, "0")
    if value not in ("0", "1"):
        raise CompiledBuildError(f"{INTERPRETED}={value!r}: set it to 1 (the sources) or 0")
    return value == "1"


class _SourcesFirst(importlib.abc.MetaPathFinder):
    """Finds a compiled module of the reference as its source file, past its build."""

    def __init__(self, package: str, folder: Path) -> None:
        self.package, self.folder = package, folder

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        package, _, name = fullname.rpartition(".")
        if package != self.package or name not in COMPILED_MODULES:
            return None
        return importlib.util.spec_from_file_location(fullname, self.folder / f"{name}.py")


def select(package: str, folder: Path = FOLDER) -> None:
    """Let ``package`` (``dualbudget.reference``, in ``folder``) import its compiled build
    if one is there and matches its sources, else its sources; refuse a build that is
    stale, partial or holds other modules, rather than run code other than what the
    sources say."""
    built = extension_modules(folder)
    if not built:
        return
    if interpreted_requested():
        sys.meta_path.insert(0, _SourcesFirst(package, folder))
        return
    problem = _build_problem(folder, built)
    if problem:
        raise CompiledBuildError(
            f"the reference's compiled build in {folder} {problem}: rebuild it"
            " (DUALBUDGET_MYPYC=1 pip install --no-deps --no-build-isolation -e ., as"
            f" scripts/lib.sh's ensure_core_env does) or set {INTERPRETED}=1 to run the sources"
        )


def _build_problem(folder: Path, built: list[str]) -> str | None:
    """Why the build in ``folder`` (its extension modules ``built``) is not the sources'."""
    expected = {*COMPILED_MODULES, f"{GROUP}__mypyc"}
    stray = [name for name in built if name not in expected]
    if stray:
        return f"holds modules that are not compiled any more ({', '.join(stray)})"
    missing = sorted(expected - set(built))
    if missing:
        return f"lacks {', '.join(missing)}"
    recorded, current = _recorded_digests(folder), source_digests(folder)
    stale = [
        source
        for source in DIGESTED
        if source not in current or recorded.get(source) != current[source]
    ]
    if stale:
        return f"was compiled from other sources of {', '.join(stale)} than the ones there"
    return None


def build_name() -> str:
    """``mypyc`` where the reference runs its compiled build, else ``interpreted``."""
    scheduler = importlib.import_module(f"{__package__}.scheduler")
    compiled = isinstance(scheduler.__loader__, importlib.machinery.ExtensionFileLoader)
    return "mypyc" if compiled else "interpreted"
