"""The contract of speculative-decoding token budgets, as an executable specification.

Read in this order:

- ``arith``      the arithmetic every budget rule is written in (Python ints or z3 terms);
- ``methods``    the method table: draft input rows ``C(q)``, vLLM's slots and lookahead;
- ``config``     the engine configuration, in vLLM's own parameter names;
- ``policies``   the four budget policies as ledgers: open, room, grant, charge, refund;
- ``profiles``   a policy plus the tables of one vLLM release;
- ``invariants`` the contract items C1-C3 as predicates over a step.

This package imports nothing of dualbudget and nothing outside the standard library;
``arith`` imports z3 lazily, and only when it is handed a z3 term.
"""
