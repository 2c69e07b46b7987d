"""The documents agree with the code and with each other.

- every generated block (scripts/render_docs.py) equals its rendering from the code, and
  each document holds the blocks it must (the contract in README.md, proofs/README.md and
  docs/design.md; the method table in docs/design.md);
- every relative Markdown link resolves to a file of the repository, and its anchor, if
  any, to a heading of that file;
- every document or file the code or the docs cite (a path ending in ``.md``, ``see
  PATH``, a path into a top-level folder such as ``reference/formats/trace.py``) exists in the
  repository, and every cited section of docs/design.md (``§N``, ``section N``) is one
  of its headings; nothing cites the folder outside the repository;
- docs/design.md has a row for every layout of the method table, and its format tables
  (rendered from the schemas) name every field the scenario, step record and trace writers
  write; every scenario a document shows parses;
- its contract map gives every contract item predicates that a proof evaluates and that
  its unit tests call, obligations, a unit test and a reference test.

Files are found with ``git ls-files`` (tracked, plus untracked files git does not
ignore), so a new file is checked the day it is added. Each checker is a function of a
root and its files, run here on the repository and, planted with failures, on a scratch
repository, so that the test is seen to fail.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import re
import subprocess
from collections.abc import Iterable
from pathlib import Path
from types import ModuleType

import pytest

from dualbudget.reference.events import (
    Abort,
    AddRequest,
    DraftProposals,
    ModelOutput,
    StepRecord,
)
from dualbudget.reference.formats.scenario import parse_scenario
from dualbudget.reference.formats.trace import TraceHeader, entry_to_json
from dualbudget.spec import scenario_format as keys
from dualbudget.spec.config import EngineConfig, SpeculativeConfig
from dualbudget.spec.methods import LAYOUT_NAMES
from tests.paths import REPO

DESIGN = "docs/design.md"
OUTSIDE = ".." + "/shared"
"""The folder beside the repository; spelled in two parts so that this file does not
cite it."""
TEXT_SUFFIXES = {".py", ".md", ".sh", ".toml", ".txt", ".cfg", ".ini", ".yml", ".yaml"}
OUTPUTS = {"design-review.md"}
"""Documents the project writes (``dualbudget report``), named in code but not cited."""


def _load_renderer() -> ModuleType:
    path = REPO / "scripts" / "render_docs.py"
    spec = importlib.util.spec_from_file_location("render_docs", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


render_docs = _load_renderer()


# -- discovery -------------------------------------------------------------------------
def repo_files(root: Path) -> list[str]:
    """The repository's files, relative to ``root``: tracked, plus untracked files that
    git does not ignore; deleted files left out."""
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=root,
        check=True,
        capture_output=True,
    ).stdout.decode()
    return sorted({name for name in out.split("\0") if name and (root / name).is_file()})


def text_files(root: Path, files: Iterable[str]) -> list[str]:
    """Files the citation checks read: known text suffixes, and scripts with a shebang."""
    found = []
    for name in files:
        path = root / name
        shebang = not path.suffix and path.read_bytes()[:2] == b"#!"
        if path.suffix in TEXT_SUFFIXES or shebang:
            found.append(name)
    return found


# -- Markdown --------------------------------------------------------------------------
FENCE = re.compile(r"^\s*(```|~~~)")
CODE_SPAN = re.compile(r"`+[^`\n]*`+")
LINK = re.compile(r"!?\[[^\]\n]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
LINK_DEFINITION = re.compile(r"^\s{0,3}\[[^\]\n]+\]:\s*<?(\S+?)>?(?:\s.*)?$")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:|^//")


def prose_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) outside fenced code blocks."""
    lines, fenced = [], False
    for lineno, line in enumerate(text.splitlines(), start=1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            lines.append((lineno, line))
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).lower()
    text = "".join(ch for ch in text if ch.isalnum() or ch in " -_")
    return text.replace(" ", "-")


def anchors(text: str) -> set[str]:
    seen: dict[str, int] = {}
    found = set()
    for _, line in prose_lines(text):
        match = HEADING.match(line)
        if not match:
            continue
        base = slug(match[2])
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def section_numbers(text: str) -> set[str]:
    """The numbers of the numbered headings: ``## 2. The contract`` is section 2."""
    numbers = set()
    for _, line in prose_lines(text):
        match = HEADING.match(line)
        number = re.match(r"(\d+(?:\.\d+)*)\.?\s", match[2] + " ") if match else None
        if number:
            numbers.add(number[1])
    return numbers


def _exists(root: Path, files: set[str], relative: str) -> bool:
    """Whether ``relative`` (already normalised against ``root``) is a file or a folder
    of the repository."""
    return relative in files or any(name.startswith(relative.rstrip("/") + "/") for name in files)


