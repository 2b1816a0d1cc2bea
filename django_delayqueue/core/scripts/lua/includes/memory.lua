-- includes/memory.lua: writing when Redis is out of memory (used_memory above maxmemory, with
-- the noeviction policy).
-- Redis then refuses the commands that may grow memory (HSET, ZADD, RPUSH, INCRBY, XADD...: its
-- "denyoom" commands), but inside a script only until the script's first write command of any
-- kind: after that it lets the script finish, as stopping it half-way would break its
-- atomicity. Redis 6.2 and 7.x do the same for scripts without a shebang (a 7.x shebang such as
-- `#!lua flags=allow-oom` does not load on 6.2, so none is used). Hence:
-- - a script refused for memory has changed nothing: refused at its first write, or not at all;
-- - a script whose first write frees memory (the ZREM of ack, nack, promote, reap, release,
--   cancel, purge, requeue, run_now) runs when memory is full, and so does one without writes;
-- - a script that must run when memory is full but would first write a growing command (claim's
--   INCRBY, extend's ZADD, a task result's or a tick run's HSET) calls allow_oom() first, so
--   that consumers go on delivering and acknowledging, which frees memory.
-- tests/core/test_core_scripts_memory.py runs every script on a full server of each Redis version.

-- allow_oom(key, kind): a write command that changes nothing (an empty score range removed from
-- a zset, or a field no hash of this library holds removed from a hash), after which Redis lets
-- this script write when memory is full. `kind` is 'zset' or 'hash': the key must be of that
-- type or missing (a WRONGTYPE error here comes before any write). Call it after the script's
-- type checks and right before its first write.
local function allow_oom(key, kind)
  if kind == 'hash' then
    redis.call('HDEL', key, ' allow oom')
  else
    redis.call('ZREMRANGEBYSCORE', key, '+inf', '-inf')
  end
end
