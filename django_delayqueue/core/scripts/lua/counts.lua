-- counts: the size of every state, and what is needed to tell how overdue the queue is.
-- KEYS[1] pending zset   KEYS[2] ready list   KEYS[3] unack zset   KEYS[4] retry zset
-- KEYS[5] garbage zset   KEYS[6] messages hash   KEYS[7] cancelled hash
-- KEYS[8] ready_since hash   KEYS[9] ranked zset   KEYS[10] key_state hash
-- returns: {pending, ready, unack, retry, garbage, earliest pending due or -1,
--           earliest retry-at or -1, since when the oldest ready message is due, or -1,
--           how many of the ready messages are keyed (in their keys' lists)}
-- Keyed ready messages (includes/key_turns.lua) count as ready, but not for the oldest: they
-- wait their key's turn, slot or token, not for a consumer.
-- A message back in ready (retried, requeued, run now, released) is due from when it came
-- back (ready_since), not from the due time in its envelope, which it was delivered at before.
-- The dead entries cancel left in the ready list are not counted, and the oldest ready message
-- is the first live entry (looked for among the first 1000 dead ones: -1 past them), or the
-- first of a priority in the ranked zset, whichever is due earliest.
--- @include "includes/envelope.lua"
--- @include "includes/ready_list.lua"
local function first_score(key)
  local first = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
  return first[2] and tonumber(first[2]) or -1
end
local dead = dead_in_ready(KEYS[7])
local keyed = tonumber(redis.call('HGET', KEYS[10], ' ready')) or 0
local head
if dead > 0 then
  head = ready_walk(KEYS[2], KEYS[7], 0, 1, 1000)[1]
else
  head = redis.call('LINDEX', KEYS[2], 0)
end
local heads = ranked_heads(KEYS[9])
if head then heads[#heads + 1] = head end
local ready_due = -1
for _, id in ipairs(heads) do
  local due = tonumber(redis.call('HGET', KEYS[8], id))
    or envelope_times(redis.call('HGET', KEYS[6], id))
  if due and (ready_due == -1 or due < ready_due) then ready_due = due end
end
return {
  redis.call('ZCARD', KEYS[1]),
  math.max(0, redis.call('LLEN', KEYS[2]) - dead) + redis.call('ZCARD', KEYS[9]) + keyed,
  redis.call('ZCARD', KEYS[3]), redis.call('ZCARD', KEYS[4]), redis.call('ZCARD', KEYS[5]),
  first_score(KEYS[1]), first_score(KEYS[4]), ready_due, keyed,
}
