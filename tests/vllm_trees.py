"""vLLM source trees made at test time from the installed vLLM's own Python.

A tree is what ``--vllm-src`` takes: a folder holding ``vllm/`` with the package's
Python files (and its data files), no compiled part. Trees are copied from the wheel
installed in the running environment, given a version string and transformed in place
(``transform``: an ``ast.NodeTransformer`` applied to one module), so that nothing of
vLLM is stored in this repository. The installed package is found without importing it,
so that a test process may run a tree in a subprocess after importing vLLM itself.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

COMPILED_SUFFIXES = (".so", ".pyd", ".dylib")
SCHEDULER_MODULE = "v1/core/sched/scheduler.py"


def installed_package() -> Path:
    """The installed ``vllm`` package folder."""
    spec = importlib.util.find_spec("vllm")
    assert spec is not None and spec.submodule_search_locations is not None, "no vLLM"
    return Path(next(iter(spec.submodule_search_locations)))


def installed_version() -> str:
    """The installed vLLM's ``__version__``, read from its ``_version.py`` unimported."""
    text = (installed_package() / "_version.py").read_text()
    match = re.search(r"^__version__ = version = '([^']+)'", text, re.MULTILINE)
    assert match is not None, "no __version__ in the installed vllm/_version.py"
    return match[1]


def copy_installed_sources(dest: Path, version: str | None = None) -> Path:
    """``dest`` (created) holding ``vllm/``: the installed package less its compiled parts
    and caches; with ``version``, its ``_version.py`` says that version (a development
    version string makes the tree no known release build)."""
    ignore = shutil.ignore_patterns("__pycache__", *(f"*{s}" for s in COMPILED_SUFFIXES))
    shutil.copytree(installed_package(), dest / "vllm", ignore=ignore)
    if version is not None:
        set_version(dest, version)
    return dest


def set_version(tree: Path, version: str) -> None:
    parts = tuple(int(p) if p.isdigit() else p for p in version.split("."))
    (tree / "vllm" / "_version.py").write_text(
        f"__version__ = version = {version!r}\n"
        f"__version_tuple__ = version_tuple = {parts!r}\n"
        "__commit_id__ = commit_id = None\n"
    )


def development_version(installed: str) -> str:
    """A development version of the installed release's line (``0.33.0`` ->
    ``0.33.1.dev0+tree``)."""
    major, minor, *rest = installed.split("+")[0].split(".")
    patch = int(rest[0]) + 1 if rest and rest[0].isdigit() else 0
    return f"{major}.{minor}.{patch}.dev0+tree"


def transform(tree: Path, module: str, transformer: ast.NodeTransformer) -> int:
    """Rewrite ``tree``'s ``vllm/<module>`` by ``transformer``; the nodes it changed
    (its ``changed`` attribute), which a caller asserts is above zero."""
    path = tree / "vllm" / module
    parsed = ast.parse(path.read_text())
    rewritten = ast.fix_missing_locations(transformer.visit(parsed))
    path.write_text(ast.unparse(rewritten))
    return int(getattr(transformer, "changed", 0))


