"""dualbudget.reference."""

from .compiled import select

# Before any module of the scheduling loop is imported: its compiled build, or its sources.
select(__name__)
