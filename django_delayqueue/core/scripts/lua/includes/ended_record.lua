-- includes/ended_record.lua: the expiry of a task's result record whose message is gone.

-- keep_ended_record(record, seconds): an expiry of `seconds` for a record that has none (a
-- task cancelled while waiting, or buried without a FAILED write, as by a reap); a record that
-- has one keeps it, since its task's end set the backend's RESULT_TTL, which may be shorter or
-- longer than this default. No record (a plain message's id): nothing.
local function keep_ended_record(record, seconds)
  if redis.call('TTL', record) == -1 then redis.call('EXPIRE', record, seconds) end
end