def run_in_tree(tree: Path, code: str, timeout: float = 600) -> Any:
    """Run ``code`` in a fresh Python of this environment with ``tree`` active
    (``use_vllm_source``); the JSON it prints last."""
    program = (
        "from dualbudget.integration.vllm_source import use_vllm_source\n"
        f"use_vllm_source({str(tree)!r})\n" + code
    )
    done = subprocess.run(
        [sys.executable, "-c", program],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "VLLM_LOGGING_LEVEL": "ERROR"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def dualbudget(
    *args: str, timeout: float = 900, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """``dualbudget ARGS`` in this environment (in ``cwd``, where a plugin module must be
    importable from), its output captured."""
    return subprocess.run(
        [sys.executable, "-m", "dualbudget", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        env={**os.environ, "VLLM_LOGGING_LEVEL": "ERROR"},
    )


# -- the budget of vLLM's Scheduler.schedule, rewritten ------------------------------------
# vLLM charges one input budget ``input_budget`` per scheduled request ``q + draft_slots``,
# stops its loops once ``input_budget <= draft_slots`` and grants at most
# ``input_budget - draft_slots``. ``SplitBudget`` rewrites those four places to charge a
# separate budget ``per * q + fixed`` rows, with ``(per, fixed)`` from a terms function
# injected into the module: vLLM's own rule is ``(1, draft_slots)``.

SPLIT_DRAFT_TERMS = '''
def _draft_budget_terms(spec, draft_slots):
    """vllm-project/vllm#53080: every method's draft rows C(q) = per * q + fixed, charged
    to a draft budget of max_num_batched_tokens rows beside the target budget."""
    if spec is None:
        return 1, 0
    k = spec.num_speculative_tokens
    if spec.method in ("ngram", "suffix"):
        return 0, 0
    if spec.method in ("eagle", "eagle3", "mtp"):
        return 1, k - 1 if spec.parallel_drafting else 0
    if spec.method == "draft_model":
        return 1, k if spec.parallel_drafting else 1
    if spec.method == "dflash":
        return 0, k + 1
    if spec.method == "dspark":
        anchor = getattr(spec.draft_model_config.hf_config, "sample_from_anchor", True)
        return 0, k if anchor is not False else k + 1
    return 1, draft_slots
'''

DSPARK_QUERY_TERMS = '''
def _draft_budget_terms(spec, draft_slots):
    """vllm-project/vllm#52996: DSpark charges K query rows of a separate draft-input
    budget of max_num_batched_tokens rows; every other method q + draft_slots."""
    if spec is not None and spec.method == "dspark":
        return 0, spec.num_speculative_tokens
    return 1, draft_slots
'''


def _name(node: ast.AST, name: str) -> bool:
    return isinstance(node, ast.Name) and node.id == name


def _expr(source: str) -> ast.expr:
    return ast.parse(source, mode="eval").body


class SplitBudget(ast.NodeTransformer):
    """``Scheduler.schedule``'s input budget charged ``per * q + fixed`` rows."""

    def __init__(self, terms: str) -> None:
        self.terms = terms
        self.changed = 0

    def visit_Module(self, node: ast.Module) -> ast.Module:
        self.generic_visit(node)
        node.body.extend(ast.parse(self.terms).body)
        return node

    def visit_Assign(self, node: ast.Assign) -> Any:
        if (
            len(node.targets) == 1
            and _name(node.targets[0], "token_budget")
            and ast.unparse(node.value) == "self.max_num_scheduled_tokens"
        ):
            # The target budget opens at min(S, B): where a request is charged fewer
            # rows than its tokens (per 0), B no longer bounds its grant otherwise. Under
            # vLLM's own rule (per 1) the input budget binds first, so nothing changes.
            self.changed += 1
            node.value = _expr(
                "min(self.max_num_scheduled_tokens, self.scheduler_config.max_num_batched_tokens)"
            )
            return node
        if len(node.targets) == 1 and _name(node.targets[0], "draft_slots"):
            self.changed += 1
            terms = ast.parse(
                "draft_per_token, draft_fixed = _draft_budget_terms(spec, draft_slots)"
            ).body[0]
            return [node, terms]
        return self.generic_visit(node)

    def visit_Compare(self, node: ast.Compare) -> ast.expr:
        self.generic_visit(node)
        if (
            _name(node.left, "input_budget")
            and len(node.ops) == 1
            and isinstance(node.ops[0], ast.LtE)
            and _name(node.comparators[0], "draft_slots")
        ):
            self.changed += 1
            return _expr("input_budget - draft_fixed < draft_per_token")
        return node

    def visit_BinOp(self, node: ast.BinOp) -> ast.expr:
        self.generic_visit(node)
        if (
            isinstance(node.op, ast.Sub)
            and _name(node.left, "input_budget")
            and _name(node.right, "draft_slots")
        ):
            self.changed += 1
            return _expr(
                "(input_budget - draft_fixed if draft_per_token"
                " else token_budget if input_budget >= draft_fixed else 0)"
            )
        return node

    def visit_AugAssign(self, node: ast.AugAssign) -> ast.AugAssign:
        value = node.value
        if (
            _name(node.target, "input_budget")
            and isinstance(value, ast.BinOp)
            and isinstance(value.op, ast.Add)
            and _name(value.right, "draft_slots")
        ):
            self.changed += 1
            rows = ast.BinOp(ast.Name("draft_per_token", ast.Load()), ast.Mult(), value.left)
            node.value = ast.BinOp(rows, ast.Add(), ast.Name("draft_fixed", ast.Load()))
        return node


class DraftBudgetAdmission(ast.NodeTransformer):
    """``VllmConfig._set_max_num_scheduled_tokens`` under #53080: a config is accepted
    when ``max_num_batched_tokens`` holds one request's draft rows C(1), and the draft
    budget, not a cap on running requests, bounds DFlash/DSpark."""

    def __init__(self) -> None:
        self.changed = 0
        self.inside = False

    def visit_FunctionDef(self, node: ast.FunctionDef) -> ast.FunctionDef:
        if node.name != "_set_max_num_scheduled_tokens":
            return node
        self.inside = True
        self.generic_visit(node)
        self.inside = False
        return node

    def visit_If(self, node: ast.If) -> ast.If:
        self.generic_visit(node)
        test = node.test
        if (
            isinstance(test, ast.Compare)
            and _name(test.left, "max_num_batched_tokens")
            and isinstance(test.ops[0], ast.LtE)
        ):
            self.changed += 1
            node.test = _expr(
                "max_num_batched_tokens < sum(_draft_budget_terms(self.speculative_config, 0))"
            )
        elif "use_dflash" in ast.unparse(test):
            self.changed += 1
            node.test = ast.Constant(False)
        return node

    def visit_Module(self, node: ast.Module) -> ast.Module:
        self.generic_visit(node)
        node.body.extend(ast.parse(SPLIT_DRAFT_TERMS).body)
        return node


class ForgottenSlotRefund(ast.NodeTransformer):
    """A planted bug: a preempted request's refund gives back its tokens but not the
    draft slots it was charged (``input_budget += restored``)."""

    def __init__(self) -> None:
        self.changed = 0

    def visit_AugAssign(self, node: ast.AugAssign) -> ast.AugAssign:
        value = node.value
        if (
            _name(node.target, "input_budget")
            and isinstance(node.op, ast.Add)
            and isinstance(value, ast.BinOp)
            and _name(value.right, "draft_slots")
        ):
            self.changed += 1
            node.value = value.left
        return node


class PaddingKeptWhole(ast.NodeTransformer):
    """A crash fixed: ``long_prefill_token_threshold`` no longer cuts a spec-decode request
    ``Scheduler.schedule`` has just padded to 1 + K rows (the padded rows are speculative
    positions, not prefill), so vLLM's assertion that a padded request keeps 1 + K rows
    holds. Only the threshold's cut after the padding (the waiting loop's) changes."""

    def __init__(self) -> None:
        self.changed = 0
        self.padded = False

    def visit_Assign(self, node: ast.Assign) -> ast.Assign:
        if (
            len(node.targets) == 1
            and _name(node.targets[0], "pad_spec_decode")
            and isinstance(node.value, ast.Constant)
            and node.value.value is True
        ):
            self.padded = True
        return node

    def visit_If(self, node: ast.If) -> ast.If:
        test = node.test
        if (
            self.padded
            and isinstance(test, ast.Compare)
            and len(test.comparators) == 2
            and _name(test.comparators[0], "long_prefill_token_threshold")
        ):
            self.changed += 1
            self.padded = False
            node.test = ast.BoolOp(ast.And(), [_expr("not pad_spec_decode"), test])
        self.generic_visit(node)
        return node


# -- the scheduler's books, each broken by one planted edit -----------------------------
# One small edit of vLLM's own code per item of C7-C13 (spec/contract.py BOOKS), found in
# every release from 0.32 on; ``books_broken_tree`` plants one of them.


class _OneEdit(ast.NodeTransformer):
    """Counts what it changes (``transform`` asserts it changed something)."""

    def __init__(self) -> None:
        self.changed = 0


class DraftPlaceholdersForgotten(_OneEdit):
    """C7: ``AsyncScheduler`` adds a placeholder for the sampled token but none for the
    drafts scheduled with it."""

    def visit_AugAssign(self, node: ast.AugAssign) -> ast.AugAssign:
        value = node.value
        if (
            isinstance(node.target, ast.Attribute)
            and node.target.attr == "num_output_placeholders"
            and isinstance(value, ast.BinOp)
            and _name(value.right, "cur_num_spec_tokens")
        ):
            self.changed += 1
            node.value = value.left
        return node


class DraftsUntrimmed(_OneEdit):
    """C8: a request cut below 1 + K tokens keeps one draft more than its rows hold."""

    def visit_Assign(self, node: ast.Assign) -> ast.Assign:
        if len(node.targets) == 1 and _name(node.targets[0], "num_scheduled_spec_tokens"):
            self.changed += 1
            node.value = ast.BinOp(node.value, ast.Add(), ast.Constant(1))
        return node


class LookaheadSlotsForgotten(_OneEdit):
    """C9: a running request's blocks are allocated without the drafting lookahead."""

    def visit_keyword(self, node: ast.keyword) -> ast.keyword:
        if node.arg == "num_lookahead_tokens" and (
            ast.unparse(node.value) == "self.num_lookahead_tokens"
        ):
            self.changed += 1
            node.value = ast.Constant(0)
        return node


class SampledRoomForgotten(_OneEdit):
    """C10: the length cap leaves no room for the token a step samples."""

    def visit_BinOp(self, node: ast.BinOp) -> ast.expr:
        self.generic_visit(node)
        if (
            isinstance(node.op, ast.Sub)
            and ast.unparse(node.right) == "self.num_sampled_tokens_per_step"
            and ast.unparse(node.left).startswith("self.max_model_len")
        ):
            self.changed += 1
            return node.left
        return node


class ComputedKeptOnPreemption(_OneEdit):
    """C11: a preempted request keeps its computed tokens."""

    def visit_FunctionDef(self, node: ast.FunctionDef) -> ast.FunctionDef:
        if node.name != "_preempt_request":
            return node
        kept = [
            stmt for stmt in node.body if ast.unparse(stmt) != "request.num_computed_tokens = 0"
        ]
        self.changed += len(node.body) - len(kept)
        node.body = kept
        return node


class StaleOutputDeliveredAtReset(_OneEdit):
    """C12: ``reset_prefix_cache`` preempts the running requests without dropping their
    output in flight, which then arrives for positions they may have scheduled again."""

    def visit_FunctionDef(self, node: ast.FunctionDef) -> ast.FunctionDef:
        if node.name != "reset_prefix_cache":
            return node
        for keyword in ast.walk(node):
            if (
                isinstance(keyword, ast.keyword)
                and keyword.arg == "drop_stale_output"
                and isinstance(keyword.value, ast.Constant)
                and keyword.value.value is True
            ):
                self.changed += 1
                keyword.value = ast.Constant(False)
        return node


class TablesKeptOnFree(_OneEdit):
    """C13: freeing a request's blocks returns them to the pool but leaves them in its
    table (``req_to_blocks.get`` for ``.pop``), so the table holds free blocks."""

    def visit_Call(self, node: ast.Call) -> ast.Call:
        self.generic_visit(node)
        func = node.func
        if (
            isinstance(func, ast.Attribute)
            and func.attr == "pop"
            and ast.unparse(func.value) == "self.req_to_blocks"
            and [ast.unparse(arg) for arg in node.args[:1]] == ["request_id"]
        ):
            self.changed += 1
            func.attr = "get"
        return node


BOOKS_BROKEN: dict[str, tuple[str, type[_OneEdit]]] = {
    "C7": ("v1/core/sched/async_scheduler.py", DraftPlaceholdersForgotten),
    "C8": (SCHEDULER_MODULE, DraftsUntrimmed),
    "C9": (SCHEDULER_MODULE, LookaheadSlotsForgotten),
    "C10": (SCHEDULER_MODULE, SampledRoomForgotten),
    "C11": (SCHEDULER_MODULE, ComputedKeptOnPreemption),
    "C12": (SCHEDULER_MODULE, StaleOutputDeliveredAtReset),
    "C13": ("v1/core/single_type_kv_cache_manager.py", TablesKeptOnFree),
}
"""Each item of the books, the module its planted edit changes and the edit."""


def books_broken_tree(dest: Path, version: str, item: str) -> Path:
    """The installed sources with ``item``'s planted edit (``BOOKS_BROKEN``), made once."""
    module, edit = BOOKS_BROKEN[item]
    tree = copy_installed_sources(dest, version)
    assert transform(tree, module, edit()) == 1, f"{item}: the edit found no single place"
    return tree


CONFIG_MODULE = "config/vllm.py"


def split_draft_budget_tree(dest: Path, version: str) -> Path:
    """The installed sources as vllm-project/vllm#53080 proposes them."""
    tree = copy_installed_sources(dest, version)
    assert transform(tree, SCHEDULER_MODULE, SplitBudget(SPLIT_DRAFT_TERMS)) >= 9
    assert transform(tree, CONFIG_MODULE, DraftBudgetAdmission()) >= 1
    return tree


def dspark_query_budget_tree(dest: Path, version: str) -> Path:
    """The installed sources as vllm-project/vllm#52996 proposes them."""
    tree = copy_installed_sources(dest, version)
    assert transform(tree, SCHEDULER_MODULE, SplitBudget(DSPARK_QUERY_TERMS)) >= 9
    return tree


def padding_kept_tree(dest: Path, version: str) -> Path:
    """The installed sources with the padded-decode crash fixed (``PaddingKeptWhole``)."""
    tree = copy_installed_sources(dest, version)
    assert transform(tree, SCHEDULER_MODULE, PaddingKeptWhole()) == 1
    return tree


def forgotten_refund_tree(dest: Path, version: str) -> Path:
    """The installed sources with the planted refund bug."""
    tree = copy_installed_sources(dest, version)
    assert transform(tree, SCHEDULER_MODULE, ForgottenSlotRefund()) == 1
    return tree


if __name__ == "__main__":
    # ``python -m tests.vllm_trees DEST``: the installed release's sources as a development
    # tree in DEST, for CI's ``dualbudget check --vllm-src DEST``.
    made = copy_installed_sources(Path(sys.argv[1]), development_version(installed_version()))
    print(made)
