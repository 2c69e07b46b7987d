"""``--vllm-src DIR``: a vLLM source tree's Python run over the installed vLLM's compiled parts.

A reviewer holds a checkout of a pull request (or an unpacked sdist), not a build of it.
The scheduler, the config and the method table are pure Python, so the tree's ``.py``
files can run over the compiled extensions of the vLLM installed in this environment:
an overlay folder holds a ``vllm/`` package whose every file links to the tree's file of
that path where the tree has one, else to the installed one (the compiled ``.so`` parts,
and generated modules a checkout lacks, such as ``_version.py``). The overlay goes first
on ``sys.path`` here and on ``PYTHONPATH`` for the worker processes the fuzz starts (its
forkserver reads the environment, not this process's ``sys.path``), so that every process
imports the same vLLM. Nothing is built and nothing of the tree is copied.

A tree whose scheduler or config path imports a compiled part the installed vLLM lacks
(or one the installed build refuses to load) is refused with one line naming it, and so
is a tree without ``vllm/v1/core/sched/scheduler.py``: the overlay would link the
installed scheduler, which would then be checked under the tree's name.

Provenance: a tree may lack files the installed vLLM has, so some ``vllm.v1.core``
modules (the scheduler's package) can still be the installed ones. ``provenance`` sorts
the ``vllm.v1.core`` modules this process imported by where their overlay link points,
the tree or the installed package. It is checked in this process only, twice: once the
scheduler path is imported (``use_vllm_source`` refuses a scheduler that is not the
tree's) and after the fuzz (``run_fuzz_stage`` prints the line and writes it to the fuzz
JSON). The worker processes import through the same overlay (``PYTHONPATH``), so the same
files serve them; they are not checked one by one.
"""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from dualbudget.spec.errors import BadInput

COMPILED_SUFFIXES = (".so", ".pyd", ".dylib")
"""Files of a tree never used: the compiled parts come from the installed vLLM."""
SKIPPED_DIRS = ("__pycache__",)
SCHEDULER_PATH = (
    "vllm",
    "vllm.config",
    "vllm.v1.core.sched.scheduler",
    "vllm.v1.core.sched.async_scheduler",
    "vllm.v1.kv_cache_interface",
    "vllm.v1.outputs",
    "vllm.v1.request",
)
"""The modules the live adapter builds a scheduler from: imported once the overlay is
active, so that a missing compiled part is named before any check starts."""
SCHEDULER_FILE = "vllm/v1/core/sched/scheduler.py"
"""The file a tree must hold: without it the overlay links the installed scheduler."""
SCHEDULER_MODULE = "vllm.v1.core.sched.scheduler"
CHECKED_PACKAGE = "vllm.v1.core"
"""The package whose imported modules ``provenance`` sorts by origin."""


class VllmSourceError(BadInput):
    """A ``--vllm-src`` tree this environment cannot run."""


@dataclass(frozen=True)
class VllmSource:
    """An active ``--vllm-src``: the tree and the overlay this process imports vLLM from."""

    tree: Path
    overlay: Path
    installed: Path
    """The installed ``vllm`` package whose compiled parts the overlay links."""
    version: str
    """The overlay's ``vllm.__version__`` (the tree's own when it carries one)."""


_active: VllmSource | None = None


def active_source() -> VllmSource | None:
    """The ``--vllm-src`` this process runs, or None for the installed vLLM."""
    return _active


def _installed_package() -> Path:
    """The installed ``vllm`` package folder, found without importing it."""
    import importlib.util

    spec = importlib.util.find_spec("vllm")
    if spec is None or spec.submodule_search_locations is None:
        raise VllmSourceError(
            f"--vllm-src needs an installed vLLM for its compiled parts; none in {sys.executable}"
        )
    return Path(next(iter(spec.submodule_search_locations)))


