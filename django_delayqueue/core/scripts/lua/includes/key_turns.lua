-- includes/key_turns.lua: keyed ready messages (schedule(..., key=...)) waiting in per-key
-- lists, and the rotation of keys that claims take turns from (docs/flow-control.md, "Keys").
-- A script that may put keyed ids in ready, or take them out, gets seven keys in a row
-- (contracts._KEYED), which it gives keyed_keys(flow_keys, key_turns, key_waiting, key_state,
-- key_tats, key_lists, key_load) by the names of its prologue, to have them in a table K:
--   K.flow_keys  hash id -> flow key (includes/flow_keys.lua)
--   K.turns      zset key -> turn: the keys whose messages may be claimed, in turn order (the
--                lowest first); a key taken from goes back at the tail (the next turn)
--   K.waiting    zset key -> when (ms) its next token of key_rate_limit comes: keys with ready
--                messages that wait for it (the claim brings them back into turns when due);
--                or KEY_BLOCKED for a key out of slots (key_concurrency), which the end of one
--                of its deliveries (key_slot_freed) or a raised cap brings back
--   K.state      hash: 'c:<key>' messages of the key in flight, 'i:<id>' the key of an id in
--                flight (so that a slot is freed once, whatever ends the delivery), ' turn'
--                the last turn given, ' ready' keyed ready messages, ' plain' the turn of the
--                unkeyed ready messages (they take turns as one more key), 'w:<key>' the
--                period in which the key's limits hold its ready messages back (the limit
--                wait of those claimed: includes/limit_waits.lua), while it has some
--   K.tats       zset key -> the GCRA time of key_rate_limit (a key's next start)
--   K.lists      not a key: the prefix of the per-key lists, '<prefix><key>' (ids, oldest
--                first). The only keys built in a script: one per flow key, which no caller
--                can list; they share the queue's hash tag, so a cluster keeps them in its slot.
--   K.load       zset key -> its messages ready (in its list) plus in flight: what the busiest
--                keys read, exact at any number of keys (busiest_keys.lua). +1 where a message
--                enters its key's list (key_push), -1 where it leaves the list other than by a
--                claim (key_drop) and where its delivery ends (key_slot_freed): a claim moves
--                it from ready to in flight and keeps its +1; a delivery given back (release)
--                is -1 then +1. A key whose load reaches 0 leaves the zset.
-- A key is in at most one of turns and waiting. A key with no ready message is in neither, and
-- its state goes once nothing of it is in flight; its GCRA time once that is past (forgotten
-- by later claims and ends of deliveries: bounded memory).
--- @include "includes/flow_keys.lua"
--- @include "includes/limit_waits.lua"

local KEY_BLOCKED = 4503599627370496  -- 2^52: after any time in ms, exact in a double

local function keyed_keys(
  flow_keys, key_turns, key_waiting, key_state, key_tats, key_lists, key_load
)
  return {
    flow_keys = flow_keys, turns = key_turns, waiting = key_waiting, state = key_state,
    tats = key_tats, lists = key_lists, load = key_load,
  }
end

-- next_turn(K): a turn after every one given so far.
local function next_turn(K)
  return redis.call('HINCRBY', K.state, ' turn', 1)
end

-- key_join(K, key): a key with ready messages that is neither in turns nor waiting for a
-- token joins the rotation's tail. Whether it has a free slot or a token is the claim's to
-- find out (a key without one leaves again, once per message pushed or slot freed: O(1) each).
-- not_waiting: the caller knows the key is not in K.waiting (one ZSCORE less).
local function key_join(K, key, not_waiting)
  if redis.call('ZSCORE', K.turns, key) then return end
  if not not_waiting and redis.call('ZSCORE', K.waiting, key) then return end
  redis.call('ZADD', K.turns, next_turn(K), key)
end

-- key_load_add(K, key, delta): the key's load (ready + in flight) moved by delta; at 0 (or
-- below, for a message keyed before key_load was kept) the key leaves the zset.
local function key_load_add(K, key, delta)
  if tonumber(redis.call('ZINCRBY', K.load, delta, key)) <= 0 then
    redis.call('ZREM', K.load, key)
  end
end

-- key_push(K, key, id, front): a keyed ready message -> its key's list (the tail, or the head
-- for a delivery given back unstarted), its key in the rotation.
local function key_push(K, key, id, front)
  redis.call(front and 'LPUSH' or 'RPUSH', K.lists .. key, id)
  redis.call('HINCRBY', K.state, ' ready', 1)
  key_load_add(K, key, 1)
  key_join(K, key)
end

-- due_unpromoted(pending, now): whether due messages still wait in pending (no consumer has
-- promoted them yet: all busy, restarting, or the promote is a few ms behind). A keyed message
-- due now then goes to pending as well, not straight to its key's list: promote moves them all
-- in due order, so that an earlier message of its key is not queued behind it (due order is
-- kept within a key). One ZRANGE, paid only by a keyed message due now.
local function due_unpromoted(pending, now)
  local head = redis.call('ZRANGE', pending, 0, 0, 'WITHSCORES')
  return head[2] ~= nil and tonumber(head[2]) <= now
end

