"""One stats function (``stats.collect``) feeding the admin, ``queuestats``, the Prometheus
metrics (``metrics``) and the health probe (``health``)."""
