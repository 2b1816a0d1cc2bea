"""Schedule definitions: read from the settings file, published to Redis, read back.

Every runqueue reads the published definitions every ``SETTINGS_REFRESH_SECONDS`` (one key,
one round trip), so an admin edit reaches running consumers without a restart. A publish
bumps the version, which lets a consumer that has not refreshed yet leave alone a schedule
another one already moved to its new definition (``core.recurring.planning``).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import Any

from django_delayqueue.conf.connection import get_client
from django_delayqueue.conf.settings import dq_settings
from django_delayqueue.core.errors import ConfigurationError
from django_delayqueue.core.keys import published_recurrences_key
from django_delayqueue.core.recurring.publishing import publish_definitions
from django_delayqueue.core.recurring.recurrence import Recurrence
from django_delayqueue.core.scripts.calls import redis_errors

logger = logging.getLogger(__name__)

DEFINITIONS_FIELD, VERSION_FIELD = "definitions", "version"
PUBLISH_LOCK_SECONDS = 10.0  # a publisher holds the lock at most this long
PUBLISH_WAIT_SECONDS = 5.0  # and another waits this long for it before publishing anyway


def published_key() -> str:
    return published_recurrences_key(dq_settings.PREFIX)


def publish_lock() -> Any:
    """Held around "read the rows, publish them": two saves committing together would
    otherwise let the first, which read the rows before the second committed, publish last."""
    return get_client().lock(
        f"{published_key()}:lock",
        timeout=PUBLISH_LOCK_SECONDS,
        blocking_timeout=PUBLISH_WAIT_SECONDS,
    )


def declared(*, discover_tasks: bool = True) -> dict[str, dict[str, Any]]:
    """``DELAYQUEUE["SCHEDULES"]`` as given (the checks validate it), after the ``@periodic``
    tasks (a settings entry of the same name wins). ``discover_tasks=False``: only the tasks
    modules already imported (the system checks import nothing: importing the framework
    mid-run would change which checks run)."""
    value = dq_settings.user_settings.get("SCHEDULES") or {}
    if not isinstance(value, dict):
        raise ConfigurationError('DELAYQUEUE["SCHEDULES"] must be a dict of name -> options')
    from django_delayqueue.tasks.periodic import discover, registered

    found = discover() if discover_tasks else registered()
    return {**{n: r.to_mapping() for n, r in found.items()}, **value}


@dataclass(frozen=True)
class Invalid:
    """A schedule whose options cannot be read here, and why: shown with its error (admin,
    queuestats), never run."""

    name: str
    options: Any
    error: str


def read_definitions(definitions: dict[str, Any]) -> tuple[list[Recurrence], list[Invalid]]:
    """The schedules of ``definitions`` (name -> options) that are valid, and those that are
    not with their problem (options stored past validation, or by another release)."""
    out, invalid = [], []
    for name, options in definitions.items():
        try:
            out.append(Recurrence.from_mapping(name, options))
        except ConfigurationError as e:
            invalid.append(Invalid(name, options, str(e)))
    return out, invalid


def declared_recurrences() -> list[Recurrence]:
    """The valid schedules of the settings file; an invalid one is logged and left out."""
    out, invalid = read_definitions(declared())
    for problem in invalid:
        logger.error("%s", problem.error)
    return out


def publish(definitions: dict[str, dict[str, Any]]) -> int:
    """Publish every schedule (name -> options) at once; returns the new version (which only
    grows, see publish_recurrences.lua).

    Raises :class:`ConfigurationError` for an invalid definition (nothing is published) and
    :class:`RedisUnavailable` when Redis is down.
    """
    _, invalid = read_definitions(definitions)
    if invalid:  # every runqueue would refuse it: never published
        raise ConfigurationError("; ".join(i.error for i in invalid))
    text = json.dumps(definitions, sort_keys=True, separators=(",", ":"))
    return publish_definitions(get_client(), dq_settings.PREFIX, text)


@dataclass(frozen=True)
class Published:
    version: int
    recurrences: list[Recurrence]
    # Published, but not readable by this process (an option of a newer release, a time zone
    # it lacks, a value an older release let through): consumers leave them alone rather than
    # take them for deleted.
    invalid: list[Invalid] = field(default_factory=list)

    @property
    def unreadable(self) -> list[str]:
        return [i.name for i in self.invalid]


# What load_published said of unreadable schedules: every runqueue loads them each
# SETTINGS_REFRESH_SECONDS, and one problem is logged once per process, not at every refresh.
_said: set[str] = set()


def load_published() -> Published | None:
    """The published version and schedules, or None when nothing is published.

    Raises :class:`RedisUnavailable` when Redis is down.
    """
    with redis_errors("reading recurring schedules"):
        raw = get_client().hgetall(published_key())
    values = {(k.decode() if isinstance(k, bytes) else k): v for k, v in raw.items()}
    if DEFINITIONS_FIELD not in values:
        return None
    try:
        definitions = json.loads(values[DEFINITIONS_FIELD])
        version = int(values.get(VERSION_FIELD) or 0)
    except ValueError:
        logger.error("unreadable published recurring schedules: republishing")
        return None
    if not isinstance(definitions, dict):
        logger.error("unreadable published recurring schedules: republishing")
        return None
    out, invalid = read_definitions(definitions)
    for problem in invalid:
        level = logging.DEBUG if problem.error in _said else logging.ERROR
        _said.add(problem.error)
        logger.log(level, "%s (left alone: another release may read it)", problem.error)
    return Published(version, out, invalid)
