"""Benchmarks of django-delayqueue against raw Redis and huey: ``python -m bench``."""
