-- includes/flow_limits.lua: a queue's rate limit and in-flight cap, decided in the claim
-- (core/flow_limits.py says what they mean; the claim calls these only when a limit is set).
-- The limiter hash (QueueKeys.limiter) holds:
--   tat        the GCRA's theoretical arrival time (ms, a fraction kept): the next message may
--              start at tat - (burst - 1) * interval; it moves on by one interval per message
--   interval   the interval tat was counted in: a rate edited while messages wait (staff in
--              the admin) rescales what is owed, so a raised limit applies at once and a
--              lowered one is not skipped
--   held       why the last claim took fewer than it could have: 'rate' or 'in_flight'
--   held_ms    since when messages wait on a limit (the first claim held back)
--   throttled  messages claimed while a limit held the queue back: they started later than
--              they would have without it (queuestats, metrics)
--   window_ms, started, started_before  messages claimed in this second and in the one
--              before (the current rate shown by queuestats and the admin)

-- flow_allowance(limiter, unack, spec, now, want): how many of `want` messages the limits let
-- this claim take at `now`, why fewer ('rate', 'in_flight' or nil), when the next may start
-- (ms; -1: when a message in flight ends) and the GCRA state to move on from. Reads only.
-- spec: "<interval ms> <burst> <cap>", 0 for a limit that is off.
local function flow_allowance(limiter, unack, spec, now, want)
  local interval, burst, cap = string.match(spec, '^(%S+) (%S+) (%S+)$')
  interval, burst, cap = tonumber(interval), tonumber(burst), tonumber(cap)
  local allowed, why, next_at, rescaled = want, nil, nil, false
  local state = redis.call('HMGET', limiter, 'tat', 'held', 'interval')
  local tat = now
  if interval > 0 then
    tat = math.max(tonumber(state[1]) or now, now)
    local counted_in = tonumber(state[3])
    if counted_in and counted_in > 0 and counted_in ~= interval then
      tat, rescaled = now + (tat - now) * interval / counted_in, true  -- written at once
    end
    -- Tokens at `now`: burst when idle (tat == now), one more per interval after tat.
    local tokens = math.floor((now - tat) / interval + burst + 1e-9)
    if tokens < allowed then
      allowed = math.max(0, tokens)
      why = 'rate'
      next_at = tat + (allowed - burst + 1) * interval
    end
  end
  if cap > 0 then
    local free = cap - redis.call('ZCARD', unack)
    -- The cap as tight as the rate: a token alone would not do, a freed slot is awaited.
    if free <= allowed and free < want then
      allowed, why, next_at = math.max(0, free), 'in_flight', -1
    end
  end
  return allowed, why, next_at, tat, state[2], rescaled
end

-- flow_taken(limiter, spec, now, taken, tat, why, held, limited, rescaled): record `taken`
-- messages started (the GCRA moves on, or is written rescaled to an edited rate), and whether
-- the queue waits on a limit (`limited`: the claim took fewer than it found ready and wanted).
local function flow_taken(limiter, spec, now, taken, tat, why, held, limited, rescaled)
  local interval = tonumber(string.match(spec, '^(%S+)'))
  if interval > 0 and (taken > 0 or rescaled) then
    redis.call(
      'HSET', limiter, 'tat', string.format('%.3f', tat + taken * interval), 'interval', interval
    )
  end
  if taken > 0 then
    if held then redis.call('HINCRBY', limiter, 'throttled', taken) end
    local window = now - now % 1000
    local state = redis.call('HMGET', limiter, 'window_ms', 'started')
    local since = tonumber(state[1]) or 0
    if since == window then
      redis.call('HINCRBY', limiter, 'started', taken)
    else
      local before = since == window - 1000 and (tonumber(state[2]) or 0) or 0
      redis.call('HSET', limiter, 'window_ms', window, 'started', taken, 'started_before', before)
    end
  end
  if limited then
    if not held then
      redis.call('HSET', limiter, 'held', why, 'held_ms', now)
    elseif held ~= why then
      redis.call('HSET', limiter, 'held', why)
    end
  elseif held then
    redis.call('HDEL', limiter, 'held', 'held_ms')
  end
end
