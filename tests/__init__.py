"""dualbudget.tests."""
