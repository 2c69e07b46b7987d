"""The layering of docs/design.md §3.1, enforced on the source.

- spec/ imports nothing of dualbudget and nothing outside the standard library (z3 only
  in arith.py, where it builds formulas);
- reference/ imports only spec/ (and the standard library);
- proofs/ imports only spec/ (and z3);
- integration/ is the only place that imports vLLM, and only inside functions;
- the built wheel holds only the ``dualbudget`` namespace (no bare ``spec`` module).
"""

from __future__ import annotations

import ast
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
STDLIB = set(sys.stdlib_module_names) | {"__future__"}
FOLDER_OF = {
    "spec": "spec",
    "reference": "reference",
    "proofs": "proofs",
    "integration": "integration",
    "tests": "tests",
    "dualbudget": "dualbudget",
}


def _imports(path: Path) -> list[tuple[str, bool]]:
    """(absolute module, at module level?) for every import in a file."""
    tree = ast.parse(path.read_text(), filename=str(path))
    folder = path.relative_to(REPO).parts[0]
    found: list[tuple[str, bool]] = []
    top_level = {id(node) for node in tree.body}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, id(node) in top_level) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            # A relative import stays inside its own folder.
            module = f"dualbudget.{folder}" if node.level else node.module or ""
            found.append((module, id(node) in top_level))
    return found


def _files(folder: str) -> list[Path]:
    return sorted((REPO / folder).rglob("*.py"))


def _root(module: str) -> str:
    parts = module.split(".")
    if parts[0] == "dualbudget" and len(parts) > 1 and parts[1] in FOLDER_OF:
        return f"dualbudget.{parts[1]}"
    return parts[0]


Z3_IN_SPEC = {"arith.py"}
ALLOWED = {
    "spec": {"dualbudget.spec"},
    "reference": {"dualbudget.spec", "dualbudget.reference"},
    "proofs": {"dualbudget.spec", "dualbudget.proofs", "z3"},
}


@pytest.mark.parametrize("folder", sorted(ALLOWED))
def test_folder_imports_only_what_the_design_allows(folder: str) -> None:
    files = _files(folder)
    assert files, f"{folder}/ holds no Python file"
    bad = []
    for path in files:
        for module, at_top in _imports(path):
            root = _root(module)
            if root in STDLIB or root in ALLOWED[folder]:
                continue
            # z3, lazily, where spec builds formulas for the proofs: arith alone (the
            # reference's compiled book is generated ahead of time, in proofs/).
            if folder == "spec" and root == "z3" and path.name in Z3_IN_SPEC and not at_top:
                continue
            bad.append(f"{path.relative_to(REPO)} imports {module}")
    assert not bad, "\n".join(bad)


def test_only_integration_imports_vllm_and_only_lazily() -> None:
    bad = []
    for folder in FOLDER_OF:
        for path in _files(folder):
            for module, at_top in _imports(path):
                if _root(module) not in {"vllm", "torch"}:
                    continue
                if folder != "integration" and folder != "tests":
                    bad.append(f"{path.relative_to(REPO)} imports {module}")
                elif at_top:
                    bad.append(f"{path.relative_to(REPO)} imports {module} at module level")
    assert not bad, "\n".join(bad)


def test_the_layering_check_sees_a_planted_violation(tmp_path: Path) -> None:
    planted = REPO / "spec" / "_planted_violation.py"
    planted.write_text("from dualbudget.reference import events\n")
    try:
        with pytest.raises(AssertionError, match="_planted_violation"):
            test_folder_imports_only_what_the_design_allows("spec")
    finally:
        planted.unlink()


def test_wheel_installs_one_namespace(tmp_path: Path) -> None:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--wheel-dir",
            str(tmp_path),
            str(REPO),
        ],
        check=True,
    )
    (wheel,) = tmp_path.glob("dualbudget-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    roots = {name.split("/")[0] for name in names}
    assert roots == {"dualbudget", wheel.name.split("-")[0] + "-0.1.0.dist-info"}, roots
    for part in ("spec", "reference", "proofs", "integration", "tests"):
        assert f"dualbudget/{part}/__init__.py" in names
