"""Django's own tests/tasks suite, run against DelayQueueBackend (see README.md).

The plumbing, and nothing else: where the vendored tests use Django's dummy or immediate
backend, ``delayqueue_backends`` puts DelayQueueBackend (the tests' ``TASKS`` overrides name
it); each test gets a flushed private Redis, the database (the backend reads its outbox table,
``runqueue`` its settings rows), and one attempt per task, as Django's reference backends
make. Tests of another backend's own behaviour are skipped, each with its reason
(``SKIPPED``); the whole suite is skipped on Django < 6.0, which has no ``django.tasks``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import django
import pytest
import redis
from django.conf import settings
from django.test import SimpleTestCase, TransactionTestCase, override_settings
from django_tasks_skips import SKIPPED

HERE = Path(__file__).resolve().parent
NO_FRAMEWORK = (
    f"Django {django.get_version()} has no django.tasks (Django 6.0+); the backport's "
    "behaviour is tested by tests/app/test_tasks_*.py"
)


class _WithoutFramework(pytest.Module):
    def collect(self) -> Any:
        pytest.skip(NO_FRAMEWORK, allow_module_level=True)


def pytest_pycollect_makemodule(module_path: Path, parent: Any) -> Any:
    """On Django < 6 each of Django's modules is reported skipped, with why (they import
    django.tasks); test_vendored.py runs everywhere."""
    if django.VERSION < (6, 0) and module_path.parent.name == "tasks":
        return _WithoutFramework.from_parent(parent, path=module_path)
    return None


def pytest_collection_modifyitems(items: list[Any]) -> None:
    for item in items:
        path = Path(str(item.path))
        if HERE not in path.parents:
            continue
        test = f"{path.name}::{'::'.join(item.nodeid.split('::')[1:])}"
        if test in SKIPPED:
            item.add_marker(pytest.mark.skip(reason=f"another backend's: {SKIPPED[test]}"))
        cls = getattr(item, "cls", None)
        if cls is not None and issubclass(cls, SimpleTestCase) and not cls.databases:
            # DelayQueueBackend reads its outbox table on a get_result miss, and runqueue its
            # settings rows: a SimpleTestCase would refuse those queries.
            cls.databases = {"default"}


@pytest.fixture(autouse=True)
def delayqueue_for_django_tests(
    redis_client: redis.Redis, request: pytest.FixtureRequest
) -> Iterator[None]:
    """A flushed private Redis (redis_client), one attempt per task, no rows left behind."""
    delayqueue = {**settings.DELAYQUEUE, "DEFAULTS": {"max_attempts": 1}}
    with override_settings(DELAYQUEUE=delayqueue):
        yield
    cls = getattr(request, "cls", None)
    if cls is not None and not issubclass(cls, TransactionTestCase):  # those flush themselves
        _delete_rows(request)


def _delete_rows(request: pytest.FixtureRequest) -> None:
    """What a worker left in the database of a SimpleTestCase (nothing rolls it back)."""
    from django_delayqueue.models import OutboxMessage, QueueConfig, RecurringSchedule

    with request.getfixturevalue("django_db_blocker").unblock():
        for model in (OutboxMessage, QueueConfig, RecurringSchedule):
            model.objects.all().delete()
