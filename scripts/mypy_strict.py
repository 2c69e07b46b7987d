"""Run ``mypy --strict`` on every package of the distribution under its installed name.

The folders spec/, reference/, proofs/ and integration/ install as ``dualbudget.spec``,
``dualbudget.reference``, ... through a package-dir mapping that mypy cannot follow in an
editable install, so this lays a throwaway ``dualbudget`` package of symbolic links over
the real folders (and over the command line's own modules in dualbudget/) and checks it.
vLLM need not be installed: its values enter typed as ``Any`` (pyproject.toml).
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CHECKED = ("spec", "reference", "proofs", "integration")
"""The folders installed under ``dualbudget.*``; dualbudget/ itself is the package root."""


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        package = Path(tmp) / "dualbudget"
        package.mkdir()
        for module in sorted((REPO / "dualbudget").iterdir()):
            if module.suffix in (".py", ".typed"):
                (package / module.name).symlink_to(module)
        for folder in CHECKED:
            (package / folder).symlink_to(REPO / folder, target_is_directory=True)
        command = [
            sys.executable,
            "-m",
            "mypy",
            "--strict",
            "--config-file",
            str(REPO / "pyproject.toml"),
            "--cache-dir",
            str(Path(tmp) / "cache"),
            "-p",
            "dualbudget",
        ]
        return subprocess.call(command, cwd=tmp)


if __name__ == "__main__":
    raise SystemExit(main())
