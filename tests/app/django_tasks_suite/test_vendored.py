"""The vendored tests are Django's own, with only the backends of their TASKS substituted."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

from django_tasks_skips import SKIPPED

HERE = Path(__file__).resolve().parent

# tests/tasks/ of Django 6.1.3's sdist (django-6.1.3.tar.gz on PyPI), file by file.
DJANGO_SHA256 = {
    "__init__.py": "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
    "tasks.py": "24b3765b2e82736b2d02fdf581ad1119272cc16b74c76c4ae14473de81f91a9c",
    "test_custom_backend.py": "c5757a7eb0ece9940fa4521b1e0caeaca3681583d48e53d92a30901a56463f87",
    "test_dummy_backend.py": "6b2c41ab2a94d857bd88433cfdb6f6458f1ac735a8b91448d592d934b8e98f3c",
    "test_immediate_backend.py": "fe37e6ae7e7e5a4f035d54b576bc32d3c5b4173551ab341fe6023088988942e5",
    "test_tasks.py": "1ea9c6ec7d778dc936f423893fa752600bf8aa4f54cd701908700d78d15ee9a6",
}
# The one edit (README.md): our backend where Django's tests name its reference backends.
SUBSTITUTED = {
    '"delayqueue_backends.DelayQueueDummy"': '"django.tasks.backends.dummy.DummyBackend"',
    '"delayqueue_backends.DelayQueueImmediate"': (
        '"django.tasks.backends.immediate.ImmediateBackend"'
    ),
}


def test_the_vendored_tests_are_djangos_but_for_the_backends_they_name() -> None:
    assert sorted(p.name for p in (HERE / "tasks").glob("*.py")) == sorted(DJANGO_SHA256)
    for name, digest in DJANGO_SHA256.items():
        text = (HERE / "tasks" / name).read_text()
        for ours, djangos in SUBSTITUTED.items():
            text = text.replace(ours, djangos)
        assert hashlib.sha256(text.encode()).hexdigest() == digest, f"{name} was changed"


def test_each_skip_names_a_test_of_the_suite() -> None:
    for test in SKIPPED:
        module, cls, method = test.split("::")
        source = (HERE / "tasks" / module).read_text()
        body = source.split(f"\nclass {cls}(", 1)[1]
        body = re.split(r"\nclass ", body, maxsplit=1)[0]
        assert re.search(rf"\n    (async )?def {method}\(", body), test
