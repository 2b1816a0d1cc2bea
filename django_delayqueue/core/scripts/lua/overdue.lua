-- overdue: how many messages wait past their time, for the stats (how late the work is now:
-- queuestats, the admin, metrics, the health report).
-- KEYS[1] pending zset   KEYS[2] retry zset   KEYS[3] key_state hash   KEYS[4] key_turns zset
-- KEYS[5] key_waiting zset   KEYS[6] key_tats zset   KEYS[7] key_lists prefix
-- ARGV[1] now (ms)   ARGV[2] the flow keys' limits: "<key cap> <key interval ms> <key burst>"
--   (as counts.lua's; '' or 0s: none)
-- returns: {pending messages due by now, retrying messages whose retry time has come,
--           keyed ready messages their key's limits do not hold back}
-- A consumer's round moves pending and retrying messages to ready within milliseconds of
-- their time; with no consumer running they stay where they are, so the backlog of an outage
-- is here, not in ready. Two ZCOUNTs: O(log n) whatever the backlog.
-- Keyed ready messages (includes/key_turns.lua) wait in their keys' lists. Without key limits
-- nothing holds them: all of them count (one HGET). With key limits, the rule is counts.lua's
-- for the oldest overdue: a key out of slots (key_concurrency) or out of tokens
-- (key_rate_limit) holds its messages back on purpose; a key that is not gives as many as it
-- has free slots and tokens now, the rest of its list waiting on them. The keys read: those
-- in the rotation, and those whose token came (the next claim puts them back in it), at most
-- MOST_KEYS of each (a few commands per key); keys past them are not counted.
local pending, retry, key_state, key_turns = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local key_waiting, key_tats, key_lists = KEYS[5], KEYS[6], KEYS[7]
local now = tonumber(ARGV[1])
local key_cap, key_interval, key_burst = string.match(ARGV[2] or '', '^(%S+) (%S+) (%S+)')
key_cap, key_interval, key_burst =
  tonumber(key_cap) or 0, tonumber(key_interval) or 0, tonumber(key_burst) or 1
local MOST_KEYS = 1000

-- free_now(key): how many of the key's ready messages its limits let go now.
local function free_now(key)
  local n = redis.call('LLEN', key_lists .. key)
  if key_cap > 0 and n > 0 then
    n = math.min(n, key_cap - (tonumber(redis.call('HGET', key_state, 'c:' .. key)) or 0))
  end
  if key_interval > 0 and n > 0 then
    -- GCRA, as includes/key_claims.lua takes: each message taken moves the key's time on by
    -- one interval; one may go while that time is at most (burst - 1) intervals ahead.
    local tat = math.max(tonumber(redis.call('ZSCORE', key_tats, key)) or now, now)
    n = math.min(n, math.floor((now - tat) / key_interval + key_burst + 1e-9))
  end
  return math.max(0, n)
end

local keyed = tonumber(redis.call('HGET', key_state, ' ready')) or 0
if keyed > 0 and (key_cap > 0 or key_interval > 0) then
  local free = 0
  for _, key in ipairs(redis.call('ZRANGE', key_turns, 0, MOST_KEYS - 1)) do
    free = free + free_now(key)
  end
  local came = redis.call('ZRANGEBYSCORE', key_waiting, '-inf', now, 'LIMIT', 0, MOST_KEYS)
  for _, key in ipairs(came) do free = free + free_now(key) end
  keyed = math.min(keyed, free)
end
return {
  redis.call('ZCOUNT', pending, '-inf', now),
  redis.call('ZCOUNT', retry, '-inf', now),
  keyed,
}
