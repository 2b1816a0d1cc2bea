"""The third rule of the package's shape (docs/architecture.md, "Layers"), for all of ``core/``:
**a class owns its parts and gets them in its constructor**, so no class of ``core/`` extends
another class of the package to borrow its attributes (as ``Queue`` once did, made of six
mixins that each re-declared the queue's attributes). ``core/consumer/``'s own test
(test_core_consumer.py, "its shape") holds the same for the consumer's classes.

Read by importing ``core/`` and looking at each class's bases (so an aliased or re-exported
base is caught too). What a class may extend: Python's and other libraries' classes, the
package's exceptions (a hierarchy of errors is what ``except`` reads), and the package's
Protocols (interfaces: they say what a class offers, it borrows nothing). A class that is an
exception, a Protocol, a NamedTuple or an Enum is left out: each is a kind of its own.
"""

from __future__ import annotations

import enum
import importlib
import inspect
import pkgutil
from collections.abc import Iterator
from typing import Any

import django_delayqueue.core as core
from django_delayqueue.core.queue import Queue

PACKAGE = "django_delayqueue"

# The package's plain classes a class of core/ may extend, by "module.QualName". None: a base
# named here must be a plain one (no state, no dataclass) and say why a part would not do.
ALLOWED_BASES: frozenset[str] = frozenset()


def core_classes() -> Iterator[type]:
    """Every class of ``core/``'s modules, those in class bodies included (not run: __main__)."""
    for info in pkgutil.walk_packages(core.__path__, f"{core.__name__}."):
        if info.name.endswith(".__main__"):
            continue
        module = importlib.import_module(info.name)
        found = [c for _, c in inspect.getmembers(module, inspect.isclass)]
        while found:
            cls = found.pop()
            if cls.__module__ != module.__name__:
                continue  # imported here, checked in its own module
            yield cls
            found += [v for v in vars(cls).values() if inspect.isclass(v)]


def is_protocol(cls: type) -> bool:
    return bool(getattr(cls, "_is_protocol", False))


def a_kind_of_its_own(cls: type) -> bool:
    """An exception, a Protocol, a NamedTuple or an Enum: what it extends is its kind's affair."""
    named_tuple = issubclass(cls, tuple) and hasattr(cls, "_fields")
    return issubclass(cls, (BaseException, enum.Enum)) or is_protocol(cls) or named_tuple


def borrowed_bases(cls: type) -> list[str]:
    """The package's classes ``cls`` extends that are neither exceptions nor Protocols."""
    return [
        f"{base.__module__}.{base.__qualname__}"
        for base in cls.__bases__
        if base.__module__.startswith(f"{PACKAGE}.")
        and not issubclass(base, BaseException)
        and not is_protocol(base)
        and f"{base.__module__}.{base.__qualname__}" not in ALLOWED_BASES
    ]


def test_no_class_of_the_core_extends_another_of_the_package() -> None:
    """Before: ``class Queue(Scheduling, BulkScheduling, Delivery, Inspection, Housekeeping,
    TaskRecords)``. Now the queue builds its parts around one shared place and owns them."""
    classes = list(core_classes())
    assert Queue in classes and len(classes) > 50  # the walk saw the whole core
    extending = {
        f"{cls.__module__}.{cls.__qualname__}": borrowed_bases(cls)
        for cls in classes
        if not a_kind_of_its_own(cls) and borrowed_bases(cls)
    }
    assert extending == {}


def test_the_queue_owns_its_parts_and_they_read_its_current_settings() -> None:
    """Staff's overrides replace ``Queue.settings`` whole at run time (conf/queues.py,
    mirror/following.py, ShardedQueue): every part must see the new settings, not the ones it
    was built with."""
    import redis

    from django_delayqueue.core.clock import ManualClock
    from django_delayqueue.core.settings import QueueSettings

    q = Queue(redis.Redis(port=1), "parts", clock=ManualClock(1_000))  # no call reaches Redis
    assert Queue.__bases__ == (object,)
    parts = [q.scheduling, q.bulk, q.delivery, q.inspection, q.housekeeping, q.records]
    assert all(part.place is q.place for part in parts)

    q.settings = QueueSettings(visibility_timeout=7, claim_batch=3, promote_batch=5)
    assert all(part.place.settings is q.settings for part in parts)
    # claim.lua's now_ms, deadline_ms and most_ids; promote.lua's now_ms and limit.
    assert list(q.claim_call(1_000).args[:3]) == [1_000, 8_000, 3]
    assert list(q.promote_call(1_000).args) == [1_000, 5]
    q.shard_count = 4  # what ShardedQueue sets on each of its shards
    assert q.place.shard_count == 4


def test_a_subclass_override_that_calls_super_stays_in_force(redis_client: Any) -> None:
    """Queue's methods are its parts' methods, kept on the queue after the first read. A
    subclass's override reaching the part through super() must not get the part's method kept
    on the instance, where it would hide the override from every later call."""

    class Counting(Queue):
        claims = 0

        def claim_call(self, *args: Any, **kwargs: Any) -> Any:
            self.claims += 1
            return super().claim_call(*args, **kwargs)

    q = Counting(redis_client, "parts-super")
    q.claim_call(0, 1)
    q.claim_call(0, 1)
    assert q.claims == 2
    plain = Queue(redis_client, "parts-plain")
    assert plain.schedule == plain.scheduling.schedule  # the part's own bound method


def test_a_patch_of_the_queue_class_reaches_a_queue_already_used(
    redis_client: Any, monkeypatch: Any
) -> None:
    """get_queue keeps one Queue per name for the process, so a user's test patches the class
    after other tests used the queue: the part's method once kept on the instance hid the
    patch, and the call reached Redis. And Queue.counts(q), an unbound call, works."""
    q = Queue(redis_client, "parts-patched")
    assert q.counts()["ready"] == 0
    assert Queue.counts(q) == q.counts()
    monkeypatch.setattr(Queue, "counts", lambda self: {"patched": 1})
    assert q.counts() == {"patched": 1}
