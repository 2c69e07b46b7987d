"""Render the generated blocks of the Markdown documents from the code they describe.

A generated block is the text between ``<!-- NAME: generated from SOURCE ... -->`` and
``<!-- /NAME -->``. Its content is a function of the code (the contract of
spec/contract.py, the method table of spec/methods.py, ...), so a document cannot drift
from the code: ``tests/unit/test_docs.py`` fails when a block differs from its rendering, and

    .venv/bin/python scripts/render_docs.py           # rewrite every block in place
    .venv/bin/python scripts/render_docs.py --check   # exit 1, naming the stale blocks

This script only rewrites blocks that are already there; where a document shows a block
is the document's choice (``REQUIRED`` names the blocks each document must hold).
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
import tomllib
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, NamedTuple

from dualbudget.proofs.manifest import load_manifest
from dualbudget.proofs.obligations import BRANCHES, CHAIN, catalog, lower_of
from dualbudget.proofs.strengthenings import NEEDED, SHOWN
from dualbudget.reference.formats.deployments import deployments_markdown
from dualbudget.reference.formats.scenario import scenario_markdown
from dualbudget.reference.formats.settings import settings_markdown
from dualbudget.reference.formats.trace_schema import step_record_markdown, trace_markdown
from dualbudget.spec.contract import (
    BOOKS,
    CONTRACT,
    ContractItem,
    books_markdown,
    contract_markdown,
)
from dualbudget.spec.methods import LAYOUTS, MethodLayout, PerK
from dualbudget.spec.profiles import PROFILE_NAMES, PROFILES
from dualbudget.spec.releases import RELEASES

REPO = Path(__file__).resolve().parent.parent

BLOCK = re.compile(
    r"(?P<open><!-- (?P<name>[a-z][a-z-]*): generated from [^>]*-->\n)"
    r"(?P<body>.*?)"
    r"(?P<close><!-- /(?P=name) -->)",
    re.DOTALL,
)
"""A generated block; its body is everything between the two marker lines."""

CONTRACTS: list[dict[str, Any]] = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"][
    "importlinter"
]["contracts"]
"""The import-linter contracts of pyproject.toml, which ``lint-imports`` enforces."""


def layers() -> list[list[str]]:
    """The layers contract's layers, top first, each the folders of its packages: the top
    layer is the modules of ``dualbudget/`` itself (the contract names them one by one
    and is exhaustive, so a package no layer names fails ``lint-imports``)."""
    (contract,) = [c for c in CONTRACTS if c["type"] == "layers"]
    # ``a : b`` names modules of one layer that may import each other (the command
    # line's), ``a | b`` independent packages.
    return [
        ["dualbudget"] if ":" in layer else [name.strip() for name in layer.split("|")]
        for layer in contract["layers"]
    ]


MODULE_FOLDERS = tuple(folder for layer in reversed(layers()) for folder in layer)
"""Every package of the distribution, bottom layer first."""


# -- the renderings ----------------------------------------------------------------------
def _per_k(value: PerK) -> str:
    """``per_k * K + const`` as it reads in the design: ``0``, ``1``, ``K``, ``K - 1``."""
    if value.per_k == 0:
        return str(value.const)
    k = "K" if value.per_k == 1 else f"{value.per_k}K"
    if value.const == 0:
        return k
    return f"{k} {'+' if value.const > 0 else '-'} {abs(value.const)}"


def draft_rows_formula(layout: MethodLayout) -> str:
    """``C(q) = e*q + f(K)`` of one row, written out: ``q + K - 1``, ``K + 1``, ``0``."""
    e, f = layout.carries_target_rows, layout.draft_extra
    target = "" if e == 0 else ("q" if e == 1 else f"{e}q")
    extra = "" if f.per_k == 0 and f.const == 0 else _per_k(f)
    if target and extra:
        return f"{target} {extra}" if extra.startswith("-") else f"{target} + {extra}"
    return target or extra or "0"


def _method_cell(layout: MethodLayout) -> str:
    methods = ", ".join(f"`{method}`" for method in layout.methods)
    if layout.dspark_layout is not None:
        methods += f" (`dspark_layout: {layout.dspark_layout}`)"
    return methods


def _parallel_cell(layout: MethodLayout) -> str:
    if layout.parallel_drafting is None:
        return "forced on by vLLM"
    return str(layout.parallel_drafting).lower()


def method_table() -> str:
    """The method table of spec/methods.py ``LAYOUTS``, one row per layout, with each
    release's columns (spec/releases.py)."""
    versions = tuple(RELEASES)
    header = [
        "layout",
        "vLLM `method`",
        "`parallel_drafting`",
        "`C(q)`",
        *(f"slots {v}" for v in versions),
        *(f"`num_lookahead_tokens` {v}" for v in versions),
        "why",
    ]
    lines = [_row(header), _row(["---"] * len(header))]
    for layout in LAYOUTS:
        lines.append(
            _row(
                [
                    f"`{layout.name}`",
                    _method_cell(layout),
                    _parallel_cell(layout),
                    f"`{draft_rows_formula(layout)}`",
                    *(f"`{_per_k(RELEASES[v].slots[layout.name])}`" for v in versions),
                    *(f"`{_per_k(RELEASES[v].lookahead[layout.name])}`" for v in versions),
                    layout.why,
                ]
            )
        )
    return "\n".join(lines) + "\n"


