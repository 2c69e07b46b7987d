"""What a kept campaign's key hashes (``integration/sources.py``): every vLLM module a
step's decision passes through, not the scheduler's folder alone, and dualbudget's own
sources."""

from __future__ import annotations

from pathlib import Path

import pytest

from dualbudget.integration.sources import DIGESTED, VLLM_SOURCES, project_digest, vllm_digest


def _fake_vllm(tmp_path: Path) -> Path:
    package = tmp_path / "vllm"
    for part in VLLM_SOURCES:
        path = package / part
        if path.suffix == ".py":
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(f"# {part}\n")
        else:
            path.mkdir(parents=True, exist_ok=True)
            (path / "__init__.py").write_text(f"# {part}\n")
    (package / "v1" / "core" / "sched").mkdir()
    (package / "v1" / "core" / "sched" / "scheduler.py").write_text("# scheduler\n")
    (package / "v1" / "core" / "block_pool.py").write_text("# block pool\n")
    (package / "entrypoints.py").write_text("# serving, no decision\n")
    return package


@pytest.mark.parametrize(
    "edited", ["v1/core/block_pool.py", "v1/core/sched/scheduler.py", "config/__init__.py"]
)
def test_an_edit_of_a_deciding_module_changes_the_vllm_digest(tmp_path: Path, edited: str) -> None:
    package = _fake_vllm(tmp_path)
    before = vllm_digest(package)
    (package / edited).write_text("# edited\n")
    assert vllm_digest(package) != before


def test_a_module_that_decides_nothing_leaves_the_digest(tmp_path: Path) -> None:
    package = _fake_vllm(tmp_path)
    before = vllm_digest(package)
    (package / "entrypoints.py").write_text("# edited\n")
    assert vllm_digest(package) == before


def test_an_older_layout_without_a_part_still_digests(tmp_path: Path) -> None:
    package = _fake_vllm(tmp_path)
    (package / "v1" / "kv_cache_interface.py").unlink()
    assert len(vllm_digest(package)) == 64


def test_an_edit_of_the_reference_changes_the_project_digest(tmp_path: Path) -> None:
    for folder in DIGESTED:
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "a.py").write_text(f"# {folder}\n")
    (tmp_path / "proofs" / "manifest.toml").write_text("")
    before = project_digest(tmp_path)
    (tmp_path / "reference" / "a.py").write_text("# edited\n")
    assert project_digest(tmp_path) != before
