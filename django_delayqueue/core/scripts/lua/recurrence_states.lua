-- recurrence_states: the states of a queue's recurring schedules, read in one call.
-- KEYS[1] recurrence states hash (name -> "<cursor ms> <signature> <version>")
-- returns: flat HGETALL of the states
local recurrence_states = KEYS[1]
--- @include "includes/guard.lua"
guard(recurrence_states, 'hash')
return redis.call('HGETALL', recurrence_states)
