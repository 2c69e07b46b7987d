"""Mutants of the installed vLLM's scheduler: budget bugs planted in its own source.

``operators`` finds the budget sites of a function's AST and plants one bug at one site;
``loading`` reads vLLM's scheduler source at run time and compiles a mutant into a
scheduler class (``classes`` makes each importable by name); ``equivalence`` holds the
written reasons of mutants called equivalent and checks the arithmetic ones with z3;
``integration/mutate.py`` fuzzes every mutant. Nothing of vLLM's code is stored in the
project: every mutant is made in memory from the source of the vLLM that is installed.
"""
