"""Uniqueness windows: what ``unique_for=`` costs a schedule, beside the same schedule without.

Both sides schedule fresh ids with random delays on the run's private Redis, interleaved round by
round (harness.interleave), so load from a neighbour hits both. The side without a window goes
through schedule.lua, the one with through schedule_unique.lua (a window read and written in the
same call, and up to two windows that are over forgotten per window opened).
"""

from __future__ import annotations

from collections.abc import Callable

from django_delayqueue.core import Queue

from .harness import Bench, Row, at_least, interleave
from .produce import messages
from .sizes import Sizes

WINDOW_S = 3600


def schedule_unique(bench: Bench, sizes: Sizes) -> list[Row]:
    rounds = sizes.schedule_rounds
    count = sizes.schedule_one
    share = count // rounds
    items = messages(count, seed=3)
    windowed, plain = Queue(bench.client, "bench-unique"), Queue(bench.client, "bench-plain")

    def one(queue: Queue, window: int | None, tag: str) -> Callable[[int], int]:
        def work(r: int) -> int:
            schedule = queue.schedule
            for i, item in enumerate(items[r * share : (r + 1) * share]):
                message_id = f"{tag}{i}-{r}"
                schedule(item["payload"], delay=item["delay"], id=message_id, unique_for=window)
            return share

        return work

    singles = interleave(rounds, one(windowed, WINDOW_S, "u"), one(plain, None, "p"))
    opened = bench.client.zcard(windowed.keys.unique)
    bench.flush()

    batch = sizes.schedule_many_batch
    many_share = sizes.schedule_many // sizes.rounds
    many_items = messages(sizes.schedule_many, seed=4)

    def many(queue: Queue, window: int | None, tag: str) -> Callable[[int], int]:
        def work(r: int) -> int:
            part = [
                {**item, "id": f"{tag}{i}-{r}", "unique_for": window}
                for i, item in enumerate(many_items[r * many_share : (r + 1) * many_share])
            ]
            for start in range(0, len(part), batch):
                queue.schedule_many(part[start : start + batch])
            return many_share

        return work

    bulk = interleave(sizes.rounds, many(windowed, WINDOW_S, "u"), many(plain, None, "p"))
    bench.flush()
    return [
        Row(
            "unique.one",
            f"schedule(id=..., unique_for={WINDOW_S}), one call per message ({count:,})",
            singles.rates[0],
            "msg/s",
            singles.rates[1],
            "schedule(id=...) without a window, same run",
            singles.ratio,
            ">= 0.7x without",
            at_least(singles.ratio, 0.7),
            extra={"windows_opened": opened, "rounds": singles.rounds},
        ),
        Row(
            "unique.many",
            f"schedule_many() items with unique_for, batches of {batch}",
            bulk.rates[0],
            "msg/s",
            bulk.rates[1],
            "schedule_many() of the same items without a window",
            bulk.ratio,
            ">= 0.5x without",
            at_least(bulk.ratio, 0.5),
            extra={"rounds": bulk.rounds},
        ),
    ]