def profile_table() -> str:
    """The profiles of spec/profiles.py ``PROFILES``: name, policy, the release it runs
    on, summary."""
    header = ["profile", "policy", "vLLM release", "what it does"]
    lines = [_row(header), _row(["---"] * len(header))]
    for profile in PROFILES.values():
        release = profile.release.version
        lines.append(
            _row([f"`{profile.name}`", f"`{profile.policy.name}`", release, profile.summary])
        )
    return "\n".join(lines) + "\n"


UNIT_TESTS = "tests/unit/test_contract.py"
"""Each item's predicates on hand-worked cases, true and false."""
REFERENCE_TESTS = "tests/worked/test_contract_reference.py"
"""Each item as the reference scheduler sees it, on a hand-worked step."""


class ContractRow(NamedTuple):
    """One contract item and where it lives, each part read off its home."""

    item: ContractItem
    predicates: tuple[str, ...]
    """The functions of spec/invariants.py whose docstring opens with the item's id."""
    checks: dict[str, tuple[str, ...]]
    """Obligation family -> the checks of the catalog that prove the item (``X``: the
    profile a C6 obligation's profile relaxes)."""
    unit_tests: tuple[str, ...]
    """The functions ``test_c<N>_...`` of ``UNIT_TESTS``."""
    reference_tests: tuple[str, ...]
    """The functions ``test_c<N>_...`` of ``REFERENCE_TESTS``."""


def module_tests(relative: str) -> dict[str, ast.FunctionDef]:
    """The module-level test functions of a test file, by name, in file order."""
    tree = ast.parse((REPO / relative).read_text())
    return {
        node.name: node
        for node in tree.body
        if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")
    }


def _tests_of(relative: str, item: str) -> tuple[str, ...]:
    prefix = f"test_{item.lower()}_"
    return tuple(name for name in module_tests(relative) if name.startswith(prefix))


def contract_rows() -> list[ContractRow]:
    """Each item of ``CONTRACT`` with its predicates, its obligations, its tests."""
    tree = ast.parse((REPO / "spec" / "invariants.py").read_text())
    stated: dict[str, list[str]] = {item.id: [] for item in CONTRACT}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            opening = re.match(r"(C[1-9])[ ,:]", ast.get_docstring(node) or "")
            if opening and opening[1] in stated:
                stated[opening[1]].append(node.name)
    checks: dict[str, dict[str, list[str]]] = {item.id: {} for item in CONTRACT}
    for ob in catalog():
        lower = lower_of(ob.profile)
        check = ob.check.replace(f"-vs-{lower}", "-vs-X") if ob.family == "C6" else ob.check
        family = checks[ob.contract].setdefault(ob.family, [])
        if check not in family:
            family.append(check)
    return [
        ContractRow(
            item,
            tuple(stated[item.id]),
            {family: tuple(names) for family, names in checks[item.id].items()},
            _tests_of(UNIT_TESTS, item.id),
            _tests_of(REFERENCE_TESTS, item.id),
        )
        for item in CONTRACT
    ]


