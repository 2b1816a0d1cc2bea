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
local pending, retry, ready, messages = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local attempts, tokens, reasons, journal = KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local unack, garbage, cancelled, ready_since = KEYS[9], KEYS[10], KEYS[11], KEYS[12]
local successors, ranked, priorities, flow_keys = KEYS[13], KEYS[14], KEYS[15], KEYS[16]
local key_turns, key_waiting, key_state, key_tats = KEYS[17], KEYS[18], KEYS[19], KEYS[20]
local key_lists, key_load, progress = KEYS[21], KEYS[22], KEYS[23]
local records = {}
for i = 24, #KEYS do records[i - 23] = KEYS[i] end
--- @include "includes/guard.lua"
--- @include "includes/envelope.lua"
--- @include "includes/attempts.lua"
--- @include "includes/ready_list.lua"
--- @include "includes/ended_record.lua"
guard(
  pending, 'zset', retry, 'zset', ready, 'list', messages, 'hash', attempts, 'hash',
  tokens, 'hash', reasons, 'hash', journal, 'stream', unack, 'zset', garbage, 'zset',
  cancelled, 'hash', ready_since, 'hash', successors, 'hash',
  ranked, 'zset', priorities, 'hash', flow_keys, 'hash', progress, 'hash'
)
if redis.call('HLEN', flow_keys) > 0 then
  guard(
    key_turns, 'zset', key_waiting, 'zset', key_state, 'hash', key_tats, 'zset', key_load, 'zset'
  )
end
local K = keyed_keys(flow_keys, key_turns, key_waiting, key_state, key_tats, key_lists, key_load)
local now, maxlen = tonumber(ARGV[1]), tonumber(ARGV[2])
local rows = {}

local function journal_row(id, envelope, attempt)
  local due, scheduled = envelope_times(envelope)
  if not due then due, scheduled = cjson.null, cjson.null end
  rows[#rows + 1] = {id, scheduled, due, cjson.null, now, attempt, 'cancel', ''}
end

local function waiting(id)
  if redis.call('ZREM', pending, id) == 1 or redis.call('ZREM', retry, id) == 1 then
    return true
  end
  if redis.call('ZSCORE', unack, id) or redis.call('ZSCORE', garbage, id)
      or redis.call('HEXISTS', messages, id) == 0 then
    return false
  end
  local key = redis.call('HGET', K.flow_keys, id)
  if not (key and key_drop(K, key, id, now)) then
    drop_from_ready(ready, cancelled, ranked, id)
  end
  return true
end

for i = 4, #ARGV do
  local id = ARGV[i]
  local successor = redis.call('HGET', successors, id)
  if successor then
    redis.call('HDEL', successors, id)
    journal_row(id, successor, 0)
  end
  if waiting(id) then
    local attempt = attempt_count(redis.call('HGET', attempts, id)) or cjson.null
    journal_row(id, redis.call('HGET', messages, id), attempt)
    redis.call('HDEL', messages, id)
    redis.call('HDEL', attempts, id)
    redis.call('HDEL', tokens, id)
    redis.call('HDEL', reasons, id)
    redis.call('HDEL', ready_since, id)
    redis.call('HDEL', priorities, id)
    redis.call('HDEL', flow_keys, id)
    -- None by rights (only an in-flight delivery writes one, and ends it): a leftover goes too.
    redis.call('HDEL', progress, id)
    -- A task's result says FAILED from now on (get_result sees its message gone), for as long
    -- as a finished task's is kept; no expiry would keep it for ever. One it has stays.
    keep_ended_record(records[i - 3], ARGV[3])
  end
end
if #rows > 0 and maxlen > 0 then
  redis.call('XADD', journal, 'MAXLEN', '~', maxlen, '*', 'n', #rows, 'o', cjson.encode(rows))
end
return #rows
