"""The demo's customers: a generator of traffic for the shop, so that every queue has something
to do within a minute of ``make demo``.

It does what people on the shop's pages do, through the same code (shop/actions.py): customers
open orders and pay most of them (the rest are closed by ``order-close``; each payment tells
the partner through ``partner-callback``), new stores open (some add a product before their
activation SMS is due), a marketing campaign opens ten stores at once over five phone numbers
(a burst that ``activation-sms``'s rate limit and per-phone key spread out), and the export
task runs now and then (its progress shows in the admin). The sales report needs no
generator: runqueue keeps its schedule.

Run by ``manage.py demo_traffic`` (``make demo`` starts it; ``--no-traffic`` leaves it out).
The pace and the random choices are fixed by a seed, so two runs do the same things.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import random
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from types import FrameType

from django.conf import settings
from django.db import close_old_connections

from demo_project.shop import actions
from demo_project.shop.models import Store

logger = logging.getLogger(__name__)

PHONES = ("+15550101", "+15550102", "+15550103", "+15550104", "+15550105")
NAMES = (
    "Corner Books", "Blue Bicycle", "Tea & Tins", "Paper Moon", "Green Grocer", "Old Clocks",
    "Sea Salt", "Vinyl Hut", "Wool Works", "Bright Lamps", "Honey Pot", "Stone Bakery",
)  # fmt: skip


@dataclass(frozen=True)
class Pace:
    """How often the customers do what (seconds), and how many of them do it."""

    order_every: float = 2.5
    paid_share: float = 0.6  # of the orders, paid (the rest are closed unpaid)
    pay_within: tuple[float, float] = (2.0, 12.0)  # seconds after the order
    store_every: float = 6.0
    product_share: float = 0.25  # of the stores, add a product before their SMS is due
    first_campaign: float = 3.0
    campaign_every: float = 45.0
    campaign_stores: int = 10
    first_export: float = 2.0
    export_every: float = 40.0


class Traffic:
    """The customers' next actions, in time order. ``run`` plays them until stopped; a test
    may call ``run_due`` with a time of its own."""

    def __init__(
        self, pace: Pace | None = None, seed: int = 38, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.pace = pace or Pace()
        self.clock = clock
        self.stop_requested = threading.Event()
        self._rng = random.Random(seed)
        self._plan: list[tuple[float, int, Callable[[float], str]]] = []
        self._order = itertools.count()
        start = clock()
        self._at(start, self.new_order)
        self._at(start + 1.0, self.new_store)
        self._at(start + self.pace.first_campaign, self.campaign)
        self._at(start + self.pace.first_export, self.export)

    # --- running ---------------------------------------------------------------------------------

    def install_signal_handlers(self) -> None:
        """SIGTERM and SIGINT stop the run after the action under way."""

        def on_signal(signum: int, frame: FrameType | None) -> None:
            self.stop_requested.set()

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)

    def run(self, seconds: float | None = None) -> int:
        """Play the actions as they fall due, until stopped (or for ``seconds``); returns how
        many ran."""
        until = None if seconds is None else self.clock() + seconds
        done = 0
        while not self.stop_requested.is_set():
            now = self.clock()
            if until is not None and now >= until:
                break
            done += len(self.run_due(now))
            wait = self._plan[0][0] - self.clock() if self._plan else 1.0
            if until is not None:
                wait = min(wait, until - self.clock())
            self.stop_requested.wait(max(0.0, wait))
        return done

    def run_due(self, now: float) -> list[str]:
        """Run every action due at ``now``; returns what each did, in words. An action that
        fails (the database is locked, Redis is away) is logged and the run goes on."""
        said = []
        while self._plan and self._plan[0][0] <= now:
            _, _, action = heapq.heappop(self._plan)
            close_old_connections()
            try:
                text = action(now)
            except Exception:
                logger.exception("traffic: %s failed", getattr(action, "__name__", action))
                continue
            logger.info("traffic: %s", text)
            said.append(text)
        return said

    def _at(self, when: float, action: Callable[[float], str]) -> None:
        heapq.heappush(self._plan, (when, next(self._order), action))

    def _jitter(self, seconds: float) -> float:
        return seconds * self._rng.uniform(0.6, 1.4)

    # --- what the customers do --------------------------------------------------------------------

    def new_order(self, now: float) -> str:
        self._at(now + self._jitter(self.pace.order_every), self.new_order)
        amount = Decimal(self._rng.randint(500, 12_000)) / 100
        order = actions.open_order(amount)
        if self._rng.random() < self.pace.paid_share:
            pay_at = now + self._rng.uniform(*self.pace.pay_within)
            self._at(pay_at, lambda at, pk=order.pk: self.pay(pk))
            return f"order #{order.pk} opened ({amount}), to be paid"
        return f"order #{order.pk} opened ({amount}), never paid: it will be closed"

    def pay(self, pk: int) -> str:
        order, paid = actions.pay_order(pk)
        if paid:
            return f"order #{pk} paid: the partner is told"
        return f"order #{pk} not paid: it is {order.status} already"

    def new_store(self, now: float) -> str:
        self._at(now + self._jitter(self.pace.store_every), self.new_store)
        return self._open_store(now, self._rng.choice(PHONES))

    def campaign(self, now: float) -> str:
        """Ten stores at once on five phones: their activation SMS are due together."""
        self._at(now + self.pace.campaign_every, self.campaign)
        for i in range(self.pace.campaign_stores):
            self._open_store(now, PHONES[i % len(PHONES)], product=False)
        return (
            f"campaign: {self.pace.campaign_stores} stores opened at once on {len(PHONES)} "
            "phones (their SMS are due together: the rate limit and the per-phone key hold them)"
        )

    def _open_store(self, now: float, phone: str, product: bool = True) -> str:
        store = actions.open_store(self._rng.choice(NAMES), phone)
        if product and self._rng.random() < self.pace.product_share:
            soon = self._rng.uniform(0.5, 0.8) * float(settings.ACTIVATION_SMS_DELAY)
            self._at(now + soon, lambda at, s=store: self.add_product(s))
            return f"store {store.pk} opened ({phone}): it adds a product before its SMS"
        return f"store {store.pk} opened ({phone}): its activation SMS is scheduled"

    def add_product(self, store: Store) -> str:
        actions.add_product(store, self._rng.choice(("mug", "poster", "lamp", "scarf")))
        return f"store {store.pk} added a product: no SMS"

    def export(self, now: float) -> str:
        from .tasks import export_orders

        self._at(now + self.pace.export_every, self.export)
        result = export_orders.enqueue()
        return f"export task {result.id} enqueued (its progress shows in the admin)"
