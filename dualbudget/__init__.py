"""dualbudget: the contract of vLLM's speculative-decoding token budgets, proven and tested.

The package's parts live in the repository's top-level folders and install under this
namespace: ``dualbudget.spec`` (spec/), ``dualbudget.reference`` (reference/),
``dualbudget.proofs`` (proofs/) and ``dualbudget.integration`` (integration/), each
reached through a relative link in dualbudget/ so that file-based tools resolve it too.
"""

from pathlib import Path

__version__ = "0.1.0"

TRACES = Path(__file__).resolve().parent / "traces"
"""The recorded vLLM traces shipped as package data (docs/traces.md lists them): what
``dualbudget report`` replays and the trace tests check, in a source checkout and in an
installed wheel alike."""