def contract_map() -> str:
    """Each contract item to the predicates that state it, the obligation families and
    checks that prove it, its unit test and its reference test."""
    header = [
        "item",
        "kind",
        "predicates (`spec/invariants.py`)",
        "obligation family: checks (`proofs/obligations.py`)",
        f"unit test (`{UNIT_TESTS}`)",
        f"reference test (`{REFERENCE_TESTS}`)",
    ]
    lines = [_row(header), _row(["---"] * len(header))]

    def code(names: Iterable[str]) -> str:
        return ", ".join(f"`{name}`" for name in names) or "none"

    for row in contract_rows():
        families = "; ".join(f"`{family}`: {code(names)}" for family, names in row.checks.items())
        lines.append(
            _row(
                [
                    f"{row.item.id} {row.item.name}",
                    row.item.kind,
                    code(row.predicates),
                    families or "none",
                    code(row.unit_tests),
                    code(row.reference_tests),
                ]
            )
        )
    return "\n".join(lines) + "\n"


def dominance_chain() -> str:
    """The pairs C6 compares (``CHAIN`` and ``BRANCHES`` of proofs/obligations.py)."""
    chain = " ≥ ".join(f"`{profile}`" for profile in CHAIN)
    branches = ", ".join(f"`{upper}` ≥ `{lower}`" for upper, lower in BRANCHES.items())
    return (
        f"- the chain, each profile against the next: {chain};\n"
        f"- off the chain, each proposal against the profile it claims to relax: {branches}.\n"
    )


def strengthening_table() -> str:
    """Which strengthening of C6's relation each link needs (proofs/strengthenings.py)."""
    header = ["pair", "layouts", "strengthening", "why"]
    lines = [_row(header), _row(["---"] * len(header))]
    for row in NEEDED:
        if row.strengthenings is None:
            needed = "—"
        else:
            needed = ", ".join(SHOWN[name] for name in row.strengthenings) or "none"
        pair = f"{row.upper} ≥ {lower_of(row.upper)}"
        lines.append(_row([pair, ", ".join(row.layouts), needed, row.why]))
    return "\n".join(lines) + "\n"


def findings_table() -> str:
    """The expected failures of proofs/manifest.toml, one row per profile, check and
    finding (its ``[why]``), with the layouts it holds on."""
    manifest = load_manifest()
    found: dict[tuple[str, str, str, str], list[str]] = {}
    for ob in catalog():
        if manifest.expected(ob.name) == "fails":
            key = (ob.profile, ob.contract, ob.check, manifest.why[ob.name])
            found.setdefault(key, []).append(ob.layout)
    header = ["profile", "check", "layouts", "finding"]
    lines = [_row(header), _row(["---"] * len(header))]
    # Per profile by contract item; within an item, the catalog's order.
    for key in sorted(found, key=lambda key: (PROFILE_NAMES.index(key[0]), key[1])):
        profile, _, check, why = key
        lines.append(_row([profile, check, ", ".join(found[key]), why]))
    return "\n".join(lines) + "\n"


def books_proofs_table() -> str:
    """Each book item with what a budget policy decides of it, the checks that prove that
    part for every profile and layout (``ContractItem.proven_by``), and where the manifest
    expects one of them to fail: a profile that breaks the item's policy part."""
    manifest = load_manifest()
    header = ["item", "what a budget policy decides of it", "proven by", "broken by"]
    lines = [_row(header), _row(["---"] * len(header))]
    for item in BOOKS:
        broken: dict[str, list[str]] = {}
        for ob in catalog():
            if ob.check in item.proven_by and manifest.expected(ob.name) == "fails":
                broken.setdefault(f"{ob.profile} ({ob.check})", []).append(ob.layout)
        where = "; ".join(f"{key}: {', '.join(layouts)}" for key, layouts in broken.items())
        checks = ", ".join(f"`{check}`" for check in item.proven_by) or "nothing to prove"
        lines.append(_row([f"{item.id} {item.name}", item.policy, checks, where or "no profile"]))
    return "\n".join(lines) + "\n"


def layers_markdown() -> str:
    """The layers, top first, and every import contract, as ``lint-imports`` checks them."""
    lines = [_row(["layer", "packages", "may import"]), _row(["---", "---", "---"])]
    stack = layers()
    for index, layer in enumerate(stack):
        below = [f"`{folder}/`" for lower in stack[index + 1 :] for folder in lower]
        packages = ", ".join(f"`{folder}/`" for folder in layer)
        if len(layer) > 1:
            packages += " (independent: none imports another)"
        lines.append(_row([str(index + 1), packages, ", ".join(below) or "nothing of dualbudget"]))
    contracts = "".join(f"- {contract['name']}\n" for contract in CONTRACTS)
    return "\n".join(lines) + "\n\nThe contracts, each as its `name` states it:\n\n" + contracts


