-- abort: ask the handler of an in-flight message to stop (dq.abort, the admin's "Stop").
-- Recorded only while the message is in unack (claimed: running, or about to), under the
-- delivery's token, and announced on the wake channel so that its consumer learns it at once.
-- KEYS[1] unack zset   KEYS[2] tokens hash   KEYS[3] aborts hash   KEYS[4] messages hash
-- KEYS[5] pending zset   KEYS[6] retry zset   KEYS[7] garbage zset
-- ARGV[1] wake channel   ARGV[2] id   ARGV[3] reason
-- returns: the state the message was in: 'unack' (the abort is recorded), else 'pending',
-- 'retry', 'garbage', 'ready' or '' (no such message), and nothing is changed
-- The delivery ends in the dead letters with the reason "aborted: <reason>": its consumer
-- records it so, and ack, nack, reap and release remove the entry (the last three bury the
-- message instead of retrying it). A second abort of the same delivery keeps the first reason.
-- It runs when Redis is out of memory (allow_oom): staff may have to stop a runaway handler then.
--- @include "includes/guard.lua"
--- @include "includes/memory.lua"
local id = ARGV[2]
if redis.call('ZSCORE', KEYS[1], id) then
  guard(KEYS[3], 'hash')
  local token = redis.call('HGET', KEYS[2], id)
  if token then
    allow_oom(KEYS[3], 'hash')
    redis.call('HSETNX', KEYS[3], id, token .. ' ' .. ARGV[3])
    redis.call('PUBLISH', ARGV[1], 'abort')
    return 'unack'
  end
end
if redis.call('ZSCORE', KEYS[5], id) then return 'pending' end
if redis.call('ZSCORE', KEYS[6], id) then return 'retry' end
if redis.call('ZSCORE', KEYS[7], id) then return 'garbage' end
if redis.call('HEXISTS', KEYS[4], id) == 1 then return 'ready' end
return ''
