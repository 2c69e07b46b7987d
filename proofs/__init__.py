"""dualbudget.proofs."""