def _package_of(tree: Path) -> Path:
    package = tree / "vllm"
    if not (package / "__init__.py").is_file():
        raise VllmSourceError(f"--vllm-src {tree}: no vllm/__init__.py (not a vLLM source tree)")
    if not (tree / SCHEDULER_FILE).is_file():
        raise VllmSourceError(
            f"--vllm-src {tree}: no {SCHEDULER_FILE} (the installed vLLM's scheduler would"
            " be checked under the tree's name)"
        )
    return package


def build_overlay(tree: Path, installed: Path, overlay: Path) -> None:
    """Fill ``overlay/vllm`` with links: the tree's files over the installed package's."""
    source = _package_of(tree)
    target = overlay / "vllm"
    for root in (installed, source):
        from_tree = root == source
        for folder, dirs, files in os.walk(root):
            dirs[:] = [d for d in dirs if d not in SKIPPED_DIRS]
            rel = Path(folder).relative_to(root)
            (target / rel).mkdir(parents=True, exist_ok=True)
            for name in files:
                if from_tree and name.endswith(COMPILED_SUFFIXES):
                    continue
                link = target / rel / name
                if link.is_symlink():
                    link.unlink()
                link.symlink_to(Path(folder) / name)


def use_vllm_source(tree: str | Path | None) -> VllmSource | None:
    """Run ``tree``'s vLLM Python in this process and its workers (None: the installed
    vLLM, nothing changes). Raises ``VllmSourceError`` (bad input) for a tree that is not
    one, or whose scheduler path needs a compiled part the installed vLLM lacks."""
    global _active
    if tree is None:
        return None
    root = Path(tree).resolve()
    if _active is not None:
        if _active.tree == root:
            return _active
        raise VllmSourceError(f"--vllm-src {root}: another tree ({_active.tree}) already runs")
    _package_of(root)
    loaded = sys.modules.get("vllm")
    if loaded is not None:
        raise VllmSourceError(
            f"--vllm-src {root}: vLLM was imported from {loaded.__file__} before the tree"
        )
    installed = _installed_package()
    overlay = Path(tempfile.mkdtemp(prefix="dualbudget-vllm-src-"))
    atexit.register(shutil.rmtree, overlay, True)
    build_overlay(root, installed, overlay)
    sys.path.insert(0, str(overlay))
    previous = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(overlay), previous) if p)
    version = _import_scheduler_path(root, installed)
    # The first provenance check: the scheduler checked must be the tree's own.
    if SCHEDULER_MODULE not in classify(root, installed, dict(sys.modules)).from_tree:
        where = getattr(sys.modules.get(SCHEDULER_MODULE), "__file__", None)
        raise VllmSourceError(
            f"--vllm-src {root}: {SCHEDULER_MODULE} was imported from {where}, not the tree"
        )
    _active = VllmSource(root, overlay, installed, version)
    return _active


def _import_scheduler_path(tree: Path, installed: Path) -> str:
    """Import the modules a live scheduler needs; the overlay's ``vllm.__version__``."""
    from .live import set_environment

    set_environment()
    for module in SCHEDULER_PATH:
        try:
            __import__(module)
        except ModuleNotFoundError as err:
            missing = err.name or str(err)
            what = "a compiled part" if missing.startswith("vllm.") else "a module"
            raise VllmSourceError(
                f"--vllm-src {tree}: {module} imports {missing}, {what} the installed vLLM"
                f" at {installed} lacks"
            ) from None
        except ImportError as err:
            line = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise VllmSourceError(
                f"--vllm-src {tree}: {module} cannot load over the installed vLLM's compiled"
                f" parts ({line})"
            ) from None
        except Exception as err:  # the tree's own code fails on import: named in one line
            raise VllmSourceError(
                f"--vllm-src {tree}: importing {module} fails ({type(err).__name__}: {err})"
            ) from None
    import vllm

    return str(vllm.__version__)


