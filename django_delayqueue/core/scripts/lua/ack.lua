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
local unack, retry, garbage, messages = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local attempts, tokens, reasons, successors = KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local pending, ready, priorities, aborts = KEYS[9], KEYS[10], KEYS[11], KEYS[12]
local flow_keys, key_turns, key_waiting, key_state = KEYS[13], KEYS[14], KEYS[15], KEYS[16]
local key_tats, key_lists, key_load, progress = KEYS[17], KEYS[18], KEYS[19], KEYS[20]
--- @include "includes/guard.lua"
--- @include "includes/placing.lua"
guard(
  unack, 'zset', retry, 'zset', garbage, 'zset', messages, 'hash', attempts, 'hash',
  tokens, 'hash', reasons, 'hash', priorities, 'hash'
)
-- Keyed messages: one HLEN tells whether the queue has any (else nothing more is paid).
local K = nil
if redis.call('HLEN', flow_keys) > 0 then
  guard(
    key_turns, 'zset', key_waiting, 'zset', key_state, 'hash', key_tats, 'zset', key_load, 'zset'
  )
  K = keyed_keys(flow_keys, key_turns, key_waiting, key_state, key_tats, key_lists, key_load)
end
local now = tonumber(ARGV[1])
local horizon = now + tonumber(ARGV[2])
local has_successors = redis.call('EXISTS', successors) == 1
local has_progress = redis.call('EXISTS', progress) == 1
if has_successors then
  guard(successors, 'hash', pending, 'zset', ready, 'list')
  if not K then  -- a successor may bring a key
    guard(
      flow_keys, 'hash', key_turns, 'zset', key_waiting, 'zset', key_state, 'hash',
      key_load, 'zset'
    )
    K = keyed_keys(flow_keys, key_turns, key_waiting, key_state, key_tats, key_lists, key_load)
  end
end
local n, wake = 0, nil
for i = 4, #ARGV, 2000 do
  local last = math.min(i + 1999, #ARGV)
  local ids = {}
  for j = i, last, 2 do ids[#ids + 1] = ARGV[j] end
  local current = redis.call('HMGET', tokens, unpack(ids))
  local done, seen = {}, {}
  for k, id in ipairs(ids) do
    if current[k] == ARGV[i + 2 * k - 1] and not seen[id] then
      seen[id] = true
      done[#done + 1] = id
    end
  end
  if #done > 0 then
    redis.call('HDEL', aborts, unpack(done))
    if has_progress then redis.call('HDEL', progress, unpack(done)) end
    redis.call('ZREM', unack, unpack(done))
    redis.call('ZREM', retry, unpack(done))
    redis.call('ZREM', garbage, unpack(done))
    redis.call('HDEL', messages, unpack(done))
    redis.call('HDEL', attempts, unpack(done))
    redis.call('HDEL', tokens, unpack(done))
    redis.call('HDEL', reasons, unpack(done))
    redis.call('HDEL', priorities, unpack(done))
    if K then
      keys_freed(K, done, now)  -- before the flow keys go: it reads whether any is left
      redis.call('HDEL', K.flow_keys, unpack(done))
    end
    if has_successors then
      for _, id in ipairs(done) do
        local _, at = succeed(
          successors, messages, pending, ready, priorities, id, now, horizon, K
        )
        wake = earlier(wake, at)
      end
    end
    n = n + #done
  end
end
if wake ~= nil then redis.call('PUBLISH', ARGV[3], tostring(wake)) end
return n
