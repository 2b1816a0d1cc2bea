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
local unack, tokens, aborts, messages = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local pending, retry, garbage = KEYS[5], KEYS[6], KEYS[7]
--- @include "includes/guard.lua"
--- @include "includes/memory.lua"
local id = ARGV[2]
if redis.call('ZSCORE', unack, id) then
  guard(aborts, 'hash')
  local token = redis.call('HGET', tokens, id)
  if token then
    allow_oom(aborts, 'hash')
    redis.call('HSETNX', aborts, id, token .. ' ' .. ARGV[3])
    redis.call('PUBLISH', ARGV[1], 'abort')
    return 'unack'
  end
end
if redis.call('ZSCORE', pending, id) then return 'pending' end
if redis.call('ZSCORE', retry, id) then return 'retry' end
if redis.call('ZSCORE', garbage, id) then return 'garbage' end
if redis.call('HEXISTS', messages, id) == 1 then return 'ready' end
return ''
