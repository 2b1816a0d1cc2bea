-- busiest_keys: the flow keys with the most messages ready and in flight, for the stats
-- (queuestats, the admin's queue page, metrics). Read only, and bounded: never a walk of every
-- key, however many there are (docs/flow-control.md, "What the stats show of keys").
-- KEYS[1] key_turns zset   KEYS[2] key_waiting zset   KEYS[3] key_state hash
-- KEYS[4] key_lists prefix (not a key: '<prefix><flow key>' is the list of a key's ready ids)
-- ARGV[1] most keys read from the head of each of key_turns and key_waiting
-- ARGV[2] most fields of key_state read (its per-key in-flight counts, 'c:<key>')
-- ARGV[3] top: how many keys to return
-- returns: {keys with ready messages (in turns or waiting), keys with messages in flight (-1:
--   more than ARGV[2] fields to read), 1 when every such key was looked at (the top is exact)
--   else 0, then for each key returned, the busiest first: key, ready, in flight}
-- The keys looked at: every key in flight (a key worked on: a backlog has one in flight while
-- consumers run, up to key_concurrency), and the next ARGV[1] keys in turn and waiting for a
-- token or a slot. Each costs one LLEN (includes/key_turns.lua: the only key names built in a
-- script are these per-key lists, under the queue's hash tag). With more keys than that, the
-- top is of that sample, and says so.
local most, fields, top = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local nturns, nwaiting = redis.call('ZCARD', KEYS[1]), redis.call('ZCARD', KEYS[2])
local complete = nturns <= most and nwaiting <= most
local flying, nflying = {}, 0

local function in_flight(field, value)
  if string.sub(field, 1, 2) == 'c:' then
    flying[string.sub(field, 3)] = tonumber(value) or 0
    nflying = nflying + 1
  end
end

if redis.call('HLEN', KEYS[3]) <= fields then
  local all = redis.call('HGETALL', KEYS[3])
  for i = 1, #all, 2 do in_flight(all[i], all[i + 1]) end
else
  local cursor, read, count = '0', 0, math.min(100, fields)
  repeat
    local page = redis.call('HSCAN', KEYS[3], cursor, 'MATCH', 'c:*', 'COUNT', count)
    cursor = page[1]
    for i = 1, #page[2], 2 do in_flight(page[2][i], page[2][i + 1]) end
    read = read + count
  until cursor == '0' or read >= fields
  if cursor ~= '0' then
    complete, nflying = false, -1
  end
end

local seen, rows = {}, {}
local function look(key)
  if seen[key] then return end
  seen[key] = true
  local ready = redis.call('LLEN', KEYS[4] .. key)
  rows[#rows + 1] = {key, ready, flying[key] or 0}
end
for key in pairs(flying) do look(key) end
for _, key in ipairs(redis.call('ZRANGE', KEYS[1], 0, most - 1)) do look(key) end
for _, key in ipairs(redis.call('ZRANGE', KEYS[2], 0, most - 1)) do look(key) end

table.sort(rows, function(a, b)
  local la, lb = a[2] + a[3], b[2] + b[3]
  if la ~= lb then return la > lb end
  return a[1] < b[1]
end)
local out = {nturns + nwaiting, nflying, complete and 1 or 0}
for i = 1, math.min(top, #rows) do
  local row = rows[i]
  if row[2] + row[3] == 0 then break end
  out[#out + 1] = row[1]
  out[#out + 1] = row[2]
  out[#out + 1] = row[3]
end
return out
