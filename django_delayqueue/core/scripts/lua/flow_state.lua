-- flow_state: what the queue's flow limits are doing, for the stats (queuestats, admin, metrics).
-- KEYS[1] limiter hash   KEYS[2] unack zset
-- ARGV[1] now (ms)
-- returns: {held ('' when no limit holds the queue back), held since (ms, or -1), throttled,
-- messages started in the last whole second}
-- Reads only the limiter (includes/flow_limits.lua writes it) and the live part of unack; a
-- queue without limits has no limiter and reads as nothing held, nothing throttled.
-- The last claim's "held" is believed while the limit can still explain the wait: a rate's
-- next token not more than a second (and an interval) in the past, messages in flight for a
-- cap whose visibility deadline is still ahead (those of consumers killed -9 stay in unack
-- until reaped, past their deadline: they hold nothing the stats should believe). Consumers
-- that stopped claiming leave the flag behind: their queue's ready messages are then overdue
-- again, as they are without limits. A limit cleared since is the caller's (monitoring/flow.py).
local limiter, unack = KEYS[1], KEYS[2]
local state = redis.call(
  'HMGET', limiter, 'held', 'held_ms', 'throttled', 'window_ms', 'started', 'started_before',
  'tat', 'interval'
)
local now = tonumber(ARGV[1])
local held = state[1] or ''
if held == 'rate' then
  local tat, interval = tonumber(state[7]) or 0, tonumber(state[8]) or 0
  if tat < now - interval - 1000 then held = '' end
elseif held == 'in_flight' and redis.call('ZCOUNT', unack, '(' .. ARGV[1], '+inf') == 0 then
  held = ''
end
local window = now - now % 1000
local since = tonumber(state[4]) or 0
local last_second = 0
if since == window then
  last_second = tonumber(state[6]) or 0
elseif since == window - 1000 then
  last_second = tonumber(state[5]) or 0
end
return {held, tonumber(state[2]) or -1, tonumber(state[3]) or 0, last_second}
