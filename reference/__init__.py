"""dualbudget.reference."""
