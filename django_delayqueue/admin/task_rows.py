"""What a queue page shows of a task (Django's Tasks framework): its call, status and errors.

A task is a message like any other, so the page lists it with the same columns and actions;
these helpers add the task's name and a call preview (``send_sms(7, kind='x')``) in place of
the raw payload, and its result's status, attempts and last error, read for the whole page in
one round trip. The framework itself is not imported: the records are read as they are stored.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import redis
from django.utils.text import Truncator

from django_delayqueue.core.errors import CorruptEnvelope
from django_delayqueue.core.logical_queue import LogicalQueue
from django_delayqueue.tasks.payload import TASK_KEY, TaskRecord, is_task_payload

CALL_CHARS = 120


def task_call(payload: dict[str, Any]) -> str:
    """``name(arg, key=value)`` with JSON values, truncated for the table."""
    name = payload[TASK_KEY].rsplit(".", 1)[-1]
    args, kwargs = payload.get("args"), payload.get("kwargs")
    parts = [_json(a) for a in (args if isinstance(args, list) else [args] if args else [])]
    if isinstance(kwargs, dict):
        parts += [f"{k}={_json(v)}" for k, v in kwargs.items()]
    elif kwargs:
        parts.append(f"**{_json(kwargs)}")
    return Truncator(f"{name}({', '.join(parts)})").chars(CALL_CHARS)


def annotate(queue: LogicalQueue, rows: Sequence[dict[str, Any]]) -> bool:
    """Give each task row a ``task`` entry (name, call, status, errors); True if any is one."""
    tasks = [row for row in rows if is_task_payload(row.get("payload"))]
    if not tasks:
        return False
    pipe = queue.client.pipeline(transaction=False)
    for row in tasks:
        pipe.hgetall(queue.keys_for(row["id"]).task_result(row["id"]))
    try:
        records = pipe.execute(raise_on_error=False)
    except redis.RedisError:  # the page still lists the messages, without their results
        records = [None] * len(tasks)
    for row, raw in zip(tasks, records, strict=True):
        payload = row["payload"]
        info: dict[str, Any] = {
            "path": payload[TASK_KEY],
            "call": task_call(payload),
            "status": "no result record",
            "errors": 0,
            "last_error": "",
        }
        if isinstance(raw, Exception):
            info["status"] = "result record unreadable"
        elif raw:
            try:
                record = TaskRecord.from_hash(raw)
                errors = record.errors if isinstance(record.errors, list) else []
                last = errors[-1] if errors and isinstance(errors[-1], dict) else {}
                info["status"] = str(record.status)
                info["errors"] = len(errors)
                info["last_error"] = str(last.get("exception_class_path", ""))
            except (CorruptEnvelope, TypeError, AttributeError):
                info["status"] = "result record unreadable"
        row["task"] = info
    return True


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, sort_keys=True)
