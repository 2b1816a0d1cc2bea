"""Hints that the messages of several areas share."""

CONFIGURATION_HINT = "See DELAYQUEUE in docs/configuration.md of django-delayqueue."
