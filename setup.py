"""The build. pyproject.toml declares the package; this adds, with DUALBUDGET_MYPYC=1, the
reference's scheduling loop compiled by mypyc (docs/reference.md, "The compiled build").
Without it the wheel is pure Python, for every supported interpreter."""

from __future__ import annotations

import importlib
import os
import runpy
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

REFERENCE = Path(__file__).resolve().parent / "reference"

choice = os.environ.get("DUALBUDGET_MYPYC", "0")
if choice not in ("0", "1"):
    raise SystemExit(f"setup.py: DUALBUDGET_MYPYC={choice!r}: set it to 1 (compile) or 0")
# By path: the package cannot be imported before it is built.
compiled = runpy.run_path(str(REFERENCE / "compiled.py"))
if choice == "1":
    try:
        from mypyc.build import mypycify
    except ImportError as err:
        raise SystemExit(
            "setup.py: DUALBUDGET_MYPYC=1 needs mypy (requirements/dev.lock) where the"
            " package is built: pip install --no-build-isolation"
        ) from err
    # An earlier build's modules go first: one no longer compiled would shadow its source
    # (and, stale, would refuse the import of the package below).
    for path in compiled["extension_files"](REFERENCE).values():
        path.unlink()
    # The kernel classes are written from the stored templates by the package's own code,
    # imported from this checkout, as pure Python now that no build is beside it.
    sys.path.insert(0, str(REFERENCE.parent))
    budget_kernel = importlib.import_module("dualbudget.reference.budget_kernel")
    kernels = REFERENCE / f"{compiled['KERNELS_MODULE']}.py"
    kernels.write_text(budget_kernel.kernel_module_source())
    compiled["write_digests"](REFERENCE)
    setup(
        ext_modules=mypycify(
            [f"dualbudget/reference/{name}.py" for name in compiled["COMPILED_MODULES"]],
            group_name=f"dualbudget.reference.{compiled['GROUP']}",
        )
    )
else:

    class PureBuildPy(build_py):
        """Leaves out the kernel classes a compiled build wrote beside the sources: the
        pure package executes them from the templates, and a copy could be stale."""

        def find_package_modules(
            self, package: str, package_dir: str
        ) -> list[tuple[str, str, str]]:
            modules: list[tuple[str, str, str]] = super().find_package_modules(package, package_dir)
            generated = ("dualbudget.reference", compiled["KERNELS_MODULE"])
            return [module for module in modules if module[:2] != generated]

    setup(cmdclass={"build_py": PureBuildPy})
