"""The import rules of docs/design.md §3.1 that the import contracts cannot state.

pyproject.toml's ``[tool.importlinter]`` contracts (``lint-imports``, run by
scripts/test.sh) say who may import what. Two rules are beyond them, and are checked here:

- where: vLLM and torch (in integration/ and the tests) and z3 (in spec/arith.py) are
  imported inside functions only, so importing dualbudget never imports vLLM and no
  reference run loads z3;
- completeness: every third-party package the code imports is named by the contracts,
  so a new one cannot slip past the layer rules unnamed.

And the contracts are shown to catch a violation planted in a copy of the package.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import dualbudget
from tests.paths import REPO

PACKAGE = Path(dualbudget.__file__).parent
PYPROJECT = REPO / "pyproject.toml"

FOLDERS = ("spec", "reference", "proofs", "integration", "dualbudget", "tests")
LAZY_IN = {"vllm": FOLDERS, "torch": FOLDERS, "z3": ("spec",)}
"""Where each package may be imported inside functions only: vLLM and torch everywhere,
z3 in spec/ (whose arith.py alone imports it, as the contracts check; proofs/ imports it
at module level)."""


def _contracts() -> list[dict[str, Any]]:
    contracts: list[dict[str, Any]] = tomllib.loads(PYPROJECT.read_text())["tool"]["importlinter"][
        "contracts"
    ]
    return contracts


def _module_level_imports(path: Path) -> set[str]:
    """The top-level package of every import written at a module's top level (an import
    under ``if TYPE_CHECKING:`` or inside a function is not at the top level)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found = set()
    for node in tree.body:
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found.add(node.module.split(".")[0])
    return found


def test_vllm_torch_and_z3_are_imported_inside_functions_only() -> None:
    bad = []
    for package, folders in LAZY_IN.items():
        for path in (path for folder in folders for path in sorted((REPO / folder).rglob("*.py"))):
            if package in _module_level_imports(path):
                bad.append(f"{path.relative_to(REPO)} imports {package} at module level")
    assert not bad, "\n".join(bad)


def test_the_check_sees_a_module_level_import(tmp_path: Path) -> None:
    planted = tmp_path / "planted.py"
    planted.write_text("import vllm.config\nfrom torch import nn\n\ndef f():\n    import z3\n")
    assert _module_level_imports(planted) == {"vllm", "torch"}


def _named_by_the_contracts() -> set[str]:
    named: set[str] = set()
    for contract in _contracts():
        for key in ("forbidden_modules", "protected_modules"):
            named |= {module for module in contract.get(key, []) if "." not in module}
    return named


def test_every_third_party_package_the_code_imports_is_named_by_a_contract() -> None:
    # Imported here: grimp comes with the static tools (dev.lock), which the vLLM
    # environments, collecting this module for their live tests, do not hold.
    import grimp

    graph = grimp.build_graph("dualbudget", include_external_packages=True, cache_dir=None)
    imported = {module.split(".")[0] for module in graph.modules} - {"dualbudget"}
    # _typeshed exists for the type checker alone (imported under TYPE_CHECKING).
    third_party = imported - set(sys.stdlib_module_names) - {"__future__", "_typeshed"}
    assert third_party, "the import graph holds no third-party package: is it built?"
    unnamed = third_party - _named_by_the_contracts()
    assert not unnamed, f"name these in pyproject.toml's import contracts: {sorted(unnamed)}"


def test_the_contracts_catch_a_violation_planted_in_a_copy(tmp_path: Path) -> None:
    # The copy holds the files themselves (the links dualbudget/spec -> ../spec followed),
    # so lint-imports, run from it, builds its graph from the copy and not the checkout.
    copy = tmp_path / "dualbudget"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__", "traces"))
    (copy / "spec" / "planted_violation.py").write_text("from dualbudget.reference import events\n")
    lint_imports = Path(sys.executable).parent / "lint-imports"
    run = subprocess.run(
        [str(lint_imports), "--config", str(PYPROJECT), "--no-cache"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert run.returncode == 1, run.stdout + run.stderr
    assert "dualbudget.spec.planted_violation -> dualbudget.reference.events" in run.stdout
