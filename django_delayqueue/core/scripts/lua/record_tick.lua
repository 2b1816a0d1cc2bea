-- record_tick: remember how a recurring schedule's latest delivered tick went (for the admin,
-- queuestats and the metrics). Sent by the consumer with the round trip after the handler.
-- KEYS[1] tick runs hash (schedule name -> JSON of the latest run)
-- KEYS[2] recurrence states hash (name -> "<cursor ms> <signature> <version>", advance_recurrence)
-- ARGV[1] schedule name   ARGV[2] the run, JSON: {"tick": instant ms, "finished": ms,
--         "outcome": "ack" | "retry" | "garbage", "error": exception class or ""}
-- returns: 1 when written; 0 when a later tick's run is already there (runs finish out of
-- order), or when the schedule is gone: its state is missing or a deletion's tombstone
-- (signature "deleted"). A tick that was running while its schedule was deleted must not put
-- back the last run the deletion removed, where nothing would ever remove it again.
-- Runs when Redis is out of memory (see includes/memory.lua): it overwrites one field per
-- schedule, and a delivered tick's outcome must not be lost because the server is full.
local tick_runs, recurrence_states = KEYS[1], KEYS[2]
--- @include "includes/guard.lua"
--- @include "includes/memory.lua"
guard(tick_runs, 'hash', recurrence_states, 'hash')
local state = redis.call('HGET', recurrence_states, ARGV[1])
if not state or string.match(state, '^%S+ (%S+)') == 'deleted' then return 0 end
allow_oom(tick_runs, 'hash')
local old = redis.call('HGET', tick_runs, ARGV[1])
if old then
  local ok, decoded = pcall(cjson.decode, old)
  if ok and type(decoded) == 'table' and tonumber(decoded['tick']) and
      tonumber(decoded['tick']) > tonumber(cjson.decode(ARGV[2])['tick']) then
    return 0
  end
end
redis.call('HSET', tick_runs, ARGV[1], ARGV[2])
return 1
