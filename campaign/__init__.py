"""dualbudget.campaign: the executor seam (local processes or Ray), campaigns in SQLite."""
