"""Eight consumer processes racing over 100,000 messages that all fall due in the same second.

No fault is injected, so at-least-once must here be exactly once: each consumer tallies what
its handler saw in memory and writes the tally when it stops; the tallies together must hold
every id exactly once, and none delivered before its due time.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
import redis
from drill import consumers, producer, settled

from django_delayqueue.embedded import RedisServerProcess

pytestmark = pytest.mark.slow

MESSAGES = 100_000
CONSUMERS = 8


def test_eight_consumers_deliver_each_of_100k_simultaneous_messages_exactly_once(
    redis_server: RedisServerProcess, redis_client: redis.Redis, tmp_path: Path
) -> None:
    q = producer(redis_server.url, "race")
    due = q.clock.now_ms() + 6000  # every message due in the same millisecond
    ids = [f"r{i}" for i in range(MESSAGES)]
    result = q.schedule_many({"id": i, "payload": {"n": n}, "at": due} for n, i in enumerate(ids))
    assert result.scheduled == MESSAGES and not result.rejected
    assert q.counts()["pending"] == MESSAGES
    counts_dir = tmp_path / "counts"
    counts_dir.mkdir()
    with consumers(redis_server.url, "race", tmp_path, counts_dir=counts_dir) as cs:
        procs = [cs.start(claim_batch=200, visibility=60) for _ in range(CONSUMERS)]
        cs.wait(lambda: settled(q), 180, "all 100,000 messages to be acknowledged")
        assert [cs.stop(p) for p in procs] == [0] * CONSUMERS
    tallies = [json.loads(p.read_text()) for p in counts_dir.glob("*.json")]
    assert len(tallies) == CONSUMERS
    seen: Counter[str] = Counter()
    for tally in tallies:
        seen.update(tally["counts"])
        assert tally["early"] == 0
    assert set(seen) == set(ids), "lost or unknown messages"
    twice = {i: n for i, n in seen.items() if n != 1}
    assert not twice, f"{len(twice)} messages delivered more than once, e.g. {list(twice)[:5]}"
    # It was a race: the work really was shared out.
    assert sum(1 for t in tallies if t["counts"]) >= 2
    assert q.counts() == dict.fromkeys(("pending", "ready", "unack", "retry", "garbage"), 0)
    assert redis_client.hlen(q.keys.messages) == 0
