-- write_records: the writes of several records (tasks' results) of one queue, in one call:
-- those a consumer's round sends with its acks, so that each costs Redis no EVALSHA and the
-- consumer (which packs every argument and reads every reply in Python, on the thread that
-- claims) one key of its own and nothing else: one argument and one reply for them all.
-- KEYS[1..] records: the result records written (hashes)
-- ARGV[1] writes: one line per record ("\n" between them; KEYS[1] with the first line, and so
--   on), each "<seconds kept> <order> <required field or nothing> <fields JSON>", the parts
--   as write_record.lua's ARGV[1] to ARGV[4] (see there). JSON text holds no raw newline (a
--   compact text's worker id may: such a write is sent alone); with one record the argument
--   is its write whole, raw newlines and all. In place of the
--   JSON, a success's compact text (a "!" first: see success_write in
--   includes/record_write.lua), the write every task that returns makes.
-- returns: {codes, errors...}: codes a string of one character per record, in order: "1",
--   "0" or "-" for what write_record.lua returns for it (1, 0 or -1), or "e" for an error (a
--   key of the wrong type fails its own write only), which is the next of the error replies
--   that follow, in order
-- Runs when Redis is out of memory, as write_record.lua does.
local records = KEYS
--- @include "includes/record_write.lua"
local codes, errors = {}, {}
local function failed(reply)
  codes[#codes + 1] = 'e'
  errors[#errors + 1] = reply
end
-- One record: its write is the whole argument, whatever it holds (merged_writes sends a write
-- with a raw newline of its own alone, so that it is never split).
local writes = {ARGV[1] or ''}
if #records > 1 then
  writes = {}
  for write in string.gmatch(ARGV[1] or '', '[^\n]+') do writes[#writes + 1] = write end
end
-- A success's line, read whole: "<ttl> <order> <required> !<started> <finished> <worker field>
-- <length> " then the return value (length bytes) and the worker id (the rest).
local SUCCESS = '^(%d+) (%d+) (%S*) !(%d+) (%d+) (%S+) (%d+) ()'
local function noted(reply)
  if type(reply) == 'table' and reply.err then
    failed(reply)
  else
    codes[#codes + 1] = (reply == 1 and '1') or (reply == 0 and '0') or '-'
  end
end
local i = 0
for _, write in ipairs(writes) do
  i = i + 1
  if i > #records then break end
  local ttl, order, required, started, finished, worker_field, length, at =
    string.match(write, SUCCESS)
  if ttl then
    if required == '' then required = nil end
    local returned_end = at + tonumber(length) - 1
    -- In a pcall, as the general write: a command Redis refuses for this record alone (an
    -- EXPIRE out of its range) fails this record only, not the round's others.
    local ok, reply = pcall(
      success_write, records[i], ttl, order, required, started, finished, worker_field,
      string.sub(write, returned_end + 1), string.sub(write, at, returned_end)
    )
    if not ok then
      failed(type(reply) == 'table' and reply.err and reply or redis.error_reply(tostring(reply)))
    else
      noted(reply)
    end
  else
    local fields
    ttl, order, required, fields = string.match(write, '^(%d+) (%d+) (%S*) (.*)$')
    if not ttl then
      failed(redis.error_reply('ERR write_records: a write not understood: ' .. write))
    elseif string.byte(fields, 1) == 33 then  -- "!": a success's text that is not one
      failed(redis.error_reply('ERR a success write not understood'))
    else
      if required == '' then required = nil end
      local ok, reply = pcall(record_write, records[i], ttl, order, fields, required)
      if not ok then
        failed(type(reply) == 'table' and reply.err and reply or redis.error_reply(tostring(reply)))
      else
        noted(reply)
      end
    end
  end
end
for _ = i + 1, #records do
  failed(redis.error_reply('ERR write_records: no write for a record'))
end
local replies = {table.concat(codes)}
for n = 1, #errors do replies[n + 1] = errors[n] end
return replies
