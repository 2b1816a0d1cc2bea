-- cancel: waiting messages (pending, retry or ready) -> gone, and successors (messages booked
-- with replace=True to follow a delivery) -> gone, whatever the state of the message they
-- follow. In-flight (unack) and dead (garbage) messages are not cancelled: the first may be
-- running, the second is purged.
-- KEYS[1] pending zset   KEYS[2] retry zset   KEYS[3] ready list   KEYS[4] messages hash
-- KEYS[5] attempts hash   KEYS[6] tokens hash   KEYS[7] reasons hash   KEYS[8] journal stream
-- KEYS[9] unack zset   KEYS[10] garbage zset   KEYS[11] cancelled hash
-- KEYS[12] ready_since hash   KEYS[13] successors hash   KEYS[14] ranked zset
-- KEYS[15] priorities hash
-- KEYS[16] flow_keys hash   KEYS[17] key_turns zset   KEYS[18] key_waiting zset
-- KEYS[19] key_state hash   KEYS[20] key_tats zset   KEYS[21] key_lists prefix
-- KEYS[22] key_load zset
-- KEYS[23] progress hash
-- KEYS[24..] the result record of each id (a task's; any type)
-- ARGV[1] now (ms)   ARGV[2] journal max length (approximate; 0: no journal entry)
-- ARGV[3] seconds a cancelled task's result record is kept (when it has no expiry yet)
-- ARGV[4..] ids
-- returns: number of messages cancelled (an id with a successor may count two)
-- O(log n) per id whatever the queue holds: the state is told by a few lookups (pending and
-- retry are left with ZREM; unack and garbage are left alone; an envelope with none of these
-- is in ready: in the ranked zset, left with ZREM, or in the list). Removing an id from the middle of the ready list would scan it (LREM), so its
-- entry stays there, counted dead in the cancelled hash, and its envelope goes: claim drops
-- the entry, counts and peek skip it. An entry at either end of the list is popped instead.
-- The cancelled messages are journalled as one entry (fields n, o) like a consumer batch: rows
-- [id, scheduled, due, delivered (null), finished (now), attempts so far, 'cancel', ''].
--- @include "includes/guard.lua"
--- @include "includes/envelope.lua"
--- @include "includes/attempts.lua"
--- @include "includes/ready_list.lua"
--- @include "includes/ended_record.lua"
guard(
  KEYS[1], 'zset', KEYS[2], 'zset', KEYS[3], 'list', KEYS[4], 'hash', KEYS[5], 'hash',
  KEYS[6], 'hash', KEYS[7], 'hash', KEYS[8], 'stream', KEYS[9], 'zset', KEYS[10], 'zset',
  KEYS[11], 'hash', KEYS[12], 'hash', KEYS[13], 'hash',
  KEYS[14], 'zset', KEYS[15], 'hash', KEYS[16], 'hash', KEYS[23], 'hash'
)
if redis.call('HLEN', KEYS[16]) > 0 then
  guard(KEYS[17], 'zset', KEYS[18], 'zset', KEYS[19], 'hash', KEYS[20], 'zset', KEYS[22], 'zset')
end
local K = keyed_keys(16)
local now, maxlen = tonumber(ARGV[1]), tonumber(ARGV[2])
local rows = {}

local function journal(id, envelope, attempt)
  local due, scheduled = envelope_times(envelope)
  if not due then due, scheduled = cjson.null, cjson.null end
  rows[#rows + 1] = {id, scheduled, due, cjson.null, now, attempt, 'cancel', ''}
end

local function waiting(id)
  if redis.call('ZREM', KEYS[1], id) == 1 or redis.call('ZREM', KEYS[2], id) == 1 then
    return true
  end
  if redis.call('ZSCORE', KEYS[9], id) or redis.call('ZSCORE', KEYS[10], id)
      or redis.call('HEXISTS', KEYS[4], id) == 0 then
    return false
  end
  local key = redis.call('HGET', K.flow_keys, id)
  if not (key and key_drop(K, key, id, now)) then
    drop_from_ready(KEYS[3], KEYS[11], KEYS[14], id)
  end
  return true
end

for i = 4, #ARGV do
  local id = ARGV[i]
  local successor = redis.call('HGET', KEYS[13], id)
  if successor then
    redis.call('HDEL', KEYS[13], id)
    journal(id, successor, 0)
  end
  if waiting(id) then
    local attempt = attempt_count(redis.call('HGET', KEYS[5], id)) or cjson.null
    journal(id, redis.call('HGET', KEYS[4], id), attempt)
    for key = 4, 7 do redis.call('HDEL', KEYS[key], id) end
    redis.call('HDEL', KEYS[12], id)
    redis.call('HDEL', KEYS[15], id)
    redis.call('HDEL', KEYS[16], id)
    -- None by rights (only an in-flight delivery writes one, and ends it): a leftover goes too.
    redis.call('HDEL', KEYS[23], id)
    -- A task's result says FAILED from now on (get_result sees its message gone), for as long
    -- as a finished task's is kept; no expiry would keep it for ever. One it has stays.
    keep_ended_record(KEYS[20 + i], ARGV[3])
  end
end
if #rows > 0 and maxlen > 0 then
  redis.call('XADD', KEYS[8], 'MAXLEN', '~', maxlen, '*', 'n', #rows, 'o', cjson.encode(rows))
end
return #rows
