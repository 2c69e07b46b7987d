"""The contract of speculative-decoding token budgets, as an executable specification.

Read in this order:

- ``arith``      the arithmetic every budget rule is written in (Python ints or z3 terms);
- ``methods``    the method table: draft input rows ``C(q)`` of each layout;
- ``releases``   one record per vLLM release: its slots and lookahead columns and every
  behaviour the reference follows around the budget;
- ``config``     the engine configuration, in vLLM's own parameter names;
- ``policies``   the budget policies as ledgers: open, room, grant, charge, refund;
- ``profiles``   a policy run on one release's record, named as users ask for it;
- ``book``       one step's ledger and the charge of every scheduled request: the one
  executable form of the budget rule, run on z3 symbols by the proofs and on ints by the
  reference;
- ``contract``   the contract as data: each item's id, name and statement (C1-C6 about
  the budgets, C7-C13 about the scheduler's other books);
- ``invariants`` the contract items C1-C6 as predicates over a step;
- ``books``      the items C7-C13 as predicates over a request's books or the block pool;
- ``scenario_format`` the scenario JSON's writer (its keys are the reference's schema).

This package imports nothing of dualbudget and nothing outside the standard library;
``arith`` imports z3 lazily, and only when it is handed a z3 term, so no reference run
loads z3.
"""
