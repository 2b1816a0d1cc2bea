"""The Lua scripts (``lua/``, one per state transition), what each takes (``contracts.py``) and
how Python runs them."""

from django_delayqueue.core.scripts.calls import LuaScript, ScriptBatch, ScriptCall, redis_errors

__all__ = ["LuaScript", "ScriptBatch", "ScriptCall", "redis_errors"]
