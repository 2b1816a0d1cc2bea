-- busiest_keys: the flow keys with the most messages ready and in flight, for the stats
-- (queuestats, the admin's queue page, metrics). Read only, exact and bounded whatever the
-- number of keys: the engine keeps each key's load (ready + in flight) in key_load
-- (includes/key_turns.lua), so the top is one ZREVRANGE (docs/flow-control.md, "What the stats
-- show of keys").
-- KEYS[1] key_turns zset   KEYS[2] key_waiting zset   KEYS[3] key_load zset
-- KEYS[4] key_state hash   KEYS[5] key_lists prefix (not a key: '<prefix><flow key>' is the
--   list of a key's ready ids)
-- ARGV[1] top: how many keys to return
-- returns: {keys with ready messages (in turns or waiting), keys with messages ready or in
--   flight, then for each key returned, the busiest first (ties by name, within those returned): key, ready, in flight}
-- Per key returned, its load splits into ready (one LLEN of its list: the only key names built
-- in a script, under the queue's hash tag) and in flight (key_state's 'c:<key>').
local key_turns, key_waiting, key_load, key_state = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local key_lists = KEYS[5]
local top = tonumber(ARGV[1])
local out = {
  redis.call('ZCARD', key_turns) + redis.call('ZCARD', key_waiting), redis.call('ZCARD', key_load),
}
if top <= 0 then return out end
local rows = {}
for _, key in ipairs(redis.call('ZREVRANGE', key_load, 0, top - 1)) do
  local ready = redis.call('LLEN', key_lists .. key)
  local flying = tonumber(redis.call('HGET', key_state, 'c:' .. key)) or 0
  rows[#rows + 1] = {key, ready, flying}
end
table.sort(rows, function(a, b)
  local la, lb = a[2] + a[3], b[2] + b[3]
  if la ~= lb then return la > lb end
  return a[1] < b[1]
end)
for _, row in ipairs(rows) do
  out[#out + 1] = row[1]
  out[#out + 1] = row[2]
  out[#out + 1] = row[3]
end
return out
