-- defer: claimed deliveries whose envelope is of a format this consumer does not read (a newer
-- release wrote it) -> retry, left for a consumer that reads it, without using up an attempt.
-- KEYS[1] unack zset   KEYS[2] retry zset   KEYS[3] attempts hash   KEYS[4] tokens hash
-- KEYS[5] garbage zset   KEYS[6] reasons hash   KEYS[7] aborts hash   KEYS[8] progress hash
-- KEYS[9] newer hash
-- KEYS[10] flow_keys hash   KEYS[11] key_turns zset   KEYS[12] key_waiting zset
-- KEYS[13] key_state hash   KEYS[14] key_tats zset   KEYS[15] key_lists prefix
-- KEYS[16] key_load zset
-- ARGV[1] now (ms)   ARGV[2] first wait (ms)   ARGV[3] longest wait (ms)
-- ARGV[4] the newest format this consumer reads
-- ARGV[5..] triples: id, token, the format of its envelope
-- returns: one integer per message: 1 left for a newer consumer, 2 dead (aborted, or an attempt
-- count that is not a number), 0 stale (token no longer current)
-- Never the dead letters for the format: a consumer that reads it delivers the message. Each
-- message waits in retry, its attempt given back (as release.lua does), for the first wait
-- doubled each time a consumer left it so (counted in the newer hash: "<format> <times>"), up
-- to the longest: consumers that cannot read it claim it again rarely, and one that can finds
-- it within the longest wait of starting. Its reason says why it waits (the admin shows it),
-- and the newer hash counts it for the stats ("3 messages wait for a newer consumer").
-- A keyed message frees its key's slot, as any end of a delivery does (includes/key_turns.lua).
-- An aborted one (abort.lua) goes to the dead letters with the abort's reason, as release.lua
-- sends it. Its progress (progress.lua) goes either way.
local unack, retry, attempts, tokens = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local garbage, reasons, aborts, progress = KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local newer, flow_keys, key_turns, key_waiting = KEYS[9], KEYS[10], KEYS[11], KEYS[12]
local key_state, key_tats, key_lists, key_load = KEYS[13], KEYS[14], KEYS[15], KEYS[16]
--- @include "includes/guard.lua"
--- @include "includes/attempts.lua"
--- @include "includes/aborts.lua"
--- @include "includes/key_turns.lua"
guard(
  unack, 'zset', retry, 'zset', attempts, 'hash', tokens, 'hash', garbage, 'zset',
  reasons, 'hash', aborts, 'hash', progress, 'hash', newer, 'hash'
)
if redis.call('HLEN', flow_keys) > 0 then
  guard(
    key_turns, 'zset', key_waiting, 'zset', key_state, 'hash', key_tats, 'zset', key_load, 'zset'
  )
end
local K = keyed_keys(flow_keys, key_turns, key_waiting, key_state, key_tats, key_lists, key_load)
local now, first_wait, longest = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local reads = ARGV[4]
local results = {}
for i = 5, #ARGV, 3 do
  local id, token, format = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  local result = 0
  if redis.call('HGET', tokens, id) == token and redis.call('ZSCORE', unack, id) then
    local count, bad = attempt_count(redis.call('HGET', attempts, id))
    local aborted = take_abort(aborts, id, token)
    redis.call('HDEL', progress, id)
    redis.call('ZREM', unack, id)
    redis.call('HDEL', tokens, id)
    key_slot_freed(K, id, now)
    if bad or aborted then
      redis.call('ZADD', garbage, now, id)
      redis.call('HSET', reasons, id, aborted or (bad .. ': left for a newer consumer'))
      redis.call('HDEL', newer, id)
      result = 2
    else
      if count > 1 then
        redis.call('HSET', attempts, id, count - 1)
      else
        redis.call('HDEL', attempts, id)
      end
      local times = tonumber(string.match(redis.call('HGET', newer, id) or '', ' (%d+)$')) or 0
      local wait = math.min(longest, first_wait * 2 ^ math.min(times, 40))
      redis.call('ZADD', retry, string.format('%.0f', now + wait), id)
      redis.call('HSET', reasons, id, 'waits for a consumer that reads envelope format ' ..
        format .. ' (left by one that reads formats up to ' .. reads .. ')')
      redis.call('HSET', newer, id, format .. ' ' .. (times + 1))
      result = 1
    end
  end
  results[#results + 1] = result
end
return results
