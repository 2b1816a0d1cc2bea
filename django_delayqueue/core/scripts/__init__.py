"""The Lua scripts (``lua/``, one per state transition) and how Python runs them."""

from django_delayqueue.core.scripts.calls import LuaScript, ScriptBatch, redis_errors

__all__ = ["LuaScript", "ScriptBatch", "redis_errors"]
