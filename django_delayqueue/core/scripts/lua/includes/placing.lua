-- includes/placing.lua: placing a stored message in pending or ready, and successors.
--- @include "includes/envelope.lua"
--- @include "includes/key_turns.lua"

-- place(pending, ready, id, due, now, horizon, K): a message whose envelope is stored -> ready
-- if due, else pending. Returns the time to announce on the wake channel (due now, or within
-- the announce horizon), or nil. For a new message: it has no priority (see ready_list.lua), so
-- its place in ready is the tail of the list, or with a flow key (with K, its flow key noted
-- already) the tail of its key's list.
local function place(pending, ready, id, due, now, horizon, K)
  if due <= now then
    local key = K and redis.call('HGET', K.flow_keys, id)
    if key and due_unpromoted(pending, now) then
      redis.call('ZADD', pending, due, id)  -- behind the due ones (see due_unpromoted)
      return now
    elseif key then
      key_push(K, key, id, false)
    else
      redis.call('RPUSH', ready, id)
    end
    return now
  end
  redis.call('ZADD', pending, due, id)
  if due <= horizon then return due end
  return nil
end

-- succeed(successors, messages, pending, ready, priorities, id, now, horizon, K): the message
-- booked to follow id's delivery (schedule with replace=True while it was in flight) takes its
-- place: stored as id's envelope and placed by its due time, a new message without the
-- finished one's priority. The caller has removed the finished message from its state and
-- hashes. Returns whether there was one, and the time to announce (or nil). Its flow key (or
-- none) is the successor's envelope's (K: the keyed keys, key_turns.lua).
local function succeed(successors, messages, pending, ready, priorities, id, now, horizon, K)
  local envelope = redis.call('HGET', successors, id)
  if not envelope then return false, nil end
  redis.call('HDEL', successors, id)
  redis.call('HDEL', priorities, id)
  redis.call('HSET', messages, id, envelope)
  keep_flow_key(K and K.flow_keys, id, envelope)
  local due = envelope_times(envelope) or now
  return true, place(pending, ready, id, due, now, horizon, K)
end

-- earlier(a, b): the earlier of two announce times, either of which may be nil.
local function earlier(a, b)
  if a == nil or (b ~= nil and b < a) then return b end
  return a
end
