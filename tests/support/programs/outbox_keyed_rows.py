"""Keyed messages through the outbox: migrates the database of ``drill_settings`` (its SQLite
file, or ``$DRILL_PG_NAME`` on PostgreSQL), schedules two keyed messages in transactions, one
sent right after its commit and one while Redis is down (kept as a row, then relayed), and
prints as JSON what the rows held and what Redis holds.

The key lives in the row's envelope (the one Redis stores), not in a column of its own.
"""

import json
import os

import django

django.setup()

import redis  # noqa: E402
from django.conf import settings  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import connection, transaction  # noqa: E402
from django.test import override_settings  # noqa: E402

import django_delayqueue as dq  # noqa: E402
from django_delayqueue.core.envelope import decode_envelope_parts  # noqa: E402
from django_delayqueue.embedded import free_port  # noqa: E402
from django_delayqueue.models import OutboxMessage  # noqa: E402
from django_delayqueue.outbox.relay import OutboxRelay  # noqa: E402

call_command("migrate", verbosity=0)
queue = dq.get_queue("drill")
client = redis.Redis.from_url(os.environ["REDIS_URL"], decode_responses=True)
keys = queue.keys  # type: ignore[attr-defined]
seen = {"vendor": connection.vendor}

with transaction.atomic():
    dq.schedule("drill", {"n": 1}, delay=60, id="committed", key="+33612345678")
    row = OutboxMessage.objects.get(message_id="committed")
    seen["committed_row_key"] = decode_envelope_parts(row.envelope).key

redis_down = override_settings(
    DELAYQUEUE={**settings.DELAYQUEUE, "REDIS_URL": f"redis://127.0.0.1:{free_port()}/0"}
)
with redis_down, transaction.atomic():
    dq.schedule("drill", {"n": 2}, delay=60, id="relayed", key="store-42")
kept = OutboxMessage.objects.get(message_id="relayed")
seen["kept_row_key"] = decode_envelope_parts(kept.envelope).key
seen["kept_before_relay"] = client.hexists(keys.messages, "relayed")
done = OutboxRelay().relay_once()
seen.update(sent=done.sent, failed=done.failed, rows_left=OutboxMessage.objects.count())
seen["flow_keys"] = client.hgetall(keys.flow_keys)
seen["stored_keys"] = {
    message_id: decode_envelope_parts(client.hget(keys.messages, message_id)).key
    for message_id in ("committed", "relayed")
}
print(json.dumps(seen))
