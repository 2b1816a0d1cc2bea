"""Where the traced handlers and task note their runs: a Redis list. Apart from
``handlers.py`` so that the test process reads it without connecting the receivers (a receiver of
a queue that other tests' settings do not configure would be reported by the checks)."""

DELIVERED = "test:tracing:delivered"
