-- _shared: Lua functions several scripts use, put before a script that calls one of them.
-- Each function starts at a line "local function <name>(" and ends at the next line "end".

-- envelope_times(raw): due and scheduled time (ms) of an envelope "<due>,<due - scheduled>,
-- <payload JSON>" with both numbers in hex (or of the JSON object form of earlier versions);
-- nil, nil when they cannot be read. Mirrors decode_envelope() in envelope.py.
local function envelope_times(raw)
  if not raw then return nil, nil end
  local due, lead = string.match(raw, '^(%-?%x+),(%-?%x+),')
  if due then
    local function signed_hex(text)
      if string.sub(text, 1, 1) == '-' then return -tonumber(string.sub(text, 2), 16) end
      return tonumber(text, 16)
    end
    due = signed_hex(due)
    return due, due - signed_hex(lead)
  end
  local ok, data = pcall(cjson.decode, raw)
  if ok and type(data) == 'table' then
    local d, s = tonumber(data['d']), tonumber(data['s'])
    -- Only finite numbers: a NaN or an infinity would make a later cjson.encode fail, after
    -- the caller's writes (Redis does not roll a script back).
    if d and s and d == d and s == s and math.abs(d) < 2 ^ 53 and math.abs(s) < 2 ^ 53 then
      return d, s
    end
  end
  return nil, nil
end

-- attempt_count(raw): deliveries so far, from an attempts hash value (nil: none yet); or nil
-- and a reason naming the value when it is not a whole number. Such a message cannot be
-- counted against max attempts, so the scripts send it to garbage with that reason rather than
-- failing half-way (Redis does not roll a script back) or delivering it forever.
local function attempt_count(raw)
  if not raw then return 0 end
  local n = tonumber(raw)
  if n and n >= 0 and n < 2 ^ 53 and math.floor(n) == n then return n end
  return nil, "attempt count '" .. string.sub(raw, 1, 100) .. "' is not a number"
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

-- state_of(id, pending, unack, retry, garbage): the state of a message whose envelope is
-- stored: the zset holding it, else 'ready'. A zset key of the wrong type is read as not holding
-- it (pcall): naming the state must not fail a schedule call that already wrote.
local function state_of(id, pending, unack, retry, garbage)
  if type(redis.pcall('ZSCORE', pending, id)) == 'string' then return 'pending' end
  if type(redis.pcall('ZSCORE', unack, id)) == 'string' then return 'unack' end
  if type(redis.pcall('ZSCORE', retry, id)) == 'string' then return 'retry' end
  if type(redis.pcall('ZSCORE', garbage, id)) == 'string' then return 'garbage' end
  return 'ready'
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

-- place(pending, ready, id, due, now, horizon): a message whose envelope is stored -> ready if
-- due, else pending. Returns the time to announce on the wake channel (due now, or within the
-- announce horizon), or nil.
local function place(pending, ready, id, due, now, horizon)
  if due <= now then
    redis.call('RPUSH', ready, id)
    return now
  end
  redis.call('ZADD', pending, due, id)
  if due <= horizon then return due end
  return nil
end

-- succeed(successors, messages, pending, ready, id, now, horizon): the message booked to follow
-- id's delivery (schedule with replace=True while it was in flight) takes its place: stored as
-- id's envelope and placed by its due time. The caller has removed the finished message from
-- its state and hashes. Returns whether there was one, and the time to announce (or nil).
local function succeed(successors, messages, pending, ready, id, now, horizon)
  local envelope = redis.call('HGET', successors, id)
  if not envelope then return false, nil end
  redis.call('HDEL', successors, id)
  redis.call('HSET', messages, id, envelope)
  local due = envelope_times(envelope) or now
  return true, place(pending, ready, id, due, now, horizon)
end

-- earlier(a, b): the earlier of two announce times, either of which may be nil.
local function earlier(a, b)
  if a == nil or (b ~= nil and b < a) then return b end
  return a
end
