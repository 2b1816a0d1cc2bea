"""django_delayqueue.mirror: one pipeline for both kinds, and a ``conf`` that imports no model.

What each kind does (rows synced from the settings file, published on commit, read back) is
tested in test_models.py (queue settings) and test_recurring.py (recurring schedules).
"""

from __future__ import annotations

import pkgutil
import subprocess
import sys
from pathlib import Path

import django_delayqueue.conf
from django_delayqueue.mirror.kinds import MIRRORS, queue_settings_mirror, recurrences_mirror
from django_delayqueue.mirror.pipeline import Mirror
from django_delayqueue.models import QueueConfig, RecurringSchedule

ROOT = Path(__file__).resolve().parents[2]
# What conf.queues and conf.caches read before the apps are ready: model-free too.
MODEL_FREE = [
    f"django_delayqueue.conf.{m.name}"
    for m in pkgutil.iter_modules(django_delayqueue.conf.__path__)
] + ["django_delayqueue.mirror.queue_overrides", "django_delayqueue.mirror.recurrences"]


def test_conf_and_what_it_reads_of_the_mirror_import_no_model() -> None:
    """Importable before ``django.setup()``: a model import there would raise
    AppRegistryNotReady (or run up the layers, as conf.sync once did)."""
    code = (
        "import sys\n"
        "from django.conf import settings\n"
        "settings.configure()\n"
        f"for name in {MODEL_FREE!r}:\n"
        "    __import__(name)\n"
        "print('django_delayqueue.models' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_both_kinds_are_kept_by_the_one_pipeline() -> None:
    assert (queue_settings_mirror, recurrences_mirror) == MIRRORS
    assert all(isinstance(m, Mirror) for m in MIRRORS)
    assert [m.model for m in MIRRORS] == [QueueConfig, RecurringSchedule]
