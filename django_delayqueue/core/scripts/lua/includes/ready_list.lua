-- includes/ready_list.lua: the ready list and the dead entries cancels leave in it.

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

-- drop_from_ready(ready, cancelled, id): take a ready message's live entry out of the list in
-- O(1): pop it at either end, else leave it there dead (see QueueKeys.cancelled); an id's live
-- entry is its last one. Not HINCRBY: it fails on a bad value, after the caller wrote.
local function drop_from_ready(ready, cancelled, id)
  if redis.call('LINDEX', ready, -1) == id then
    redis.call('RPOP', ready)
  elseif redis.call('LINDEX', ready, 0) == id and not redis.call('HGET', cancelled, id) then
    redis.call('LPOP', ready)
  else
    redis.call('HSET', cancelled, id, (tonumber(redis.call('HGET', cancelled, id)) or 0) + 1)
    redis.call('HSET', cancelled, ' total', dead_in_ready(cancelled) + 1)
  end
end

-- back_to_ready(ready, tokens, ready_since, id, now): a waiting or dead message -> the tail of
-- the ready list, its old delivery token void (a late ack of it must not delete the message),
-- overdue from `now` rather than from the due time in its envelope.
local function back_to_ready(ready, tokens, ready_since, id, now)
  redis.call('RPUSH', ready, id)
  redis.call('HDEL', tokens, id)
  redis.call('HSET', ready_since, id, now)
end
