-- promote: due pending and due retry messages -> ready, in bounded batches.
-- KEYS[1] pending zset   KEYS[2] retry zset   KEYS[3] ready list   KEYS[4] tokens hash
-- KEYS[5] ready_since hash   KEYS[6] ranked zset   KEYS[7] priorities hash
-- KEYS[8] flow_keys hash   KEYS[9] key_turns zset   KEYS[10] key_waiting zset
-- KEYS[11] key_state hash   KEYS[12] key_tats zset   KEYS[13] key_lists prefix
-- KEYS[14] key_load zset
-- ARGV[1] now (ms)   ARGV[2] limit: most ids moved from each zset in this call
-- returns: {moved, more (1 when a zset still holds due ids), next due (ms) or -1,
--           how many wait in ready afterwards (the list and the ranked zset; dead entries of
--           cancelled messages included: a claim drops them, so they only cost a claim that
--           finds nothing)}
-- A message with a priority goes to its place in the ranked zset (see ready_list.lua), one with a
-- flow key to its key's list (key_turns.lua; one HLEN when the queue has no keyed message).
-- A retry id loses its delivery token here: a late ack of the old delivery must not delete a
-- message that is back in the ready list. Its retry time is recorded in ready_since: it is
-- overdue from then, not from the due time in its envelope.
-- An idle queue costs four reads: the heads of both zsets tell whether anything is due, and
-- the ready sizes let the caller skip its claim. Those reads also prove the four keys' types
-- before anything is written; the priorities hash is checked when anything is due, tokens and
-- ready_since only when a retry is.
local pending, retry, ready, tokens = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local ready_since, ranked, priorities, flow_keys = KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local key_turns, key_waiting, key_state, key_tats = KEYS[9], KEYS[10], KEYS[11], KEYS[12]
local key_lists, key_load = KEYS[13], KEYS[14]
--- @include "includes/guard.lua"
--- @include "includes/ready_list.lua"
local now, limit = tonumber(ARGV[1]), tonumber(ARGV[2])
local function head(key)
  local first = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
  return first[2] and tonumber(first[2]) or nil
end
local heads = {head(pending), head(retry)}
local K = keyed_keys(flow_keys, key_turns, key_waiting, key_state, key_tats, key_lists, key_load)
local ready_count = redis.call('LLEN', ready) + redis.call('ZCARD', ranked)
if redis.call('HLEN', flow_keys) > 0 then ready_count = ready_count + keyed_ready(K) end
if heads[2] and heads[2] <= now then guard(tokens, 'hash', ready_since, 'hash') end
if (heads[1] and heads[1] <= now) or (heads[2] and heads[2] <= now) then
  guard(priorities, 'hash')  -- to_ready reads it after the first ZREM
  if redis.call('HLEN', flow_keys) > 0 then
    guard(key_turns, 'zset', key_waiting, 'zset', key_state, 'hash', key_load, 'zset')
  end
end
local moved, more, next_due = 0, 0, -1
local sources = {pending, retry}  -- in the order of heads
for index = 1, 2 do
  local src, first = sources[index], heads[index]
  if first and first <= now then
    local ids, since = {}, {}
    if index == 1 then
      ids = redis.call('ZRANGEBYSCORE', src, '-inf', ARGV[1], 'LIMIT', 0, limit)
    else
      local scored = redis.call('ZRANGEBYSCORE', src, '-inf', ARGV[1], 'WITHSCORES', 'LIMIT', 0,
        limit)
      for i = 1, #scored, 2 do
        ids[#ids + 1] = scored[i]
        since[i], since[i + 1] = scored[i], scored[i + 1]
      end
    end
    for i = 1, #ids, 500 do
      local chunk = {unpack(ids, i, math.min(i + 499, #ids))}
      redis.call('ZREM', src, unpack(chunk))
      to_ready(ready, ranked, priorities, chunk, false, K)
      if index == 2 then
        redis.call('HDEL', tokens, unpack(chunk))
        redis.call('HSET', ready_since, unpack(since, 2 * i - 1, 2 * (i + #chunk - 1)))
      end
    end
    moved = moved + #ids
    first = head(src)
    -- Ask again only if due ids are left: a batch of exactly `limit` may have emptied it.
    if first and first <= now then more = 1 end
  end
  if first and (next_due == -1 or first < next_due) then next_due = first end
end
return {moved, more, next_due, ready_count + moved}
