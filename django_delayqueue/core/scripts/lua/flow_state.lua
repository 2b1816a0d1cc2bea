-- flow_state: what the queue's flow limits are doing, for the stats (queuestats, admin, metrics).
-- KEYS[1] limiter hash
-- ARGV[1] now (ms)
-- returns: {held ('' when no limit holds the queue back), held since (ms, or -1), throttled,
-- messages started in the last whole second}
-- Reads only the limiter (includes/flow_limits.lua writes it); a queue without limits has none
-- and reads as nothing held, nothing throttled.
local state = redis.call(
  'HMGET', KEYS[1], 'held', 'held_ms', 'throttled', 'window_ms', 'started', 'started_before'
)
local now = tonumber(ARGV[1])
local window = now - now % 1000
local since = tonumber(state[4]) or 0
local last_second = 0
if since == window then
  last_second = tonumber(state[6]) or 0
elseif since == window - 1000 then
  last_second = tonumber(state[5]) or 0
end
return {state[1] or '', tonumber(state[2]) or -1, tonumber(state[3]) or 0, last_second}
