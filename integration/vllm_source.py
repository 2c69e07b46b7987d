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
(or one the installed build refuses to load) is refused with one line naming it.
"""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

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