def _normalise(root: Path, base: Path, target: str) -> str | None:
    """``target`` relative to ``root``, read from the folder ``base``; None outside it."""
    resolved = (root / base / target).resolve()
    try:
        return resolved.relative_to(root.resolve()).as_posix()
    except ValueError:
        return None


def link_problems(root: Path, files: Iterable[str]) -> list[str]:
    """Every relative link of every Markdown file that names no file or heading."""
    files = list(files)
    known = set(files)
    problems = []
    for name in (f for f in files if f.endswith(".md")):
        text = (root / name).read_text()
        for lineno, line in prose_lines(text):
            prose = CODE_SPAN.sub("", line)
            targets = [m[1] for m in LINK.finditer(prose)]
            definition = LINK_DEFINITION.match(prose)
            if definition:
                targets.append(definition[1])
            for target in targets:
                if SCHEME.match(target):
                    continue
                path, _, anchor = target.partition("#")
                where = f"{name}:{lineno}: link {target!r}"
                if path:
                    relative = _normalise(root, Path(name).parent, path)
                    if relative is None or not _exists(root, known, relative):
                        problems.append(f"{where}: no such file in the repository")
                        continue
                else:
                    relative = name
                document = relative.endswith(".md") and relative in known
                if anchor and document and anchor not in anchors((root / relative).read_text()):
                    problems.append(f"{where}: {relative} has no heading #{anchor}")
    return problems


# -- citations -------------------------------------------------------------------------
CITED_DOCUMENT = re.compile(r"(?<![\w/.-])((?:\.\./)*\w[\w./-]*\.md)(?![\w/-])")
PATH_SUFFIXES = "py|md|sh|toml|txt|json|ndjson|gz"
CITED_SEE = re.compile(r"\b[Ss]ee\s+`?((?:\.\./)*(?:[\w.-]+/)+[\w-][\w.-]*\.\w+)")
CITED_SECTION = re.compile(
    r"(?<![\w/.-])((?:docs/)?design\.md)\]?(?:\([^)\s]*\))?(?:'s)?\s*"
    r"(?:§\s*|section\s+)(\d+(?:\.\d+)*)"
)
OWN_SECTION = re.compile(r"§\s*(\d+(?:\.\d+)*)")


def cited_paths_pattern(files: Iterable[str]) -> re.Pattern[str]:
    """A path into one of the repository's top-level folders, ending in a file suffix:
    ``reference/formats/scenario.py``, ``examples/dflash.json`` (globs are not paths)."""
    folders = sorted({name.split("/")[0] for name in files if "/" in name})
    roots = "|".join(re.escape(folder) for folder in folders) or "(?!)"
    return re.compile(rf"(?<![\w/.-])((?:{roots})/[\w./-]*\.(?:{PATH_SUFFIXES}))(?![\w/*<{{-])")


def _resolves(root: Path, known: set[str], name: str, cited: str) -> bool:
    """A cited path names a repository file from the root or from the citing file."""
    for base in (Path("."), Path(name).parent):
        relative = _normalise(root, base, cited)
        if relative is not None and _exists(root, known, relative):
            return True
    return False


def citation_problems(root: Path, files: Iterable[str]) -> list[str]:
    """Every citation of a document that is not in the repository, of a section that
    docs/design.md does not have, and of the folder outside the repository."""
    files = list(files)
    known = set(files)
    design = root / DESIGN
    sections = section_numbers(design.read_text()) if design.is_file() else set()
    cited_path = cited_paths_pattern(files)
    problems = []
    for name in text_files(root, files):
        for lineno, line in enumerate((root / name).read_text().splitlines(), start=1):
            where = f"{name}:{lineno}"
            if OUTSIDE in line:
                problems.append(f"{where}: cites {OUTSIDE}, outside the repository")
            cited = {m[1] for m in CITED_DOCUMENT.finditer(line)}
            cited |= {m[1] for m in CITED_SEE.finditer(line)}
            cited |= {m[1] for m in cited_path.finditer(line)}
            for path in sorted(cited):
                if Path(path).name in OUTPUTS:
                    continue
                if not _resolves(root, known, name, path):
                    problems.append(f"{where}: cites {path}, which is not in the repository")
            for match in CITED_SECTION.finditer(line):
                number = match[2]
                if number not in sections:
                    problems.append(f"{where}: cites {DESIGN} §{number}, which has no such section")
            if name == DESIGN:
                for match in OWN_SECTION.finditer(line):
                    if match[1] not in sections:
                        problems.append(f"{where}: cites §{match[1]}, which has no such section")
    return problems


