"""A flow key given to ``dq.schedule`` inside a transaction, with the outbox on, is kept: in the
row's envelope (the bytes Redis stores, so no column of its own and no migration), sent right
after the commit, or by the relay once Redis is back; the admin's outbox list shows it
(docs/flow-control.md, "Keys everywhere a message is scheduled").

A program (tests/support/programs/outbox_keyed_rows.py) migrates a fresh database and runs
both paths: on SQLite and on the PostgreSQL of this machine (a database the test creates and
drops).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from django.conf import settings
from django.db import transaction
from django.test import override_settings
from outbox_programs import run_program
from postgres_databases import database_env

import django_delayqueue as dq
from django_delayqueue.embedded import RedisServerProcess, free_port


@pytest.fixture(params=["sqlite", "postgresql"])
def database(request: pytest.FixtureRequest) -> Iterator[dict[str, str]]:
    yield from database_env(request, "dq_outbox_keys")


def test_a_keyed_message_keeps_its_key_through_the_commit_and_the_relay(
    tmp_path: Path,
    database: dict[str, str],
    redis_client: redis.Redis,
    redis_server: RedisServerProcess,
) -> None:
    seen = run_program("outbox_keyed_rows.py", tmp_path, redis_server.url, database)
    assert seen["vendor"] == ("postgresql" if database else "sqlite")
    assert seen["committed_row_key"] == "+33612345678"  # in the row, inside the transaction
    assert seen["kept_row_key"] == "store-42" and seen["kept_before_relay"] is False
    assert (seen["sent"], seen["failed"], seen["rows_left"]) == (1, 0, 0)
    assert seen["stored_keys"] == {"committed": "+33612345678", "relayed": "store-42"}
    assert seen["flow_keys"] == {"committed": "+33612345678", "relayed": "store-42"}


@pytest.mark.django_db(transaction=True)
def test_the_admin_outbox_list_shows_each_rows_key(admin_client: object) -> None:
    down = {**settings.DELAYQUEUE, "REDIS_URL": f"redis://127.0.0.1:{free_port()}/0"}
    with override_settings(DELAYQUEUE=down):
        with transaction.atomic():
            dq.schedule("order-close", {"n": 1}, delay=60, id="keyed", key="<i>store-42</i>")
        with transaction.atomic():
            dq.schedule("order-close", {"n": 2}, delay=60, id="plain")
    listing = admin_client.get("/admin/django_delayqueue/outboxmessage/")  # type: ignore[attr-defined]
    text = listing.content.decode()
    assert "flow key" in text.lower() and "&lt;i&gt;store-42&lt;/i&gt;" in text
    assert "<i>store-42</i>" not in text  # escaped
