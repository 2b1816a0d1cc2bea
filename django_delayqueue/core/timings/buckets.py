"""The fixed histogram buckets of delivery timings, and quantiles read from bucket counts.

One set of upper bounds for every timing (start lateness, handler duration, limit wait), in
milliseconds: fine below 10 ms, where our promise lives, coarser up to five minutes, then
+Inf. Every consumer counts into the same buckets, so counts from many consumers and many
minutes add up field by field.

Each bucket is stored in Redis under a field number of its own (:func:`field_of`), which is its
index in the order the bounds were added, not in the order of the bounds: the buckets between
60 s and 300 s came later, and numbering them after the others leaves every count already in
Redis (and every count a consumer of an older release adds during a deploy) in a bucket with
the same upper bound. A reading counted before they existed stays in the bucket up to 300 s.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence

# Upper bounds (inclusive, as Prometheus' "le"), ms. The timings are read in whole
# milliseconds (the consumer's clock), so the buckets under 1 ms only ever hold 0 ms readings:
# they are kept so that a finer clock later needs no change of layout.
# Between 60 s and 300 s, four more: without them a p99 of 83 s read as 287 s (interpolated in
# one bucket four minutes wide), in the range where an outage of the consumers shows.
BOUNDS_MS: tuple[float, ...] = (
    0.25, 0.5, 1, 2, 5, 10, 25, 50, 100, 250, 500,
    1_000, 2_500, 5_000, 10_000, 30_000, 60_000,
    90_000, 120_000, 180_000, 240_000, 300_000,
)  # fmt: skip
BUCKETS = len(BOUNDS_MS) + 1  # the last one is +Inf
BOUNDS_SECONDS: tuple[float, ...] = tuple(b / 1000 for b in BOUNDS_MS)

# The upper bounds in the order their buckets were added (None: +Inf): a bucket's position here
# is its field number in Redis. Append only; never reorder.
_FIELD_ORDER: tuple[float | None, ...] = (
    0.25, 0.5, 1, 2, 5, 10, 25, 50, 100, 250, 500,
    1_000, 2_500, 5_000, 10_000, 30_000, 60_000, 300_000, None,
    90_000, 120_000, 180_000, 240_000,
)  # fmt: skip
_FIELDS: tuple[int, ...] = tuple(
    _FIELD_ORDER.index(BOUNDS_MS[i] if i < len(BOUNDS_MS) else None) for i in range(BUCKETS)
)
_BUCKET_OF_FIELD: dict[int, int] = {f: i for i, f in enumerate(_FIELDS)}


def field_of(bucket: int) -> int:
    """The number of bucket ``bucket``'s field in Redis (``l<n>``, ``d<n>``, ``w<n>``)."""
    return _FIELDS[bucket]


def bucket_of_field(number: int) -> int | None:
    """The bucket a Redis field number counts (None: a number this release does not know)."""
    return _BUCKET_OF_FIELD.get(number)


def bucket_of(ms: float) -> int:
    """The index of the bucket that counts a reading of ``ms`` (the first bound >= it)."""
    return bisect_left(BOUNDS_MS, ms)


def quantile_ms(counts: Sequence[int], q: float) -> float | None:
    """The ``q`` quantile (0-1) of the readings counted in ``counts`` (one count per bucket),
    interpolated linearly inside its bucket as Prometheus' ``histogram_quantile`` does: an
    estimate whose error is at most the width of that bucket. A quantile that falls in +Inf
    reads as the last finite bound. None when nothing was counted."""
    total = sum(counts)
    if total <= 0:
        return None
    rank = q * total
    below = 0
    for i, count in enumerate(counts):
        if count and below + count >= rank:
            if i >= len(BOUNDS_MS):
                return BOUNDS_MS[-1]
            lower = BOUNDS_MS[i - 1] if i else 0.0
            return lower + (BOUNDS_MS[i] - lower) * (rank - below) / count
        below += count
    return BOUNDS_MS[-1]
