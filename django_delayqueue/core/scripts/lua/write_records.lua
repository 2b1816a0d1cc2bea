-- write_records: the writes of several records (tasks' results) of one queue, in one call:
-- those a consumer's round sends with its acks, so that each costs Redis no EVALSHA and the
-- consumer no arguments of its own beyond its key and its write.
-- KEYS[1..] records: the result records written (hashes)
-- ARGV[1..] writes: one per record, "<seconds kept> <order> <required field or nothing>
--   <fields JSON>", each part as write_record.lua's ARGV[1] to ARGV[4] (see there)
-- The writes pair with the keys in order (KEYS[1] with ARGV[1], and so on).
-- returns: per record, what write_record.lua returns for it (1, 0 or -1), or its error (a key
--   of the wrong type fails its own write only)
-- Runs when Redis is out of memory, as write_record.lua does.
--- @include "includes/record_write.lua"
local replies = {}
for i = 1, #KEYS do
  local ttl, order, required, fields = string.match(ARGV[i], '^(%d+) (%d+) (%S*) (.*)$')
  if not ttl then
    replies[i] = redis.error_reply('ERR write_records: a write not understood: ' .. ARGV[i])
  else
    if required == '' then required = nil end
    local ok, reply = pcall(record_write, KEYS[i], ttl, order, fields, required)
    if ok then
      replies[i] = reply
    elseif type(reply) == 'table' and reply.err then
      replies[i] = reply
    else
      replies[i] = redis.error_reply(tostring(reply))
    end
  end
end
return replies
