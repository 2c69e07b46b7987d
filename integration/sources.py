"""What a kept result depends on, as digests: the project's own sources and the checked
vLLM's Python.

A campaign (``campaign.store``) reuses a unit's result only under the same key, so the key
must change with everything the result depends on: the reference, the spec and the
adapter (``project_digest``), and every Python file of the vLLM package the run imports
(``vllm_digest``): a step's decision passes through the scheduler, the KV managers, the
request, the outputs and the config, and what else reaches it is not worth guessing.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
"""The checkout (``integration/`` resolved through ``dualbudget/integration``), or the
installed package."""
DIGESTED = ("spec", "reference", "integration", "proofs")
"""The folders whose ``.py`` files (and the proofs' manifest) a result depends on."""


def digest_files(paths: Iterable[Path], root: Path) -> str:
    """A hash of each file's path under ``root`` and its bytes, in path order."""
    sha = hashlib.sha256()
    for path in sorted(paths):
        sha.update(path.relative_to(root).as_posix().encode() + b"\0")
        sha.update(path.read_bytes() + b"\0")
    return sha.hexdigest()


def python_files(root: Path, parts: Iterable[str]) -> list[Path]:
    """The ``.py`` files of ``parts`` under ``root`` (a folder's, recursively, or the file
    itself); a part ``root`` lacks adds nothing (an older release's layout)."""
    files: list[Path] = []
    for part in parts:
        path = root / part
        if path.is_dir():
            files += [p for p in path.rglob("*.py") if "__pycache__" not in p.parts]
        elif path.is_file():
            files.append(path)
    return files


def project_digest(root: Path = ROOT) -> str:
    """A hash of every ``.py`` under spec/ reference/ integration/ proofs/ and the proofs'
    manifest, which names the known findings."""
    files = list(python_files(root, DIGESTED))
    return digest_files([*files, root / "proofs" / "manifest.toml"], root)


def vllm_digest(package: Path) -> str:
    """A hash of every ``.py`` of the vLLM package folder ``package`` (through an
    overlay's links under ``--vllm-src``: the tree's bytes); compiled parts are the
    installed release's, which its version names."""
    return digest_files(python_files(package, (".",)), package)
