-- ack: deliveries finished; the messages are gone (envelope, attempts, token, reason), or
-- replaced by their successor: a message scheduled under the same id with replace=True while
-- the delivery ran, which now goes to pending (or ready, when due) as a new message.
-- KEYS[1] unack zset   KEYS[2] retry zset   KEYS[3] garbage zset   KEYS[4] messages hash
-- KEYS[5] attempts hash   KEYS[6] tokens hash   KEYS[7] reasons hash   KEYS[8] successors hash
-- KEYS[9] pending zset   KEYS[10] ready list   KEYS[11] priorities hash   KEYS[12] aborts hash
-- KEYS[13] flow_keys hash   KEYS[14] key_turns zset   KEYS[15] key_waiting zset
-- KEYS[16] key_state hash   KEYS[17] key_tats zset   KEYS[18] key_lists prefix
-- KEYS[19] key_load zset
-- KEYS[20] progress hash
-- ARGV[1] now (ms)   ARGV[2] announce horizon (ms)   ARGV[3] wake channel
-- ARGV[4..] pairs: id, token
-- returns: number of messages acknowledged
-- Only the delivery holding the current token may ack. A late ack (deadline passed, message
-- reaped to retry or garbage) still counts while no newer delivery began; once the message is
-- back in ready or claimed again the token differs and the ack is ignored.
-- Tokens are read with one HMGET and the messages deleted with one variadic call per key (per
-- chunk of 1000, under Lua's unpack limit): a batch costs Redis little more than one message.
-- An abort of an acknowledged delivery (abort.lua) came too late: its entry goes (the first
-- write of a chunk, so a key of the wrong type fails it before anything changed), and so does
-- its progress (progress.lua), right after it, looked for only when the queue has some (one
-- EXISTS: a queue whose handlers never report passes no ids to delete).
-- Successors are looked for only when the queue has some (one EXISTS otherwise). A successor
-- due now or within the horizon is announced on the wake channel, as schedule.lua does.
-- A keyed message's flow key goes with it (a successor brings its own), and the slot it held
-- of its key is freed (includes/key_turns.lua).
--- @include "includes/guard.lua"
--- @include "includes/placing.lua"
guard(
  KEYS[1], 'zset', KEYS[2], 'zset', KEYS[3], 'zset', KEYS[4], 'hash', KEYS[5], 'hash',
  KEYS[6], 'hash', KEYS[7], 'hash', KEYS[11], 'hash'
)
-- Keyed messages: one HLEN tells whether the queue has any (else nothing more is paid).
local K = nil
if redis.call('HLEN', KEYS[13]) > 0 then
  guard(KEYS[14], 'zset', KEYS[15], 'zset', KEYS[16], 'hash', KEYS[17], 'zset', KEYS[19], 'zset')
  K = keyed_keys(13)
end
local now = tonumber(ARGV[1])
local horizon = now + tonumber(ARGV[2])
local successors = redis.call('EXISTS', KEYS[8]) == 1
local progress = redis.call('EXISTS', KEYS[20]) == 1
if successors then
  guard(KEYS[8], 'hash', KEYS[9], 'zset', KEYS[10], 'list')
  if not K then  -- a successor may bring a key
    guard(KEYS[13], 'hash', KEYS[14], 'zset', KEYS[15], 'zset', KEYS[16], 'hash', KEYS[19], 'zset')
    K = keyed_keys(13)
  end
end
local n, wake = 0, nil
for i = 4, #ARGV, 2000 do
  local last = math.min(i + 1999, #ARGV)
  local ids = {}
  for j = i, last, 2 do ids[#ids + 1] = ARGV[j] end
  local current = redis.call('HMGET', KEYS[6], unpack(ids))
  local done, seen = {}, {}
  for k, id in ipairs(ids) do
    if current[k] == ARGV[i + 2 * k - 1] and not seen[id] then
      seen[id] = true
      done[#done + 1] = id
    end
  end
  if #done > 0 then
    redis.call('HDEL', KEYS[12], unpack(done))
    if progress then redis.call('HDEL', KEYS[20], unpack(done)) end
    for key = 1, 3 do redis.call('ZREM', KEYS[key], unpack(done)) end
    for key = 4, 7 do redis.call('HDEL', KEYS[key], unpack(done)) end
    redis.call('HDEL', KEYS[11], unpack(done))
    if K then
      keys_freed(K, done, now)  -- before the flow keys go: it reads whether any is left
      redis.call('HDEL', K.flow_keys, unpack(done))
    end
    if successors then
      for _, id in ipairs(done) do
        local _, at = succeed(
          KEYS[8], KEYS[4], KEYS[9], KEYS[10], KEYS[11], id, now, horizon, K
        )
        wake = earlier(wake, at)
      end
    end
    n = n + #done
  end
end
if wake ~= nil then redis.call('PUBLISH', ARGV[3], tostring(wake)) end
return n
