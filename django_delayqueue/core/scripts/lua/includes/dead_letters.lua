-- includes/dead_letters.lua: choosing the dead letters a staff action works on.

-- dead_letter_ids(garbage, first, limit): the ids given from ARGV[first] on, or, when none are
-- given, the oldest `limit` dead letters (a bounded call; the caller repeats it to drain).
local function dead_letter_ids(garbage, first, limit)
  if #ARGV < first then return redis.call('ZRANGE', garbage, 0, limit - 1) end
  local ids = {}
  for i = first, #ARGV do ids[#ids + 1] = ARGV[i] end
  return ids
end
