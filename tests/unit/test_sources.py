"""What a kept campaign's key hashes (``integration/sources.py``): every Python file of the
vLLM package, not the scheduler's folder alone, and dualbudget's own sources."""

from __future__ import annotations

from pathlib import Path

import pytest

from dualbudget.integration.sources import DIGESTED, project_digest, vllm_digest


def _fake_vllm(tmp_path: Path) -> Path:
    package = tmp_path / "vllm"
    for part in (
        "__init__.py",
        "v1/core/sched/scheduler.py",
        "v1/core/block_pool.py",
        "config/__init__.py",
        "entrypoints/api.py",
    ):
        path = package / part
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"# {part}\n")
    (package / "_C.abi3.so").write_bytes(b"compiled")
    return package


@pytest.mark.parametrize(
    "edited",
    [
        "v1/core/block_pool.py",
        "v1/core/sched/scheduler.py",
        "config/__init__.py",
        "entrypoints/api.py",
    ],
)
def test_an_edit_of_any_python_file_changes_the_vllm_digest(tmp_path: Path, edited: str) -> None:
    package = _fake_vllm(tmp_path)
    before = vllm_digest(package)
    (package / edited).write_text("# edited\n")
    assert vllm_digest(package) != before


def test_a_new_python_file_changes_the_digest_and_bytecode_does_not(tmp_path: Path) -> None:
    package = _fake_vllm(tmp_path)
    before = vllm_digest(package)
    cache = package / "v1" / "__pycache__"
    cache.mkdir()
    (cache / "x.cpython-311.pyc").write_bytes(b"bytecode")
    (package / "_C.abi3.so").write_bytes(b"rebuilt")
    assert vllm_digest(package) == before
    (package / "v1" / "new.py").write_text("# new\n")
    assert vllm_digest(package) != before


def test_a_linked_file_digests_as_its_target(tmp_path: Path) -> None:
    """A tree under review is run through links to its files (``vllm_source``): the
    digest reads the bytes behind them."""
    package = _fake_vllm(tmp_path)
    overlay = tmp_path / "overlay" / "vllm"
    for path in package.rglob("*.py"):
        link = overlay / path.relative_to(package)
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(path)
    assert vllm_digest(overlay) == vllm_digest(package)
    (package / "v1" / "core" / "block_pool.py").write_text("# edited\n")
    assert vllm_digest(overlay) == vllm_digest(package)


def test_an_edit_of_the_reference_changes_the_project_digest(tmp_path: Path) -> None:
    for folder in DIGESTED:
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "a.py").write_text(f"# {folder}\n")
    (tmp_path / "proofs" / "manifest.toml").write_text("")
    before = project_digest(tmp_path)
    (tmp_path / "reference" / "a.py").write_text("# edited\n")
    assert project_digest(tmp_path) != before