# -- generated blocks ------------------------------------------------------------------
def block_problems(root: Path, files: Iterable[str]) -> list[str]:
    """Generated blocks that differ from their rendering, and required blocks missing."""
    problems = []
    for name in (f for f in files if f.endswith(".md")):
        path = root / name
        problems += [
            f"{name}: generated block {block!r} differs from its rendering"
            " (run scripts/render_docs.py)"
            for block in render_docs.stale_blocks(path)
        ]
    for name, wanted in render_docs.REQUIRED.items():
        path = root / name
        present = set(render_docs.block_names(path.read_text())) if path.is_file() else set()
        problems += [
            f"{name}: holds no generated {block!r} block"
            for block in wanted
            if block not in present
        ]
    return problems


# -- the tests -------------------------------------------------------------------------
@pytest.fixture(scope="module")
def files() -> list[str]:
    found = repo_files(REPO)
    assert DESIGN in found and "README.md" in found, "file discovery found no documents"
    return found


def _report(problems: list[str]) -> str:
    return f"{len(problems)} problem(s):\n" + "\n".join(problems)


def test_generated_blocks_equal_their_rendering(files: list[str]) -> None:
    problems = block_problems(REPO, files)
    assert not problems, _report(problems)


def test_the_contract_is_rendered_where_it_is_stated() -> None:
    contract = render_docs.RENDERERS["contract"]()
    for name in ("README.md", "proofs/README.md", DESIGN):
        assert contract in (REPO / name).read_text(), name
    assert "| `dspark-fill-in` |" in (REPO / DESIGN).read_text()


def test_the_contract_map_ties_every_item_to_its_predicates_proofs_and_tests() -> None:
    """The table of docs/design.md §2: every item has predicates, obligations, a unit test
    and a reference test; its unit tests call each of its predicates, and a module of
    proofs/ evaluates each predicate."""
    unit = render_docs.module_tests(render_docs.UNIT_TESTS)
    proofs = "\n".join(path.read_text() for path in sorted((REPO / "proofs").glob("*.py")))
    for row in render_docs.contract_rows():
        item = row.item.id
        assert row.predicates and row.checks and row.unit_tests and row.reference_tests, item
        called = {
            node.id
            for name in row.unit_tests
            for node in ast.walk(unit[name])
            if isinstance(node, ast.Name)
        }
        assert set(row.predicates) <= called, (item, set(row.predicates) - called)
        for predicate in row.predicates:
            assert re.search(rf"\b{predicate}\(", proofs), f"{predicate}: no proof evaluates it"


def test_markdown_links_resolve(files: list[str]) -> None:
    problems = link_problems(REPO, files)
    assert not problems, _report(problems)


def test_cited_documents_and_sections_exist(files: list[str]) -> None:
    problems = citation_problems(REPO, files)
    assert not problems, _report(problems)


def test_design_keeps_the_sections_the_code_cites() -> None:
    sections = section_numbers((REPO / DESIGN).read_text())
    assert {"1", "2", "3", "4", "5"} <= sections, sorted(sections)


def test_scenarios_shown_in_documents_parse(files: list[str]) -> None:
    shown = 0
    for name in (f for f in files if f.endswith(".md")):
        text = (REPO / name).read_text()
        for block in re.findall(r"```json\n(.*?)```", text, re.DOTALL):
            obj = json.loads(block)
            if obj.get("format") == "dualbudget-scenario":
                parse_scenario(obj)
                shown += 1
    assert shown >= 1, "no document shows a scenario"


def design_section(number: str) -> str:
    """The text of section ``number`` of docs/design.md, up to the next heading of its
    level or above."""
    lines = (REPO / DESIGN).read_text().splitlines()
    start = next(
        i for i, line in enumerate(lines) if re.match(rf"#+ {re.escape(number)}\.?\s", line)
    )
    level = len(lines[start]) - len(lines[start].lstrip("#"))
    end = next(
        (
            i
            for i in range(start + 1, len(lines))
            if HEADING.match(lines[i]) and len(lines[i]) - len(lines[i].lstrip("#")) <= level
        ),
        len(lines),
    )
    return "\n".join(lines[start:end])


def _table_keys(section: str) -> set[str]:
    """The first-column names of a section's table rows: ``| `name` | ... |``."""
    return set(re.findall(r"^\| `([a-z_]+)` \|", section, re.MULTILINE))


def test_design_method_table_has_every_layout() -> None:
    rows = re.findall(r"^\| `([a-z0-9-]+)` \|", design_section("1.2"), re.MULTILINE)
    assert rows == list(LAYOUT_NAMES)