@dataclass(frozen=True)
class Provenance:
    """Where the ``vllm.v1.core`` modules a process imported under a tree came from."""

    tree: Path
    installed: Path
    from_tree: tuple[str, ...]
    from_installed: tuple[str, ...]
    """Modules the tree lacks, so the overlay links the installed vLLM's file."""
    from_elsewhere: tuple[str, ...] = ()
    """Modules whose file lies in neither (put in ``sys.modules`` by other means)."""

    @property
    def all_from_tree(self) -> bool:
        return not (self.from_installed or self.from_elsewhere)

    def report(self) -> str:
        """One line: how many modules came from the tree, and any that did not, named."""
        line = f"{CHECKED_PACKAGE}: {len(self.from_tree)} modules from {self.tree}"
        if self.from_installed:
            line += (
                f"; {len(self.from_installed)} modules taken from the installed vLLM at"
                f" {self.installed}: {', '.join(self.from_installed)}"
            )
        if self.from_elsewhere:
            line += (
                f"; {len(self.from_elsewhere)} modules from neither:"
                f" {', '.join(self.from_elsewhere)}"
            )
        return line

    def note(self) -> str:
        """A short note for a verdict row; empty when every module is the tree's."""
        parts = [
            f"{len(found)} {CHECKED_PACKAGE} modules from {where}"
            for found, where in (
                (self.from_installed, "installed"),
                (self.from_elsewhere, "neither tree nor installed"),
            )
            if found
        ]
        return ", ".join(parts)

    def to_json(self) -> dict[str, Any]:
        return {
            "tree": str(self.tree),
            "from_tree": list(self.from_tree),
            "from_installed": list(self.from_installed),
            "from_elsewhere": list(self.from_elsewhere),
        }


def _under(path: Path, root: Path) -> bool:
    return path.is_relative_to(root) or path.resolve().is_relative_to(root.resolve())


def classify(tree: Path, installed: Path, modules: Mapping[str, ModuleType]) -> Provenance:
    """Sort the ``vllm.v1.core`` modules of ``modules`` by origin. An overlay file is a
    link: its own target (``os.readlink``, as ``build_overlay`` wrote it) says which side
    it was taken from, before any link inside the tree or the installed package is
    followed. The tree's side is its ``vllm/`` folder, so that a virtual environment kept
    inside the checkout counts as installed."""
    package = tree / "vllm"
    found: dict[str, list[str]] = {"tree": [], "installed": [], "elsewhere": []}
    for name, module in sorted(modules.items()):
        if name != CHECKED_PACKAGE and not name.startswith(CHECKED_PACKAGE + "."):
            continue
        file = getattr(module, "__file__", None)
        if file is None:  # a namespace package: no file to come from anywhere
            continue
        path = Path(file)
        target = path.parent / os.readlink(path) if path.is_symlink() else path
        if _under(target, package):
            found["tree"].append(name)
        elif _under(target, installed):
            found["installed"].append(name)
        else:
            found["elsewhere"].append(name)
    return Provenance(
        tree,
        installed,
        tuple(found["tree"]),
        tuple(found["installed"]),
        tuple(found["elsewhere"]),
    )


def provenance() -> Provenance | None:
    """The origin of every ``vllm.v1.core`` module this process has imported so far, or
    None without an active ``--vllm-src``."""
    if _active is None:
        return None
    return classify(_active.tree, _active.installed, dict(sys.modules))


def claims_release(profile: str, version: str) -> str:
    """The vLLM version whose mutation-equivalence claims hold for ``profile``: the
    installed ``version``, or with a tree active, the release the tree decides as (its
    version string says nothing of its code). A tree that decides as no release is
    refused: no claims were written for it."""
    if _active is None:
        return version
    from dualbudget.spec.profiles import profile_named

    release = profile_named(profile).vllm_version
    if release is None:
        raise VllmSourceError(
            f"--vllm-src {_active.tree}: decides as {profile}, which no release ships;"
            " mutate's equivalence claims are written per release"
        )
    return release
