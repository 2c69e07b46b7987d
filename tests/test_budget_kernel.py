"""The budget kernel the reference runs (reference/budget_kernel.py): each stored template
as a class whose methods answer as the template's functions do (spec/kernel.py), typed as
the kernel's interface says."""

from __future__ import annotations

import ast
import copy
import inspect
import itertools

import pytest

from dualbudget.reference.budget_kernel import (
    Kernel,
    _methods,
    kernel_classes,
    kernel_for,
    kernel_module_source,
)
from dualbudget.spec.compiled_book import TEMPLATES
from dualbudget.spec.config import EngineConfig, SpeculativeConfig
from dualbudget.spec.kernel import KERNEL_FUNCTIONS, PARAMS, NoCompiledBook, compile_kernel
from dualbudget.spec.methods import LAYOUT_NAMES, NO_SPECULATION, layout_named
from dualbudget.spec.policies import StepParams
from dualbudget.spec.profiles import PROFILES

LEDGERS = [-3, 0, 1, 5, 17, 64]
"""Budgets a step's ledger takes, a negative one among them (C1's violation)."""
NEEDS = [1, 4, 9, 70]


def test_the_base_class_has_the_interface_of_a_template() -> None:
    for function in KERNEL_FUNCTIONS:
        signature = inspect.signature(getattr(Kernel, function.name))
        assert tuple(signature.parameters)[1:] == function.args
        assert signature.return_annotation == function.returns
    # kernel_for passes the config numbers first, in PARAMS' order.
    assert tuple(inspect.signature(Kernel).parameters)[: len(PARAMS)] == PARAMS


def test_every_stored_template_has_its_class() -> None:
    classes = kernel_classes()
    assert set(classes) == set(TEMPLATES)
    assert len(set(classes.values())) == len(set(TEMPLATES.values()))
    assert all(issubclass(cls, Kernel) and cls is not Kernel for cls in classes.values())


@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_the_classes_answer_as_the_templates_functions(profile: str) -> None:
    policy = PROFILES[profile].policy
    layouts = [layout_named(name) for name in LAYOUT_NAMES] + [NO_SPECULATION]
    compared = 0
    for layout, (b, s, k) in itertools.product(layouts, [(16, 16, 3), (64, 40, 1), (8, 12, 5)]):
        p = StepParams(b, s, 8, k if layout is not NO_SPECULATION else 0, layout)
        try:
            functions = compile_kernel(policy, p)
        except (NoCompiledBook, KeyError):
            with pytest.raises((NoCompiledBook, KeyError)):
                kernel_for(policy, p)
            continue
        methods = kernel_for(policy, p)
        assert (methods.opened, methods.max_active_requests) == (
            functions.opened,
            functions.max_active_requests,
        )
        for tb, ib in itertools.product(LEDGERS, LEDGERS):
            assert methods.exhausted(tb, ib) == functions.exhausted(tb, ib)
            assert methods.room(tb, ib) == functions.room(tb, ib)
            for n in NEEDS:
                assert methods.grant(tb, ib, n) == functions.grant(tb, ib, n)
                assert methods.take(tb, ib, n) == functions.take(tb, ib, n)
                assert methods.give_back(tb, ib, n) == functions.give_back(tb, ib, n)
        compared += 1
    assert compared > 0


def test_the_reference_runs_a_class_of_them() -> None:
    from dualbudget.reference.scheduler import Scheduler

    config = EngineConfig(32, 4, 128, 16, 64, speculative_config=SpeculativeConfig("eagle3", 2))
    scheduler = Scheduler(config, PROFILES["vllm-0.33"], check="raise")
    assert type(scheduler.kernel) in set(kernel_classes().values())


def test_a_template_not_written_as_the_interface_says_is_refused() -> None:
    template = next(iter(TEMPLATES.values()))
    with pytest.raises(NoCompiledBook, match="does not define 'def grant"):
        _methods(template.replace("def grant(", "def grants("))


def test_the_module_source_names_every_template_once() -> None:
    source = kernel_module_source()
    compile(source, "<budget_kernels>", "exec")  # it is Python
    assert source.count("\nclass Kernel") == len(set(TEMPLATES.values()))
    assert all(repr(key) in source for key in TEMPLATES)


class _AsTemplate(ast.NodeTransformer):
    """A kernel class's method read back as the template's function: ``self`` and the
    annotations dropped, ``self.name`` read as the slot ``name``."""

    def visit_FunctionDef(self, node: ast.FunctionDef) -> ast.FunctionDef:
        self.generic_visit(node)
        assert node.args.args[0].arg == "self"
        node.args.args = [ast.arg(arg.arg) for arg in node.args.args[1:]]
        node.returns = None
        return node

    def visit_Attribute(self, node: ast.Attribute) -> ast.AST:
        if isinstance(node.value, ast.Name) and node.value.id == "self":
            assert node.attr in PARAMS, node.attr
            return ast.copy_location(ast.Name(node.attr, ast.Load()), node)
        return self.generic_visit(node)


def test_each_class_is_its_template_read_with_its_slots_on_the_instance() -> None:
    # Exactly, not on samples: every method, parsed, is its template function's syntax
    # tree once the instance's numbers are read as the template's slots.
    module = ast.parse(kernel_module_source())
    classes = {node.name: node for node in module.body if isinstance(node, ast.ClassDef)}
    table = next(node for node in module.body if isinstance(node, ast.AnnAssign))
    assert isinstance(table.value, ast.Dict)
    compared = 0
    for key_node, class_node in zip(table.value.keys, table.value.values, strict=True):
        assert key_node is not None and isinstance(class_node, ast.Name)
        template = TEMPLATES[ast.literal_eval(key_node)]
        functions = ast.parse(template.format_map({name: name for name in PARAMS})).body
        methods = [_AsTemplate().visit(copy.deepcopy(m)) for m in classes[class_node.id].body]
        assert [ast.dump(m) for m in methods] == [ast.dump(f) for f in functions]
        compared += 1
    assert compared == len(TEMPLATES)
