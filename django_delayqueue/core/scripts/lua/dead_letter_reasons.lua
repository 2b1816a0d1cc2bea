-- dead_letter_reasons: the newest dead letters counted by reason (the admin's groups).
-- KEYS[1] garbage zset   KEYS[2] reasons hash
-- ARGV[1] most (how many of the newest dead letters are read)
-- returns: {dead letters in all, how many were read, then per reason: reason, count, when the
-- newest of them died (ms)}, the reasons in the order of their newest dead letter
-- Reads only. A dead letter with no reason counts under ''.
local garbage, reasons = KEYS[1], KEYS[2]
local most = tonumber(ARGV[1])
local newest = redis.call('ZREVRANGE', garbage, 0, most - 1, 'WITHSCORES')
local counts, died, order = {}, {}, {}
for i = 1, #newest, 2 do
  local reason = redis.call('HGET', reasons, newest[i]) or ''
  if counts[reason] == nil then
    counts[reason] = 0
    died[reason] = newest[i + 1]
    order[#order + 1] = reason
  end
  counts[reason] = counts[reason] + 1
end
local out = {redis.call('ZCARD', garbage), #newest / 2}
for _, reason in ipairs(order) do
  out[#out + 1] = reason
  out[#out + 1] = counts[reason]
  out[#out + 1] = died[reason]
end
return out