def test_design_formats_name_every_field_the_code_writes() -> None:
    # The format tables are rendered from the schemas (a generated block each): what the
    # writers write must be in them.
    record = StepRecord(0, {}, {}, [], [], 0, 0)
    assert _table_keys(design_section("4.2")) == set(record.to_json())

    trace = design_section("4.3")
    entries: list[AddRequest | Abort | ModelOutput | DraftProposals] = [
        AddRequest("0", 1, 1, block_hashes=("ab",)),
        Abort("0"),
        ModelOutput({"0": 1}, {}, 0, block_hashes={"0": ("ab",)}),
        DraftProposals({}),
    ]
    written = [
        TraceHeader("0.32.0", "engine", EngineConfig(16, 4, 64, 16, 64)).to_json(),
        *(entry_to_json(entry) for entry in entries),
        {"event": "end", "steps": 0},
    ]
    for obj in written:
        if "event" in obj:
            heading = json.dumps({"event": obj["event"]})
            assert f"`{heading}`" in trace, obj["event"]
        assert set(obj) - {"event"} <= _table_keys(trace), obj

    config = EngineConfig(
        64,
        4,
        64,
        16,
        64,
        max_num_scheduled_tokens=8,
        speculative_config=SpeculativeConfig("dspark", 2, True, "anchor"),
        async_scheduling=True,
        enable_prefix_caching=True,
    )
    scenario = keys.scenario_json(
        "dual",
        config,
        [keys.request_json("0", 1, 1, abort_step=1, prompt_token_ids=[0])],
        keys.acceptance_json(per_position=[1.0], seed=1),
        keys.drafts_json(fixed=0),
        {0: {"0": 1}},
    )
    objects = (scenario, scenario["config"], scenario["config"]["speculative_config"])
    names = {*(key for obj in objects for key in obj), *scenario["requests"][0]}
    names |= {*scenario["acceptance"], "fixed", "explicit"}
    assert names <= _table_keys(design_section("4.1"))


# -- the checkers fail when they should ------------------------------------------------
MD, PY = ".md", ".py"
"""Built into file names at run time, so that this file cites no missing document."""


def _scratch_repo(root: Path, contents: dict[str, str]) -> list[str]:
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    for name, text in contents.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return repo_files(root)


def test_the_checkers_report_planted_failures(tmp_path: Path) -> None:
    design = "docs/design" + MD
    files = _scratch_repo(
        tmp_path,
        {
            ".gitignore": "ignored/\n",
            design: "# Design\n\n## 1. The problem\n\nAs §1 says, and §7.\n",
            "README" + MD: (
                f"[ok]({design}#1-the-problem) [gone](docs/gone{MD})"
                f" [bad anchor]({design}#nowhere)\n"
                f"`[not a link](docs/in-code{MD})`\n"
                "```\n[fenced](docs/fenced" + MD + ")\n```\n"
            ),
            f"spec/mod{PY}": (
                f'"""See {design} §1 and {design} §9; see docs/absent{MD}."""\n'
                f"# DESIGN{MD} section 2\n"
                f"# read {OUTSIDE}/notes{MD}\n"
                f"# see spec/gone{PY}; and spec/moved{PY}\n"
            ),
            "ignored/x" + MD: "[never read](nowhere" + MD + ")\n",
        },
    )
    assert "ignored/x" + MD not in files and f"spec/mod{PY}" in files
    links = link_problems(tmp_path, files)
    assert any(f"docs/gone{MD}" in p and "no such file" in p for p in links), links
    assert any("#nowhere" in p and "no heading" in p for p in links), links
    assert not any("#1-the-problem" in p or "in-code" in p or "fenced" in p for p in links)
    cites = citation_problems(tmp_path, files)
    assert any(f"cites docs/absent{MD}" in p for p in cites), cites
    assert any(f"cites DESIGN{MD}" in p for p in cites), cites
    assert any("§9" in p for p in cites) and not any("§1," in p for p in cites), cites
    assert any(p.startswith(f"{design}:5") and "§7" in p for p in cites), cites
    assert any(f"cites {OUTSIDE}" in p for p in cites), cites
    assert any(f"cites spec/gone{PY}" in p for p in cites), cites
    assert any(f"cites spec/moved{PY}" in p for p in cites), cites


def test_the_block_check_reports_a_stale_block(tmp_path: Path) -> None:
    page = tmp_path / ("page" + MD)
    page.write_text(
        "<!-- contract: generated from spec/contract.py -->\n- C1 old wording\n<!-- /contract -->\n"
    )
    assert render_docs.stale_blocks(page) == ["contract"]
    page.write_text(render_docs.render_text(page.read_text()))
    assert render_docs.stale_blocks(page) == []
