"""``--vllm-src``'s overlay, without vLLM: the tree's Python over the installed parts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from dualbudget.integration import vllm_source
from dualbudget.integration.vllm_source import (
    SCHEDULER_FILE,
    VllmSource,
    VllmSourceError,
    build_overlay,
    claims_release,
    provenance,
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


@pytest.mark.parametrize(
    "files",
    [
        {"vllm/__init__.py": "tree"},
        {"vllm/__init__.py": "tree", "vllm/v1/core/sched/other.py": "not the scheduler"},
    ],
    ids=["only-init", "no-scheduler"],
)
def test_a_tree_without_a_scheduler_is_refused_in_one_line(
    tmp_path: Path, files: dict[str, str]
) -> None:
    # Its overlay would link the installed scheduler, checked under the tree's name.
    tree = _package(tmp_path / "tree", files)
    with pytest.raises(VllmSourceError, match=rf"no {SCHEDULER_FILE}") as caught:
        use_vllm_source(tree)
    said = str(caught.value)
    assert "\n" not in said and str(tree) in said
    assert vllm_source.active_source() is None


def test_provenance_sorts_the_imported_core_modules_by_the_side_their_link_takes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    installed = _package(
        tmp_path / "site" / "vllm",
        {
            "__init__.py": "installed",
            "config.py": "installed config",
            "v1/__init__.py": "",
            "v1/core/__init__.py": "",
            "v1/core/sched/__init__.py": "",
            "v1/core/sched/scheduler.py": "installed scheduler",
            "v1/core/kv_cache_manager.py": "installed only",
        },
    )
    tree = _package(
        tmp_path / "tree",
        {
            "vllm/__init__.py": "tree",
            "vllm/v1/__init__.py": "",
            "vllm/v1/core/__init__.py": "",
            "vllm/v1/core/sched/__init__.py": "",
            "vllm/v1/core/sched/scheduler.py": "tree scheduler",
        },
    )
    overlay = tmp_path / "overlay"
    build_overlay(tree, installed, overlay)
    assert provenance() is None  # no tree active: nothing to sort

    def imported(name: str, file: str | None) -> None:
        module = ModuleType(name)
        module.__file__ = file
        monkeypatch.setitem(sys.modules, name, module)

    linked = overlay / "vllm"
    imported("vllm.v1.core", str(linked / "v1/core/__init__.py"))
    imported("vllm.v1.core.sched", str(linked / "v1/core/sched/__init__.py"))
    imported("vllm.v1.core.sched.scheduler", str(linked / "v1/core/sched/scheduler.py"))
    imported("vllm.v1.core.kv_cache_manager", str(linked / "v1/core/kv_cache_manager.py"))
    imported("vllm.v1.core.stray", str(tmp_path / "elsewhere.py"))
    imported("vllm.v1.core.namespace", None)  # no file: nothing to sort
    imported("vllm.config", str(linked / "config.py"))  # outside vllm.v1.core
    imported("vllm.v1.core_like", str(linked / "config.py"))  # not a submodule
    monkeypatch.setattr(
        vllm_source, "_active", VllmSource(tree.resolve(), overlay, installed, "0.0.0")
    )
    found = provenance()
    assert found is not None
    assert found.from_tree == ("vllm.v1.core", "vllm.v1.core.sched", "vllm.v1.core.sched.scheduler")
    assert found.from_installed == ("vllm.v1.core.kv_cache_manager",)
    assert found.from_elsewhere == ("vllm.v1.core.stray",)
    assert not found.all_from_tree
    line = found.report()
    assert "\n" not in line and line.startswith(f"vllm.v1.core: 3 modules from {tree.resolve()}")
    assert (
        f"1 modules taken from the installed vLLM at {installed}: vllm.v1.core.kv_cache_manager"
    ) in line
    assert found.note() == (
        "1 vllm.v1.core modules from installed,"
        " 1 vllm.v1.core modules from neither tree nor installed"
    )
    assert found.to_json() == {
        "tree": str(tree.resolve()),
        "from_tree": list(found.from_tree),
        "from_installed": ["vllm.v1.core.kv_cache_manager"],
        "from_elsewhere": ["vllm.v1.core.stray"],
    }


def test_a_checkout_with_its_environment_inside_counts_the_environment_as_installed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The tree's side is its vllm/ folder, not the checkout holding a .venv beside it.
    tree = _package(
        tmp_path / "checkout",
        {"vllm/__init__.py": "tree", "vllm/v1/core/sched/scheduler.py": "tree scheduler"},
    )
    installed = _package(
        tree / ".venv" / "site-packages" / "vllm",
        {"__init__.py": "", "v1/core/block_pool.py": "installed only"},
    )
    overlay = tmp_path / "overlay"
    build_overlay(tree, installed, overlay)
    for name, rel in (
        ("vllm.v1.core.sched.scheduler", "v1/core/sched/scheduler.py"),
        ("vllm.v1.core.block_pool", "v1/core/block_pool.py"),
    ):
        module = ModuleType(name)
        module.__file__ = str(overlay / "vllm" / rel)
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setattr(
        vllm_source, "_active", VllmSource(tree.resolve(), overlay, installed, "0.0.0")
    )
    found = provenance()
    assert found is not None
    assert found.from_tree == ("vllm.v1.core.sched.scheduler",)
    assert found.from_installed == ("vllm.v1.core.block_pool",)
    assert found.all_from_tree is False and found.from_elsewhere == ()


def test_a_tree_holding_every_checked_module_reports_them_all_as_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = {"__init__.py": "", "v1/core/sched/scheduler.py": "scheduler"}
    installed = _package(tmp_path / "site" / "vllm", files)
    tree = _package(tmp_path / "tree", {f"vllm/{k}": v for k, v in files.items()})
    overlay = tmp_path / "overlay"
    build_overlay(tree, installed, overlay)
    module = ModuleType("vllm.v1.core.sched.scheduler")
    module.__file__ = str(overlay / "vllm" / "v1/core/sched/scheduler.py")
    monkeypatch.setitem(sys.modules, module.__name__, module)
    monkeypatch.setattr(
        vllm_source, "_active", VllmSource(tree.resolve(), overlay, installed, "0.0.0")
    )
    found = provenance()
    assert found is not None and found.all_from_tree and found.note() == ""
    assert found.report() == f"vllm.v1.core: 1 modules from {tree.resolve()}"


def test_a_run_over_a_stand_in_vllm_reports_the_files_the_tree_lacks(tmp_path: Path) -> None:
    # use_vllm_source end to end, in a fresh process: a stand-in installed vLLM holding the
    # scheduler path's modules (empty), and a tree holding only vllm/ and its scheduler.
    modules = [m.replace(".", "/") for m in vllm_source.SCHEDULER_PATH[1:]]
    packages = ["v1/__init__", "v1/core/__init__", "v1/core/sched/__init__"]
    site = tmp_path / "site"
    _package(
        site / "vllm",
        {"__init__.py": "__version__ = '0.0.1'"}
        | {f"{m.removeprefix('vllm/')}.py": "" for m in modules}
        | {f"{p}.py": "" for p in packages},
    )
    tree = _package(
        tmp_path / "tree",
        {"vllm/__init__.py": "__version__ = '9.9.9.dev0'", SCHEDULER_FILE: "x = 1"},
    )
    program = (
        "import json\n"
        "from dualbudget.integration.vllm_source import provenance, use_vllm_source\n"
        f"source = use_vllm_source({str(tree)!r})\n"
        "found = provenance()\n"
        "print(json.dumps([source.version, found.report(), found.to_json()]))\n"
    )
    path = os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH")) if p)
    done = subprocess.run(
        [sys.executable, "-c", program],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": path},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    version, line, written = json.loads(done.stdout.strip().splitlines()[-1])
    assert version == "9.9.9.dev0"
    assert written["from_tree"] == ["vllm.v1.core.sched.scheduler"]
    assert written["from_installed"] == [
        "vllm.v1.core",
        "vllm.v1.core.sched",
        "vllm.v1.core.sched.async_scheduler",
    ]
    assert line.startswith(f"vllm.v1.core: 1 modules from {tree.resolve()}; 3 modules taken")
