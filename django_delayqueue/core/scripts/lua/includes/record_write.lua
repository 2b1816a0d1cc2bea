-- includes/record_write.lua: one write of a record hash (a task's result), shared by
-- write_record.lua (one record) and write_records.lua (the records of a consumer's round).
--- @include "includes/guard.lua"
--- @include "includes/memory.lua"

-- record_write(key, ttl, order, fields, required): the write write_record.lua's header
-- describes (ttl and order as the text given, fields the JSON of four lists, required a field
-- name or nil). Returns 1, 0 (a later write had landed: the in-order part left) or -1 (the
-- record lacks required: nothing written); an error reply where the key is not a hash.
-- One read (the order and the fields set where absent) and one HSET of everything this write
-- sets: a task's delivery costs Redis a handful of commands, not one per field. The read
-- proves the key's type before any write (guard() only words the error when it is wrong).
-- allow_oom() is called before the script's first write only: once a script has written,
-- Redis lets it finish whatever memory is left (includes/memory.lua), so write_records.lua's
-- later records skip it (an HDEL a record, a third of the commands of a task's end).
local oom_allowed = false
local function record_write(key, ttl_text, order_text, fields_json, required)
  local ttl, order = tonumber(ttl_text), tonumber(order_text)
  local fields = cjson.decode(fields_json)
  local absent, ordered, deleted, always = fields[1], fields[2], fields[3], fields[4]
  local wanted = {'order'}
  for i = 1, #absent, 2 do wanted[#wanted + 1] = absent[i] end
  if required then wanted[#wanted + 1] = required end
  local stored = redis.pcall('HMGET', key, unpack(wanted))
  if stored.err then
    guard(key, 'hash')
    return redis.error_reply(stored.err)
  end
  if required and not stored[#wanted] then return -1 end
  local in_order = order >= (tonumber(stored[1]) or -1)
  local set = {}
  for i = 1, #absent, 2 do
    if not stored[(i + 1) / 2 + 1] then set[#set + 1] = absent[i]; set[#set + 1] = absent[i + 1] end
  end
  if in_order then
    set[#set + 1] = 'order'
    set[#set + 1] = order_text
    for i = 1, #ordered do set[#set + 1] = ordered[i] end
  end
  for i = 1, #always do set[#set + 1] = always[i] end
  if not oom_allowed then
    allow_oom(key, 'hash')
    oom_allowed = true
  end
  if #set > 0 then redis.call('HSET', key, unpack(set)) end
  if in_order then
    if #deleted > 0 then redis.call('HDEL', key, unpack(deleted)) end
    if ttl > 0 then redis.call('EXPIRE', key, ttl) else redis.call('PERSIST', key) end
  end
  return in_order and 1 or 0
end

-- success_write(key, ttl, order, required, started, finished, worker_field, worker, returned):
-- record_write for the write every task that returns makes, its fields parsed already from
-- its compact text (write_records.lua reads the whole line with one string.match):
--   "!<started_at> <finished_at> <worker field> <return value's length> <return value><worker id>"
-- (the return value its JSON, ASCII: its length is its bytes in any client encoding; see
-- core/task_records.py success_fields): the same write as record_write's of [[started_at,
-- <started_at>], [status, SUCCESSFUL, last_attempted_at, <started_at>, finished_at,
-- <finished_at>, return_value, <return value>], [], [<worker field>, <worker id>]]
-- (tests/app/test_tasks_record.py compares the records both leave). A worker sends one per
-- task: decoding JSON, building the generic write's tables and parsing the line twice was about
-- half of the script's time a record. Returns as record_write does; an error reply (returned,
-- not raised) where the key is not a hash.
local function success_write(key, ttl_text, order_text, required, started, finished,
                             worker_field, worker, returned)
  local stored = redis.pcall('HMGET', key, 'order', 'started_at', required or 'order')
  if stored.err then
    -- guard() words it (raised: a table, or its text where Redis turned it into one).
    local ok, worded = pcall(guard, key, 'hash')
    if not ok then
      return type(worded) == 'table' and worded.err and worded or redis.error_reply(tostring(worded))
    end
    return redis.error_reply(stored.err)
  end
  if required and not stored[3] then return -1 end
  local in_order = tonumber(order_text) >= (tonumber(stored[1]) or -1)
  if not oom_allowed then
    allow_oom(key, 'hash')
    oom_allowed = true
  end
  if in_order then
    if stored[2] then
      redis.call(
        'HSET', key, 'order', order_text, 'status', 'SUCCESSFUL', 'last_attempted_at', started,
        'finished_at', finished, 'return_value', returned, worker_field, worker
      )
    else
      redis.call(
        'HSET', key, 'started_at', started, 'order', order_text, 'status', 'SUCCESSFUL',
        'last_attempted_at', started, 'finished_at', finished, 'return_value', returned,
        worker_field, worker
      )
    end
    local ttl = tonumber(ttl_text)
    if ttl > 0 then redis.call('EXPIRE', key, ttl) else redis.call('PERSIST', key) end
    return 1
  end
  if stored[2] then
    redis.call('HSET', key, worker_field, worker)
  else
    redis.call('HSET', key, 'started_at', started, worker_field, worker)
  end
  return 0
end
