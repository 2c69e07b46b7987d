"""A scheduler's source, read at run time, and its mutants compiled into classes.

The source is the installed module's own file (``inspect.getsourcefile``), parsed with
``ast``: nothing of it is stored in the project. A mutant is a subclass of the module's
class, of the same name, whose mutated methods are compiled from the transformed AST with
the file's own name and line numbers (so a traceback, and a site's location, point into
vLLM's file) and run in a copy of the module's namespace (so every name the method reads
resolves as it does in vLLM). Being a subclass, every method not mutated is vLLM's own.
"""

from __future__ import annotations
import __future__

import ast
import importlib
import inspect
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from .operators import OPERATORS, NoSite, Site, find_sites, mutate

VLLM_SCHEDULER = ("vllm.v1.core.sched.scheduler", "Scheduler")
FUNCTIONS = ("schedule",)
"""The methods mutated: every budget decision of vLLM 0.32 and 0.33 is in ``schedule``
(the helpers it calls cap encoder and Mamba work, outside dualbudget's subset)."""

_BASE = "__dualbudget_mutant_base__"


@dataclass(frozen=True)
class SchedulerSource:
    module: ModuleType
    class_name: str
    path: str
    tree: ast.Module

    @property
    def base(self) -> type:
        cls = getattr(self.module, self.class_name)
        assert isinstance(cls, type)
        return cls

    def function(self, name: str) -> ast.FunctionDef:
        for node in self.tree.body:
            if isinstance(node, ast.ClassDef) and node.name == self.class_name:
                for item in node.body:
                    if isinstance(item, ast.FunctionDef) and item.name == name:
                        return item
        raise NoSite(f"{self.class_name}.{name} not found in {self.path}")


def load_source(module_name: str, class_name: str) -> SchedulerSource:
    """The source of ``module_name`` as installed (imports it)."""
    module = importlib.import_module(module_name)
    path = inspect.getsourcefile(module)
    if path is None:
        raise NoSite(f"{module_name} has no source file")
    with open(path, encoding="utf-8") as file:
        tree = ast.parse(file.read(), filename=path)
    return SchedulerSource(module, class_name, path, tree)


def installed_vllm_source() -> SchedulerSource:
    from dualbudget.integration.live import set_environment

    set_environment()
    return load_source(*VLLM_SCHEDULER)


def sites(source: SchedulerSource, operators: tuple[str, ...] = OPERATORS) -> list[Site]:
    """Every site of ``operators`` over ``FUNCTIONS``; ``NoSite`` names an operator that
    found none in any of them."""
    found: list[Site] = []
    for name in FUNCTIONS:
        found += find_sites(source.function(name), operators)
    return found


def compile_class(source: SchedulerSource, methods: list[ast.FunctionDef], label: str) -> type:
    """A subclass of the source's class with ``methods`` compiled in place of its own."""
    node = ast.ClassDef(
        name=source.class_name,
        bases=[ast.Name(_BASE, ast.Load())],
        keywords=[],
        body=list(methods),
        decorator_list=[],
    )
    module = ast.fix_missing_locations(ast.Module([node], []))
    flags = 0
    if getattr(source.module, "annotations", None) is __future__.annotations:
        flags |= __future__.annotations.compiler_flag
    code = compile(module, source.path, "exec", flags=flags, dont_inherit=True)
    namespace: dict[str, Any] = dict(vars(source.module))
    namespace[_BASE] = source.base
    exec(code, namespace)
    cls = namespace[source.class_name]
    assert isinstance(cls, type)
    cls.__qualname__ = f"{source.class_name}[{label}]"
    cls.__module__ = source.module.__name__
    return cls


def mutant_class(source: SchedulerSource, site: Site) -> type:
    return compile_class(source, [mutate(source.function(site.function), site)], site.name)


def control_class(source: SchedulerSource) -> type:
    """The unmutated methods, compiled the way mutants are: must agree with the original."""
    return compile_class(source, [source.function(name) for name in FUNCTIONS], "control")
