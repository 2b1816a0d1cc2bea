"""A tiny Django app for the ``runqueue`` fault drills: a ledger-keeping handler for "drill"."""