-- keyed_ready(K): how many keyed messages are ready (in the per-key lists).
local function keyed_ready(K)
  if not K then return 0 end
  return tonumber(redis.call('HGET', K.state, ' ready')) or 0
end

-- split_keyed(K, ids, front): the ids that have a flow key go to their key's list; returns the
-- others (for the ready list). One HLEN when the queue has no keyed message.
local function split_keyed(K, ids, front)
  if not K or #ids == 0 or redis.call('HLEN', K.flow_keys) == 0 then return ids end
  local plain = {}
  for i = 1, #ids, 1000 do
    local last = math.min(i + 999, #ids)
    local keys = redis.call('HMGET', K.flow_keys, unpack(ids, i, last))
    for k = 1, last - i + 1 do
      local id = ids[i + k - 1]
      if keys[k] then key_push(K, keys[k], id, front) else plain[#plain + 1] = id end
    end
  end
  return plain
end

-- key_period(K, key) / key_period_put(K, key, p): the key's limit wait period (nil: none).
local function key_period(K, key)
  return period_of(redis.call('HGET', K.state, 'w:' .. key))
end

local function key_period_put(K, key, p)
  redis.call('HSET', K.state, 'w:' .. key, period_text(p))
end

-- key_forget(K, key, now): a key with nothing ready and nothing in flight: its state goes, its
-- GCRA time too once it is past (a time ahead still spaces its next message). Its load left
-- K.load already, as it reached 0 (key_load_add).
local function key_forget(K, key, now)
  redis.call('HDEL', K.state, 'c:' .. key, 'w:' .. key)
  redis.call('ZREM', K.turns, key)
  redis.call('ZREM', K.waiting, key)
  local tat = redis.call('ZSCORE', K.tats, key)
  if tat and tonumber(tat) <= now then redis.call('ZREM', K.tats, key) end
end

-- key_drop(K, key, id, now): a keyed ready message leaves its key's list (cancel, replace):
-- LREM, a walk of that key's list only (O(messages of the key)).
local function key_drop(K, key, id, now)
  local list = K.lists .. key
  if redis.call('LREM', list, 1, id) == 0 then return false end
  redis.call('HINCRBY', K.state, ' ready', -1)
  key_load_add(K, key, -1)
  if redis.call('LLEN', list) == 0 then
    if redis.call('HGET', K.state, 'c:' .. key) then
      redis.call('HDEL', K.state, 'w:' .. key)  -- nothing ready: no message waits on it
    else
      key_forget(K, key, now)
    end
  end
  return true
end

-- key_taken(K, key, id): a keyed message claimed: counted in flight for its key.
local function key_taken(K, key, id)
  redis.call('HSET', K.state, 'i:' .. id, key)
  redis.call('HINCRBY', K.state, 'c:' .. key, 1)
end

-- forget_past_tats(K, now, most): up to `most` GCRA times that are past (a key without one
-- reads the same), the oldest first.
local function forget_past_tats(K, now, most)
  local old = redis.call('ZRANGEBYSCORE', K.tats, '-inf', now, 'LIMIT', 0, most)
  if #old > 0 then redis.call('ZREM', K.tats, unpack(old)) end
end

-- key_slot_freed(K, id, now): a delivery of id ended (acked, retried, dead, released, reaped):
-- if it held a slot of its key, the slot is free again, the key back in turns if it has ready
-- messages, its state gone if nothing of it is left. Once per delivery (the 'i:' entry).
-- Returns the key when a slot was freed, else nil.
local function key_slot_freed(K, id, now)
  if not K then return nil end
  local key = redis.call('HGET', K.state, 'i:' .. id)
  if not key then return nil end
  redis.call('HDEL', K.state, 'i:' .. id)
  key_load_add(K, key, -1)
  local blocked = redis.call('ZSCORE', K.waiting, key)
  local waits_token = blocked and tonumber(blocked) < KEY_BLOCKED
  if blocked and not waits_token then redis.call('ZREM', K.waiting, key) end
  local left = (tonumber(redis.call('HGET', K.state, 'c:' .. key)) or 1) - 1
  if left > 0 then
    redis.call('HSET', K.state, 'c:' .. key, left)
  else
    redis.call('HDEL', K.state, 'c:' .. key)
  end
  if redis.call('LLEN', K.lists .. key) > 0 then
    -- Known from above whether it waits for a token (then it stays there): no second ZSCORE.
    if not waits_token then key_join(K, key, true) end
    local p = key_period(K, key)
    if p and not p.free then  -- its messages wait on its limits: a slot is free from now
      p.free = now
      key_period_put(K, key, p)
    end
  elseif left <= 0 then
    key_forget(K, key, now)
  end
  return key
end

-- keys_freed(K, ids, now): key_slot_freed for each of ids; one HLEN when no keyed message is
-- in flight. Returns how many key slots were freed.
local function keys_freed(K, ids, now)
  if not K or redis.call('HLEN', K.flow_keys) == 0 then return 0 end
  local n = 0
  for _, id in ipairs(ids) do
    if key_slot_freed(K, id, now) then n = n + 1 end
  end
  if n > 0 then forget_past_tats(K, now, 2 * n) end
  return n
end
