-- recurrence_states: the states of a queue's recurring schedules, read in one call.
-- KEYS[1] recurrence states hash (name -> "<cursor ms> <signature> <version>")
-- returns: flat HGETALL of the states
--- @include "includes/guard.lua"
guard(KEYS[1], 'hash')
return redis.call('HGETALL', KEYS[1])