def module_summary(path: Path) -> str:
    """The first paragraph of a module's docstring, on one line, RST literals as Markdown."""
    docstring = ast.get_docstring(ast.parse(path.read_text(), filename=str(path))) or ""
    paragraph = " ".join(docstring.split("\n\n")[0].split())
    return paragraph.replace("``", "`")


def module_table() -> str:
    """Every module of the distribution's packages with the first paragraph of its
    docstring (the top ``__init__`` files and ``__main__`` say nothing more)."""
    lines = [_row(["module", "what it is"]), _row(["---", "---"])]
    for folder in MODULE_FOLDERS:
        for path in sorted((REPO / folder).rglob("*.py")):
            relative = path.relative_to(REPO)
            top_init = path.name == "__init__.py" and relative.parent == Path(folder)
            if path.name == "__main__.py" or top_init:
                continue
            # A subpackage is listed by its folder, with its __init__'s docstring.
            name = f"{relative.parent.as_posix()}/" if path.name == "__init__.py" else relative
            lines.append(_row([f"`{name}`", module_summary(path)]))
    return "\n".join(lines) + "\n"


def _row(cells: list[str]) -> str:
    return "| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |"


RENDERERS: dict[str, Callable[[], str]] = {
    "contract": contract_markdown,
    "contract-map": contract_map,
    "books": books_markdown,
    "books-proofs": books_proofs_table,
    "dominance-chain": dominance_chain,
    "strengthenings": strengthening_table,
    "findings": findings_table,
    "methods": method_table,
    "profiles": profile_table,
    "modules": module_table,
    "layers": layers_markdown,
    "settings": settings_markdown,
    "deployments": deployments_markdown,
    "scenario-format": scenario_markdown,
    "step-record": step_record_markdown,
    "trace-format": trace_markdown,
}
"""Each block name and the function that renders its body."""

REQUIRED: dict[str, tuple[str, ...]] = {
    "README.md": ("contract", "profiles"),
    "proofs/README.md": ("contract", "dominance-chain", "strengthenings", "findings"),
    "docs/design.md": (
        "contract",
        "contract-map",
        "books",
        "books-proofs",
        "layers",
        "methods",
        "profiles",
        "modules",
        "scenario-format",
        "step-record",
        "trace-format",
    ),
    "docs/traces.md": ("settings",),
    "docs/reference.md": ("deployments",),
}
"""The blocks each document must hold; any document may hold any other block."""


# -- rewriting ---------------------------------------------------------------------------
def render_text(text: str) -> str:
    """``text`` with the body of every generated block replaced by its rendering.

    Raises KeyError for a block whose name has no renderer."""

    def replace(match: re.Match[str]) -> str:
        body = RENDERERS[match["name"]]()
        return match["open"] + body + match["close"]

    return BLOCK.sub(replace, text)


def block_names(text: str) -> list[str]:
    return [match["name"] for match in BLOCK.finditer(text)]


def stale_blocks(path: Path) -> list[str]:
    """The blocks of ``path`` whose body differs from the rendering (or that lack one)."""
    text = path.read_text()
    stale = []
    for match in BLOCK.finditer(text):
        renderer = RENDERERS.get(match["name"])
        if renderer is None:
            stale.append(f"{match['name']} (no renderer for this block name)")
        elif match["body"] != renderer():
            stale.append(match["name"])
    return stale


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="rewrite nothing; exit 1 on drift")
    args = parser.parse_args(argv)
    failures = []
    for name, wanted in REQUIRED.items():
        path = REPO / name
        missing = sorted(set(wanted) - set(block_names(path.read_text())))
        failures += [f"{name}: no {block} block" for block in missing]
        stale = stale_blocks(path)
        if args.check:
            failures += [f"{name}: block {block} differs from its rendering" for block in stale]
        elif stale:
            path.write_text(render_text(path.read_text()))
            print(f"{name}: rewrote {', '.join(stale)}")
    for failure in failures:
        print(failure, file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
