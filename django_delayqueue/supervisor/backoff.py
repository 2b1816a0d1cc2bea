"""How long a supervisor waits before replacing a child that keeps dying soon after its start.

A child that dies once is replaced at once. One that dies within ``quick_seconds`` of its start
again and again (a crash at import, a handler that segfaults on every message) is replaced
after a delay that doubles each time, up to ``most_seconds``, so a crash loop does not fork a
hundred processes a second; a child that lived longer resets the count. Whether the child said
it consumes does not matter: a forked child says so before its first handler runs, and one
whose handler kills its process on every message is a crash loop all the same.
"""

from __future__ import annotations


class RestartBackoff:
    def __init__(
        self, quick_seconds: float = 10.0, first_seconds: float = 0.5, most_seconds: float = 30.0
    ) -> None:
        self.quick_seconds = quick_seconds
        self.first_seconds = first_seconds
        self.most_seconds = most_seconds
        self.quick_deaths = 0

    def lived(self, lived_seconds: float) -> None:
        """A child ended (however) after ``lived_seconds``: a long life resets the count."""
        if lived_seconds >= self.quick_seconds:
            self.quick_deaths = 0

    def died(self, lived_seconds: float) -> float:
        """A child died after ``lived_seconds``: seconds to wait before its replacement."""
        if lived_seconds >= self.quick_seconds:
            self.quick_deaths = 0
            return 0.0
        self.quick_deaths += 1
        if self.quick_deaths == 1:
            return 0.0
        return min(self.most_seconds, self.first_seconds * 2 ** (self.quick_deaths - 2))
