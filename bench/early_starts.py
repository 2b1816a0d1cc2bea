"""Early starts (issue 37): how many handlers started before the instant their message became
due, first attempts and retries counted apart.

    python -m bench --only early [--quick]

Two consumer processes (as ``runqueue --processes 2``: ``bench/early_child.py``, concurrency
4 each) on one queue; messages due over a window, a share of them failing their first attempt
with a retry 50-500 ms later. Each start, read on its consumer's clock, is compared with the
instant its message became due: a first attempt's due time (its envelope's), a retry's retry
time as the consumer that failed it sent it in its nack. The lateness histogram cannot show
an early start (no bucket below 0, whole milliseconds): these rows count them, raw, with the
worst, and give how many were more than 1 ms early.

Same run, the consumers of ``$BENCH_BASE_REF`` (default: main before the fix, whose handlers
waited only for the envelope's due time, long past for a retry) as the baseline: the same
child module run on that commit's package (``git archive``).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import tarfile
import tempfile
from io import BytesIO
from pathlib import Path
from typing import Any

from django_delayqueue.core import Queue

from .harness import ROOT, Bench, Child, Row, wait_until
from .sizes import Sizes

BASE_REF = "0cc4333"  # main before the fix (issue 37: retries started up to a claim lead early)
CHILD = ["-m", "bench.early_child"]
PROCESSES = 2
RETRY_SHARE = 0.15  # of first attempts (the run: 430 retries of 3,000 messages)
RETRY_MS = (50, 500)


def _base_ref() -> str:
    return os.environ.get("BENCH_BASE_REF", BASE_REF)


class _BaseCheckout:
    """The base commit's package (``git archive``) beside this checkout's child module, in a
    temporary directory; ``root`` is None when git cannot give it."""

    def __init__(self) -> None:
        self._tmp = tempfile.TemporaryDirectory(prefix="dq-bench-early-")
        self.root: Path | None = Path(self._tmp.name)
        try:
            archive = subprocess.run(
                ["git", "archive", _base_ref(), "django_delayqueue"],
                cwd=ROOT,
                capture_output=True,
                check=True,
            ).stdout
            with tarfile.open(fileobj=BytesIO(archive)) as tar:
                tar.extractall(self.root, filter="data")
        except (OSError, subprocess.CalledProcessError, tarfile.TarError):
            self.root = None
            return
        (self.root / "bench").mkdir()
        for name in ("__init__.py", "early_child.py"):
            shutil.copy(ROOT / "bench" / name, self.root / "bench" / name)

    def close(self) -> None:
        self._tmp.cleanup()


class Counted:
    """Early starts of one kind (first attempts or retries): how many, how early."""

    def __init__(self, early_ms: list[float]) -> None:
        self.total = len(early_ms)
        self.early = [x for x in early_ms if x > 0]
        self.over_1ms = sum(1 for x in self.early if x > 1)
        self.worst = max(self.early, default=0.0)

    def text(self, kind: str) -> str:
        if not self.early:
            return f"0 of {self.total:,} {kind} early"
        return (
            f"{len(self.early):,} of {self.total:,} {kind} early, {self.over_1ms:,} by more "
            f"than 1 ms, the worst by {self.worst:.2f} ms"
        )

    def extra(self) -> dict[str, Any]:
        return {
            "total": self.total,
            "early": len(self.early),
            "early_over_1ms": self.over_1ms,
            "worst_ms": round(self.worst, 3),
        }


def _run(bench: Bench, sizes: Sizes, root: Path | None) -> tuple[Counted, Counted]:
    """One run of the children from ``root`` (None: this checkout): (first attempts, retries)."""
    queue = Queue(bench.client, "bench-early")
    count = sizes.lateness
    window_ms = int(sizes.lateness_seconds * 1000)
    extra = ["--url", bench.url, "--queue", queue.name, "--concurrency", "4"]
    children = [Child([*CHILD, *extra], cwd=root) for _ in range(PROCESSES)]
    try:
        channel = queue.keys.wake_channel
        if not wait_until(
            lambda: bench.client.pubsub_numsub(channel)[0][1] >= PROCESSES, timeout=30
        ):
            raise RuntimeError("the early-start consumers did not subscribe within 30 s")
        rng = random.Random(37)
        start = queue.clock.now_ms() + 500
        messages = [
            {
                "payload": {
                    "n": i,
                    "retry_ms": rng.randint(*RETRY_MS) if rng.random() < RETRY_SHARE else 0,
                },
                "at": start + rng.randrange(window_ms),
                "id": f"early-{i}",
            }
            for i in range(count)
        ]
        for at in range(0, count, 1000):
            queue.schedule_many(messages[at : at + 1000])
        last = start + window_ms + RETRY_MS[1]

        def finished() -> bool:
            return queue.clock.now_ms() > last and not any(queue.counts().values())

        if not wait_until(finished, timeout=sizes.timeout + window_ms / 1000):
            raise RuntimeError(f"early starts: messages left {queue.counts()}")
        reports = [json.loads(c.stop(30)[0].strip().splitlines()[-1]) for c in children]
    finally:
        for c in children:
            c.kill()
    bench.flush()
    retry_at = {(r[0], r[1]): r[2] for report in reports for r in report["retries"]}
    first, retries = [], []
    for report in reports:
        for message_id, attempt, started, due in report["starts"]:
            if attempt == 1:
                first.append(due - started)
            else:
                retries.append(retry_at[(message_id, attempt)] - started)
    return Counted(first), Counted(retries)


def early_starts(bench: Bench, sizes: Sizes) -> list[Row]:
    spec = (
        f"{sizes.lateness:,} messages over {sizes.lateness_seconds:g} s, {PROCESSES} processes, "
        f"{RETRY_SHARE:.0%} retried {RETRY_MS[0]}-{RETRY_MS[1]} ms later"
    )
    first, retries = _run(bench, sizes, None)
    base = _BaseCheckout()
    try:
        before = _run(bench, sizes, base.root) if base.root is not None else None
    finally:
        base.close()
    baseline_what = f"the consumers of {_base_ref()}, same run"
    rows = []
    for key, kind, ours, theirs in (
        ("early.first", "first attempts", first, before[0] if before else None),
        ("early.retries", "retries", retries, before[1] if before else None),
    ):
        note = ours.text(kind)
        note += f"; {_base_ref()}: {theirs.text(kind)}" if theirs else "; no base checkout"
        rows.append(
            Row(
                key,
                f"{kind} started before they were due ({spec})",
                len(ours.early),
                "starts",
                None if theirs is None else len(theirs.early),
                baseline_what if theirs else "",
                target="0",
                ok=not ours.early and ours.total > 0,
                note=note,
                extra={"ours": ours.extra(), "base": theirs.extra() if theirs else None},
            )
        )
    return rows
