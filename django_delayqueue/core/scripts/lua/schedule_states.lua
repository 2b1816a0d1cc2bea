-- schedule_states: what a queue knows of its recurring schedules, read in one call.
-- KEYS[1] schedule states hash (name -> "<cursor ms> <signature>")
-- KEYS[2] tick runs hash (name -> JSON of the latest run)
-- returns: {flat HGETALL of the states, flat HGETALL of the runs}
--- @include "includes/guard.lua"
guard(KEYS[1], 'hash', KEYS[2], 'hash')
return {redis.call('HGETALL', KEYS[1]), redis.call('HGETALL', KEYS[2])}
