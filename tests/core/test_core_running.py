"""core/running.py: what a running handler asks about its delivery (``message.aborted``,
``message.progress``), answered by the consumer once it is imported; the envelope needs no
consumer to ask, and before one registers the answers are those of a process where no handler
runs (what ``message.aborted`` and ``message.progress`` answered there before)."""

from __future__ import annotations

import subprocess
import sys

from paths import ROOT

from django_delayqueue.core import running
from django_delayqueue.core.consumer.handlers.answers import ANSWERS

WITHOUT_A_CONSUMER = """
import sys
sys.modules["django"] = None  # the core stands alone
from django_delayqueue.core.envelope import Message

m = Message("m", "q", {}, 0, 0, 1, "7")
print(m.aborted, m.progress(50, "half"))
try:
    m.progress(101)
except ValueError as e:
    print("ValueError:", e)
print(sorted(name for name in sys.modules if name.startswith("django_delayqueue.core.consumer")))
"""


def test_a_message_asks_without_importing_the_consumer() -> None:
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_A_CONSUMER],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines() == [
        "False False",
        "ValueError: progress percent must be from 0 to 100, not 101",
        "[]",
    ]


def test_the_consumer_answers_once_imported() -> None:
    assert running._answers is ANSWERS
