"""dualbudget.integration."""
