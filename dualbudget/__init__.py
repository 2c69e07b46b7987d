"""dualbudget: the contract of vLLM's speculative-decoding token budgets, proven and tested.

The package's parts install under this namespace from the repository's top-level folders:
``dualbudget.spec`` (spec/), ``dualbudget.reference`` (reference/), ``dualbudget.proofs``
(proofs/), ``dualbudget.integration`` (integration/) and ``dualbudget.tests`` (tests/).
"""

__version__ = "0.1.0"
