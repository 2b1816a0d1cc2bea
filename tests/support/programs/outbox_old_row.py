"""An outbox row as a process not yet upgraded to migration 0007 writes it during a rolling
deploy: without the ``unique_ms`` column. Migrates the database of ``drill_settings`` (its SQLite
file, or ``$DRILL_PG_NAME`` on PostgreSQL), inserts such a row with raw SQL naming only the
columns of 0006's table, runs one relay pass and prints what Redis holds as JSON.
"""

import json
import os
import uuid
from datetime import timedelta

import django

django.setup()

import redis  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import connection, transaction  # noqa: E402
from django.utils import timezone  # noqa: E402

import django_delayqueue as dq  # noqa: E402
from django_delayqueue.models import OutboxMessage  # noqa: E402
from django_delayqueue.outbox.relay import OutboxRelay  # noqa: E402

call_command("migrate", verbosity=0)
queue = dq.get_queue("drill")
prepared = queue.prepare({"n": 1}, id="old-1")
meta = OutboxMessage._meta
old_columns = {
    "id": uuid.uuid4(),
    "queue": "drill",
    "message_id": prepared.id,
    "due_ms": prepared.due_ms,
    "envelope": prepared.envelope,
    "mode": OutboxMessage.SCHEDULE,
    "record": "",
    "priority": 0,
    "created_at": timezone.now() - timedelta(minutes=1),
    "attempts": 0,
    "last_error": "",
}
names = ", ".join(connection.ops.quote_name(meta.get_field(f).column) for f in old_columns)
values = [meta.get_field(f).get_db_prep_value(v, connection) for f, v in old_columns.items()]
inserted = "inserted"
try:
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {connection.ops.quote_name(meta.db_table)} ({names}) "
            f"VALUES ({', '.join(['%s'] * len(values))})",
            values,
        )
except Exception as e:  # the old process's transaction failing: what the test looks for
    inserted = f"{type(e).__name__}: {e}"
done = OutboxRelay().relay_once()
client = redis.Redis.from_url(os.environ["REDIS_URL"])
keys = queue.keys  # type: ignore[attr-defined]
print(
    json.dumps(
        {
            "vendor": connection.vendor,
            "inserted": inserted,
            "sent": done.sent,
            "failed": done.failed,
            "stored": bool(client.hexists(keys.messages, "old-1")),
            "window": client.zscore(keys.unique, "old-1"),
            "rows_left": OutboxMessage.objects.count(),
        }
    )
)
