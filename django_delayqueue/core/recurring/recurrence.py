"""A recurring schedule's definition, and the instants of its ticks.

A tick is an ordinary message whose id is the schedule's name and the tick's instant
(:func:`tick_id`), so every process that computes the same tick names the same message.
Cron expressions are read by ``cronsim`` (the semantics of Debian's cron, DST included: a time
the clocks skip fires once at the first valid minute after it, a repeated time fires once);
``every`` ticks at whole multiples of its period since the Unix epoch, so they need no anchor.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from functools import cached_property
from typing import Any, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from django_delayqueue.core.envelope import encode_json, validate_key
from django_delayqueue.core.errors import ConfigurationError, PayloadError

CatchUp = Literal["latest", "all", "none"]
CATCH_UP_POLICIES: tuple[CatchUp, ...] = ("latest", "all", "none")
DEFAULT_CATCH_UP_LIMIT = 100  # "all" creates at most this many missed ticks (the latest ones)
MAX_CATCH_UP_LIMIT = 10_000
# Instants (ms) the code handles: dates (tick ids, the admin, queuestats) that Lua writes
# as whole numbers, without an exponent (below 1e14 ms, the year 5138).
MAX_INSTANT_MS = 10**14
# The longest interval. Ticks fall within one interval of now, so every instant computed
# stays far below MAX_INSTANT_MS for centuries to come.
MAX_EVERY_SECONDS = 10 * 365 * 86_400
CRON_FIELDS = "minute hour day-of-month month day-of-week"
TICK_SEPARATOR = "@"
MAX_NAME_LENGTH = 100


@dataclass(frozen=True)
class Recurrence:
    """One recurring schedule: which queue gets a message with ``payload``, and when.

    Exactly one of ``cron`` (a five-field expression, read in ``timezone``) and ``every``
    (seconds) is given. ``catch_up`` says what happens to ticks missed while no ``runqueue``
    ran: "latest" runs the most recent of them once, "all" runs each (at most
    ``catch_up_limit``, the latest), "none" skips them. ``task`` (a dotted path) makes each tick
    run that Django task with ``args`` and ``kwargs`` instead of sending ``payload``. ``key``:
    every tick's flow key (as ``schedule(..., key=)``; docs/flow-control.md, "Keys").
    """

    name: str
    queue: str
    cron: str | None = None
    every: float | None = None
    timezone: str = "UTC"
    payload: Any = None
    catch_up: CatchUp = "latest"
    catch_up_limit: int = DEFAULT_CATCH_UP_LIMIT
    paused: bool = False
    task: str | None = None
    backend: str = "default"  # the TASKS alias that runs ``task``
    args: list[Any] = field(default_factory=list)
    kwargs: dict[str, Any] = field(default_factory=dict)
    key: str | None = None

    def __post_init__(self) -> None:
        problems = self.problems()
        if problems:
            raise ConfigurationError(f"schedule {self.name!r}: {'; '.join(problems)}")

    @classmethod
    def from_mapping(cls, name: str, values: dict[str, Any]) -> Recurrence:
        """A definition from the ``DELAYQUEUE["SCHEDULES"]`` entry (or its published JSON)."""
        if not isinstance(values, dict):
            raise ConfigurationError(f"schedule {name!r}: expected a dict, got {values!r}")
        known = {f for f in cls.__dataclass_fields__ if f != "name"}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ConfigurationError(
                f"schedule {name!r}: unknown option(s) {', '.join(unknown)}; "
                f"options: {', '.join(sorted(known))}"
            )
        try:
            return cls(name=name, **values)
        except TypeError as e:  # a required option missing (queue)
            raise ConfigurationError(f"schedule {name!r}: {e}") from e

    def to_mapping(self) -> dict[str, Any]:
        values = asdict(self)
        values.pop("name")
        if values["key"] is None:
            # Left out, not null: a release without keys refuses an option it does not know,
            # so a schedule without one stays readable by consumers not yet upgraded, and its
            # signature (its pending tick) is what it was.
            values.pop("key")
        return values

    def problems(self) -> list[str]:
        out: list[str] = []
        if not isinstance(self.name, str) or not self.name or len(self.name) > MAX_NAME_LENGTH:
            out.append(f"the name must be 1 to {MAX_NAME_LENGTH} characters")
        elif not _utf8(self.name):
            out.append("the name must be text UTF-8 can hold (it holds a lone surrogate)")
        elif TICK_SEPARATOR in self.name or not self.name.isprintable() or " " in self.name:
            out.append(f"the name may not contain {TICK_SEPARATOR!r}, spaces or control characters")
        if not isinstance(self.queue, str) or not self.queue:
            out.append("'queue' must name a queue")
        if (self.cron is None) == (self.every is None):
            out.append("give exactly one of 'cron' and 'every'")
        elif self.cron is not None:
            out.extend(_cron_problems(self.cron))
        elif isinstance(self.every, bool) or not isinstance(self.every, (int, float)):
            out.append(f"'every' must be a number of seconds, at least 1 (got {self.every!r})")
        elif not 1 <= self.every <= MAX_EVERY_SECONDS:  # compared exactly: no float overflow
            out.append(
                f"'every' must be a number of seconds, at least 1 and at most "
                f"{MAX_EVERY_SECONDS} (ten years) (got {repr(self.every)[:40]}); use 'cron' "
                "for a yearly schedule"
            )
        try:
            ZoneInfo(self.timezone)
        # OSError: a name too long to be a file name (ZoneInfo reads the zone from a file).
        except (ZoneInfoNotFoundError, ValueError, TypeError, OSError):
            out.append(f"unknown timezone {self.timezone!r} (an IANA name, e.g. Europe/Berlin)")
        if self.catch_up not in CATCH_UP_POLICIES:
            out.append(f"'catch_up' must be one of {', '.join(CATCH_UP_POLICIES)}")
        if isinstance(self.catch_up_limit, bool) or not isinstance(self.catch_up_limit, int):
            out.append("'catch_up_limit' must be a whole number")
        elif not 1 <= self.catch_up_limit <= MAX_CATCH_UP_LIMIT:
            out.append(f"'catch_up_limit' must be between 1 and {MAX_CATCH_UP_LIMIT}")
        if self.task is not None and (not isinstance(self.task, str) or "." not in self.task):
            out.append(f"'task' must be a dotted path to a @task function (got {self.task!r})")
        if self.task is not None and self.payload is not None:
            out.append("give 'payload' or 'task', not both (a task takes 'args' and 'kwargs')")
        if not isinstance(self.args, (list, tuple)) or not isinstance(self.kwargs, dict):
            out.append("'args' must be a list and 'kwargs' a dict")
        try:  # as schedule() checks a payload: every consumer must decode each tick again
            encode_json(self.payload, "'payload'")
            # As a task's tick carries them (task_payload): nested one level deeper.
            encode_json({"args": list(self.args), "kwargs": self.kwargs}, "'args'/'kwargs'")
        except (PayloadError, TypeError) as e:
            out.append(f"payload, args and kwargs must be JSON: {e}")
        if self.key is not None:
            try:
                validate_key(self.key)
            except PayloadError as e:
                out.append(f"'key': {e}")
        return out

    # --- instants ------------------------------------------------------------------------------

    @property
    def zone(self) -> ZoneInfo:
        return ZoneInfo(self.timezone)

    def next_after(self, instant_ms: int) -> int:
        """The first tick strictly after ``instant_ms`` (ms since the epoch)."""
        if self.every is not None:
            period = round(self.every * 1000)
            return (instant_ms // period + 1) * period
        from cronsim import CronSim

        start = datetime.fromtimestamp(instant_ms / 1000, self.zone)
        when = next(iter(CronSim(str(self.cron), start)))
        return math.ceil(when.timestamp() * 1000)

    def instants(self, after_ms: int, until_ms: int, limit: int) -> list[int]:
        """Ticks in (after_ms, until_ms], at most the ``limit`` latest of them."""
        if self.every is not None:
            period = round(self.every * 1000)
            last = until_ms // period
            first = max(after_ms // period + 1, last - limit + 1)
            return [k * period for k in range(first, last + 1)]
        from cronsim import CronSim

        # Walked backwards from the end: only the ``limit`` latest are wanted, and a week's
        # outage of a minute-wise expression would be 10,080 steps forwards. cronsim works in
        # whole minutes, so starting a second late and dropping what is after the end is exact.
        start = datetime.fromtimestamp((until_ms + 1000) / 1000, self.zone)
        out: list[int] = []
        for when in CronSim(str(self.cron), start, reverse=True):
            at = math.ceil(when.timestamp() * 1000)
            if at <= after_ms or len(out) >= limit:
                break
            if at <= until_ms:
                out.append(at)
        return out[::-1]

    def count_between(self, after_ms: int, until_ms: int) -> int | None:
        """How many ticks fall in (after_ms, until_ms]: known for an interval, None for cron
        (which would have to be walked)."""
        if self.every is None:
            return None
        period = round(self.every * 1000)
        return max(0, until_ms // period - after_ms // period)

    @cached_property
    def _signature(self) -> str:
        values = self.to_mapping()
        for name in ("catch_up", "catch_up_limit"):
            values.pop(name)
        text = json.dumps(values, sort_keys=True, separators=(",", ":"), default=str)
        return hashlib.sha1(text.encode()).hexdigest()[:16]

    def signature(self) -> str:
        """Changes whenever the ticks or what they carry change (an edit replaces the pending
        tick); catch_up options are not part of it (they apply only to the next outage).
        Computed once: every consumer round compares it."""
        return self._signature

    def describe(self) -> str:
        if self.cron is not None:
            return f"cron {self.cron} ({self.timezone})"
        return f"every {self.every:g}s"

    def tick_id(self, instant_ms: int) -> str:
        return tick_id(self.name, instant_ms)


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def tick_id(name: str, instant_ms: int) -> str:
    """``nightly-report@2026-11-25T02:00:00Z``: the schedule and its tick instant in UTC."""
    when = datetime.fromtimestamp(instant_ms / 1000, timezone.utc)
    text = when.strftime("%Y-%m-%dT%H:%M:%S")
    if instant_ms % 1000:
        text += f".{instant_ms % 1000:03d}"
    return f"{name}{TICK_SEPARATOR}{text}Z"


_TICK_ID = re.compile(
    rf"(?P<name>[^@\s]{{1,{MAX_NAME_LENGTH}}})"
    r"@(?P<when>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d{3})?)Z"
)


def parse_tick_id(message_id: str) -> tuple[str, int] | None:
    """The schedule name and tick instant (ms) of a tick's message id, or None.

    Only the exact form :func:`tick_id` writes: sharded queues route such ids by the name.
    """
    match = _TICK_ID.fullmatch(message_id)
    if match is None:
        return None
    try:
        when = datetime.fromisoformat(match["when"]).replace(tzinfo=timezone.utc)
    except ValueError:  # 2026-02-30T...
        return None
    return match["name"], round(when.timestamp() * 1000)


def _cron_problems(expression: Any) -> list[str]:
    if not isinstance(expression, str):
        return [f"'cron' must be a string like '0 3 * * *' (got {expression!r})"]
    fields = len(expression.split())
    if fields != 5:
        # cronsim also reads six fields (seconds first), which the docs never promised.
        return [
            f"bad cron expression {expression!r}: it has {fields} field(s), a cron expression "
            f"has five fields ({CRON_FIELDS}), e.g. '0 3 * * *'"
        ]
    from cronsim import CronSim, CronSimError

    try:
        # Valid fields may still never meet (the 1st of a month that is its fifth Monday):
        # cronsim gives up after 50 years, and every computation of its ticks would fail.
        # A five-field expression that fires at all fires within every 50 years.
        next(iter(CronSim(expression, datetime(2000, 1, 1, tzinfo=timezone.utc))))
    except CronSimError as e:
        return [f"bad cron expression {expression!r}: {e}"]
    except StopIteration:
        return [f"cron expression {expression!r} never fires (its fields never meet)"]
    return []
