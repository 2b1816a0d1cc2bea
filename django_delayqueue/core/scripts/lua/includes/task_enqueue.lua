-- includes/task_enqueue.lua: one task of Django's Tasks framework and its result record;
-- shared by enqueue_task.lua and send_once.lua, which take the same first keys and arguments
-- (pending zset, ready list, messages hash, unack zset, retry zset, garbage zset, given to
-- enqueue_task by the names of their prologues, as schedule_triples takes them):
-- ARGV[1] now (ms)   ARGV[2] announce horizon (ms)   ARGV[3] wake channel
-- ARGV[4] id   ARGV[5] due (ms)   ARGV[6] envelope
--- @include "includes/scheduling.lua"
--- @include "includes/ready_list.lua"

-- enqueue_task(pending, ready, messages, unack, retry, garbage, record, ranked, priorities,
-- enqueued, priority, K): the task's message as schedule.lua stores it, and, only when the message
-- was created, its record (a hash whose field enqueued is the JSON given, status READY). An id
-- taken already keeps the record it has, and its priority. A priority other than 0 is kept in the
-- priorities hash; a task due now then moves from the tail of the ready list, where
-- schedule_triples put it, to its place in the ranked zset. Returns what schedule_triples returns.
local function enqueue_task(
  pending, ready, messages, unack, retry, garbage, record, ranked, priorities, enqueued,
  priority, K
)
  -- The ranked zset and the priorities hash are written only for a priority other than 0 (the
  -- framework's default): only then are their types checked, two TYPE calls fewer per task.
  if priority ~= 0 then
    guard(record, 'hash', ranked, 'zset', priorities, 'hash')
  else
    guard(record, 'hash')
  end
  local out = schedule_triples(pending, ready, messages, unack, retry, garbage, 4, 6, nil, K)
  if out[1] == 1 then
    redis.call('HSET', record, 'enqueued', enqueued, 'status', 'READY')
    if priority ~= 0 then
      redis.call('HSET', priorities, ARGV[4], priority)
      redis.call('HSETNX', priorities, RANK_ORDER, 0)
      -- Due now: at the list's tail (whose type schedule_triples checked only in that case).
      if tonumber(ARGV[5]) <= tonumber(ARGV[1]) and redis.call('LINDEX', ready, -1) == ARGV[4] then
        redis.call('RPOP', ready)
        to_ready(ready, ranked, priorities, {ARGV[4]}, false)
      end
    end
  end
  return out
end
