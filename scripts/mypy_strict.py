"""Run ``mypy --strict`` on spec/ and reference/ under their installed names.

The folders install as ``dualbudget.spec`` and ``dualbudget.reference`` through a
package-dir mapping that mypy cannot follow in an editable install, so this lays a
throwaway ``dualbudget`` package of symbolic links over the real folders and checks that.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CHECKED = ("spec", "reference")


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        package = Path(tmp) / "dualbudget"
        package.mkdir()
        (package / "__init__.py").write_text("")
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
            *(str(package / folder) for folder in CHECKED),
        ]
        return subprocess.call(command, cwd=tmp)


if __name__ == "__main__":
    raise SystemExit(main())
