-- includes/ready_list.lua: ready messages (the list, and the ranked zset of those with a
-- priority) and the dead entries cancels leave in the list; keyed ready messages wait in their
-- key's list instead (includes/key_turns.lua).
--- @include "includes/key_turns.lua"

-- Priorities. A message with a priority other than 0 (-100..100, given by enqueue_task.lua and
-- kept in the priorities hash until the message is acknowledged, cancelled, replaced or
-- purged) waits in ready in the ranked zset instead of the list, scored
-- (100 - priority) * RANK_BAND + RANK_HALF + n, n counting the entries into the zset (the
-- hash's field RANK_ORDER, never an id): lower scores are higher priorities, and within one the
-- first in is the first out, even within a millisecond. A delivery given back unstarted goes
-- to the head of its priority with RANK_HALF - n. Scores stay under 2^53 (201 * 2^43), exact in
-- a double, and are written with '%.0f' (Lua's tostring would round them). A claim takes the
-- ranked entries above priority 0 first, then the list (priority 0: every message of
-- dq.schedule, whose path costs one more read for this), then the entries below 0.
local RANK_BAND = 8796093022208  -- 2^43
local RANK_HALF = RANK_BAND / 2  -- 4.4e12 entries either way before a band would overflow
local RANK_NORMAL = string.format('%.0f', 100 * RANK_BAND)  -- priority 0: never in the zset
local RANK_ORDER = ' order'  -- written with the first priority, so that HLEN > 1 tells one is

-- ranked_score(priority, offset): the score of a message with this priority (clamped to
-- -100..100) at `offset` (-RANK_HALF..RANK_HALF) in its band.
local function ranked_score(priority, offset)
  priority = math.max(-100, math.min(100, math.floor(priority)))
  return string.format('%.0f', (100 - priority) * RANK_BAND + RANK_HALF + offset)
end

-- to_ready(ready, ranked, priorities, ids, front, K): ids -> ready: the tail of the list, or with
-- a priority the tail of their priority in the ranked zset, or with a flow key the tail of its
-- key's list (with K, the keyed keys: see key_turns.lua) (front: the heads, for a delivery
-- given back unstarted; LPUSH reverses ids, so give one id at a time). Costs one HLEN when no
-- message of the queue has a priority (and one more with K when none has a key). A priority
-- that is not a number is read as 0.
local function to_ready(ready, ranked, priorities, ids, front, K)
  ids = split_keyed(K, ids, front)
  local plain = ids
  if redis.call('HLEN', priorities) > 1 then
    plain = {}
    local order = tonumber(redis.call('HGET', priorities, RANK_ORDER)) or 0
    for i = 1, #ids, 1000 do
      local last = math.min(i + 999, #ids)
      local given = redis.call('HMGET', priorities, unpack(ids, i, last))
      local scored = {}
      for k = 1, last - i + 1 do
        local id, priority = ids[i + k - 1], tonumber(given[k])
        if priority and priority ~= 0 then
          order = order + 1
          scored[#scored + 1] = ranked_score(priority, front and -order or order)
          scored[#scored + 1] = id
        else
          plain[#plain + 1] = id
        end
      end
      if #scored > 0 then redis.call('ZADD', ranked, unpack(scored)) end
    end
    redis.call('HSET', priorities, RANK_ORDER, order)
  end
  for i = 1, #plain, 1000 do
    redis.call(front and 'LPUSH' or 'RPUSH', ready, unpack(plain, i, math.min(i + 999, #plain)))
  end
end

-- ranked_heads(ranked): the first entry of each priority present in the ranked zset (the one
-- waiting longest there), highest priority first: one read per priority present (at most 200).
local function ranked_heads(ranked)
  local heads, from = {}, '-inf'
  for _ = 1, 201 do
    local head = redis.call('ZRANGEBYSCORE', ranked, from, '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
    if not head[1] then break end
    heads[#heads + 1] = head[1]
    from = string.format('%.0f', (math.floor(tonumber(head[2]) / RANK_BAND) + 1) * RANK_BAND)
  end
  return heads
end

-- dead_in_ready(cancelled): how many entries of the ready list are dead: left there by a
-- cancel (see QueueKeys.cancelled). The field is keys.TOMBSTONE_TOTAL, never an id.
local function dead_in_ready(cancelled)
  return tonumber(redis.call('HGET', cancelled, ' total')) or 0
end

-- set_dead_in_ready(cancelled, n): record that n entries of the ready list are dead.
local function set_dead_in_ready(cancelled, n)
  if n > 0 then
    redis.call('HSET', cancelled, ' total', n)
  else
    redis.call('HDEL', cancelled, ' total')
  end
end

-- ready_walk(ready, cancelled, skip, want, max_dead): the ready list from its head without the
-- dead entries of messages cancelled there (an id's first n entries are dead, n = its count in
-- the cancelled hash). Returns the ids of up to `want` live entries after the first `skip` live
-- ones, how many entries were walked, the dead entries passed per id, and their sum. Stops
-- after `max_dead` dead entries, so a long run of them costs a bounded call. Reads only.
local function ready_walk(ready, cancelled, skip, want, max_dead)
  local live, dead, ndead, pos, skipped = {}, {}, 0, 0, 0
  local len = redis.call('LLEN', ready)
  while #live < want and pos < len and ndead < max_dead do
    local size = math.min(1000, math.max(16, skip - skipped + want - #live))
    local chunk = redis.call('LRANGE', ready, pos, pos + size - 1)
    local marks = redis.call('HMGET', cancelled, unpack(chunk))
    for k = 1, #chunk do
      if #live >= want or ndead >= max_dead then break end
      local id = chunk[k]
      local passed = dead[id] or 0
      pos = pos + 1
      if passed < (tonumber(marks[k]) or 0) then
        dead[id], ndead = passed + 1, ndead + 1
      elseif skipped < skip then
        skipped = skipped + 1
      else
        live[#live + 1] = id
      end
    end
  end
  return live, pos, dead, ndead
end

-- drop_from_ready(ready, cancelled, ranked, id): take a ready message out of ready: out of the
-- ranked zset if it is there, else its live entry out of the list in O(1): popped at either
-- end, else left there dead (see QueueKeys.cancelled); an id's live entry is its last one. Not
-- HINCRBY: it fails on a bad value, after the caller wrote.
local function drop_from_ready(ready, cancelled, ranked, id)
  if redis.call('ZREM', ranked, id) == 1 then return end
  if redis.call('LINDEX', ready, -1) == id then
    redis.call('RPOP', ready)
  elseif redis.call('LINDEX', ready, 0) == id and not redis.call('HGET', cancelled, id) then
    redis.call('LPOP', ready)
  else
    redis.call('HSET', cancelled, id, (tonumber(redis.call('HGET', cancelled, id)) or 0) + 1)
    redis.call('HSET', cancelled, ' total', dead_in_ready(cancelled) + 1)
  end
end

-- back_to_ready(ready, ranked, priorities, tokens, ready_since, id, now, K): a waiting or dead
-- message -> the tail of ready (see to_ready), its old delivery token void (a late ack of it
-- must not delete the message), overdue from `now` rather than from the due time in its
-- envelope.
local function back_to_ready(ready, ranked, priorities, tokens, ready_since, id, now, K)
  to_ready(ready, ranked, priorities, {id}, false, K)
  redis.call('HDEL', tokens, id)
  redis.call('HSET', ready_since, id, now)
end
