-- stats: what the stats need besides counts.lua: delivery totals tallied from the journal,
-- live consumers and the settings the Django layer published. The tally keeps a cursor (the
-- last journal entry counted) so each entry is counted once whoever calls, and a scrape only
-- reads the entries added since the previous one.
-- KEYS[1] journal stream   KEYS[2] tally hash (cursor, one counter per outcome, and
--         already_done: the acks of deliveries an atomic queue found already done)
-- KEYS[3] heartbeats zset (consumer -> last seen ms)   KEYS[4] config hash
-- ARGV[1] most journal entries tallied in this call   ARGV[2] alive since (ms)
-- ARGV[3] most consumers listed
-- returns: {ack total, retry total, garbage total, more (1: journal entries left to tally),
--           consumers alive, {consumer, last seen ms, ... newest first}, {field, value, ...},
--           already-done total (counted in the ack total too)}
-- Runs when Redis is out of memory (see includes/memory.lua): the stats must be readable
-- exactly then, and the tally is a hash of five fields.
local journal, tally, heartbeats, config = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
--- @include "includes/guard.lua"
--- @include "includes/memory.lua"
guard(journal, 'stream', tally, 'hash', heartbeats, 'zset', config, 'hash')
local limit = tonumber(ARGV[1])
local cursor = redis.call('HGET', tally, 'cursor') or '0-0'
local entries = redis.call('XRANGE', journal, '(' .. cursor, '+', 'COUNT', limit)
if #entries > 0 then
  local added = {ack = 0, retry = 0, garbage = 0, already_done = 0}
  for _, entry in ipairs(entries) do
    local fields = entry[2]
    for i = 1, #fields, 2 do
      if fields[i] == 'o' then
        local ok, rows = pcall(cjson.decode, fields[i + 1])
        if ok and type(rows) == 'table' then
          for _, row in ipairs(rows) do
            local outcome = type(row) == 'table' and row[7]
            if outcome ~= 'already_done' and added[outcome] then
              added[outcome] = added[outcome] + 1
              -- its error field (outcomes.ALREADY_DONE): an atomic queue's skipped delivery
              if outcome == 'ack' and row[8] == 'AlreadyDone' then
                added.already_done = added.already_done + 1
              end
            end
          end
        end
      end
    end
  end
  allow_oom(tally, 'hash')
  for outcome, n in pairs(added) do
    if n > 0 then redis.call('HINCRBY', tally, outcome, n) end
  end
  redis.call('HSET', tally, 'cursor', entries[#entries][1])
end
local totals = redis.call('HMGET', tally, 'ack', 'retry', 'garbage', 'already_done')
return {
  tonumber(totals[1]) or 0, tonumber(totals[2]) or 0, tonumber(totals[3]) or 0,
  #entries == limit and 1 or 0,
  redis.call('ZCOUNT', heartbeats, ARGV[2], '+inf'),
  redis.call('ZREVRANGE', heartbeats, 0, tonumber(ARGV[3]) - 1, 'WITHSCORES'),
  redis.call('HGETALL', config),
  tonumber(totals[4]) or 0,
}
