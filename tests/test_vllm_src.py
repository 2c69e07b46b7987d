"""``--vllm-src``'s overlay, without vLLM: the tree's Python over the installed parts."""

from __future__ import annotations

from pathlib import Path

import pytest

from dualbudget.integration.vllm_source import (
    VllmSourceError,
    build_overlay,
    claims_release,
    use_vllm_source,
)


def _package(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_the_overlay_takes_the_trees_python_and_the_installed_compiled_parts(
    tmp_path: Path,
) -> None:
    installed = _package(
        tmp_path / "site" / "vllm",
        {
            "__init__.py": "installed",
            "_version.py": "installed version",
            "_C.abi3.so": "compiled",
            "v1/core/sched/scheduler.py": "installed scheduler",
            "v1/gone.py": "installed only",
        },
    )
    tree = _package(
        tmp_path / "tree",
        {
            "vllm/__init__.py": "tree",
            "vllm/v1/core/sched/scheduler.py": "tree scheduler",
            "vllm/v1/new_module.py": "tree only",
            "vllm/_C.abi3.so": "a stale build of the tree",
            "vllm/__pycache__/x.pyc": "cache",
        },
    )
    overlay = tmp_path / "overlay"
    build_overlay(tree, installed, overlay)
    read = {
        str(path.relative_to(overlay / "vllm")): path.read_text()
        for path in (overlay / "vllm").rglob("*")
        if path.is_file()
    }
    assert read == {
        "__init__.py": "tree",
        "_version.py": "installed version",
        "_C.abi3.so": "compiled",
        "v1/core/sched/scheduler.py": "tree scheduler",
        "v1/gone.py": "installed only",
        "v1/new_module.py": "tree only",
    }


def test_a_folder_without_vllm_is_refused_in_one_line(tmp_path: Path) -> None:
    with pytest.raises(VllmSourceError, match=r"no vllm/__init__\.py") as caught:
        use_vllm_source(tmp_path)
    assert "\n" not in str(caught.value) and str(tmp_path) in str(caught.value)


def test_without_a_tree_the_installed_versions_claims_apply() -> None:
    assert use_vllm_source(None) is None
    assert claims_release("dual", "0.33.0") == "0.33.0"
