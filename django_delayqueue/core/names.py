"""What a queue name and a key prefix may hold: both are spelled into every Redis key of a
queue (core/keys.py), inside its hash tag ``{<prefix>:<queue>}``."""

from __future__ import annotations

import re

from django_delayqueue.core.errors import ConfigurationError

# Braces would break the hash tag, whitespace and control characters make keys unreadable.
# A prefix may hold ":" (a namespace such as "shop:eu"), a queue name may not: the queue is the
# last ":" segment of its tag "{<prefix>:<queue>}", so no two (prefix, queue) pairs share a tag
# ("shop" + "eu:orders" and "shop:eu" + "orders" would both be {shop:eu:orders}). Neither holds
# "#", which starts a shard's number.
_PREFIX_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,99}$")
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")


def validate_name(value: str, what: str = "queue name") -> str:
    """Return ``value`` if it is a valid queue name, else raise (``what`` names it)."""
    if isinstance(value, str) and ":" in value and _PREFIX_RE.match(value):
        raise ConfigurationError(
            f"invalid {what} {value!r}: ':' separates the key prefix from the queue name, so a "
            "queue name cannot hold it (use '.', '_' or '-'; to keep two sites apart give each "
            "its own DELAYQUEUE['PREFIX'])"
        )
    if not isinstance(value, str) or not _NAME_RE.match(value):
        raise ConfigurationError(
            f"invalid {what} {value!r}: use 1-100 characters from A-Z a-z 0-9 . _ - "
            "starting with a letter or digit"
        )
    return value


def validate_prefix(value: str) -> str:
    """Return ``value`` if it is a valid key prefix (``DELAYQUEUE['PREFIX']``), else raise."""
    if not isinstance(value, str) or not _PREFIX_RE.match(value):
        raise ConfigurationError(
            f"invalid key prefix {value!r}: use 1-100 characters from A-Z a-z 0-9 . _ : - "
            "starting with a letter or digit"
        )
    return value
