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
-- this claim take at `now`, and what flow_taken needs: why fewer ('rate', 'in_flight' or nil),
-- when the next may start (ms; -1: when a message in flight ends), the GCRA time to move on
-- from and the limiter's fields as read. Reads only: one HMGET (and a ZCARD with a cap).
-- spec: "<interval ms> <burst> <cap>", 0 for a limit that is off; a cap of -1: this shard has
-- no share of the queue's cap (a cap smaller than its shards), it takes nothing.
local function flow_allowance(limiter, unack, spec, now, want)
  local interval, burst, cap = string.match(spec, '^(%S+) (%S+) (%S+)')
  interval, burst, cap = tonumber(interval), tonumber(burst), tonumber(cap)
  local s = redis.call(
    'HMGET', limiter, 'tat', 'held', 'interval', 'window_ms', 'started', 'throttled'
  )
  local f = {
    interval = interval, now = now, tat = now, held = s[2], rescaled = false,
    window_ms = tonumber(s[4]) or 0, started = tonumber(s[5]) or 0,
    throttled = tonumber(s[6]) or 0,
  }
  local allowed = want
  if interval > 0 then
    local tat = math.max(tonumber(s[1]) or now, now)
    local counted_in = tonumber(s[3])
    if counted_in and counted_in > 0 and counted_in ~= interval then
      tat, f.rescaled = now + (tat - now) * interval / counted_in, true  -- written at once
    end
    f.tat = tat
    -- Tokens at `now`: burst when idle (tat == now), one more per interval after tat.
    local tokens = math.floor((now - tat) / interval + burst + 1e-9)
    if tokens < allowed then
      allowed = math.max(0, tokens)
      f.why, f.next_at = 'rate', tat + (allowed - burst + 1) * interval
    end
  end
  if cap ~= 0 then
    local free = math.max(cap, 0) - redis.call('ZCARD', unack)
    f.free = free
    -- The cap as tight as the rate: a token alone would not do, a freed slot is awaited.
    if free <= allowed and free < want then
      allowed, f.why, f.next_at = math.max(0, free), 'in_flight', -1
    end
  end
  return allowed, f
end

-- flow_taken(limiter, f, taken, limited, more): record `taken` messages started (the GCRA
-- moves on, or is written rescaled to an edited rate; the counts), and whether the queue waits
-- on a limit (`limited`: the claim took fewer than it found ready and wanted). One HSET at most
-- (and an HDEL when nothing waits on a limit any more). A claim that got all it wanted but
-- took the last free slot while ready messages are left (`more`) keeps an 'in_flight' hold:
-- the other consumers still wait on the cap, and slot_freed.lua wakes them only while it is set.
-- Likewise a 'key' hold while keys wait for a slot or a token (f.keep_held, set by claim.lua).
local function flow_taken(limiter, f, taken, limited, more)
  local fields = {}
  local function put(name, value)
    local n = #fields
    fields[n + 1], fields[n + 2] = name, value
  end
  if f.interval > 0 and (taken > 0 or f.rescaled) then
    put('tat', string.format('%.3f', f.tat + taken * f.interval))
    put('interval', f.interval)
  end
  if taken > 0 then
    if f.held and not f.keep_held then put('throttled', f.throttled + taken) end
    local window = f.now - f.now % 1000
    if f.window_ms == window then
      put('started', f.started + taken)
    else
      put('window_ms', window)
      put('started', taken)
      put('started_before', f.window_ms == window - 1000 and f.started or 0)
    end
  end
  if limited then
    if f.held ~= f.why then put('held', f.why) end
    if not f.held then put('held_ms', f.now) end
  elseif f.held and not f.keep_held
      and not (f.held == 'in_flight' and more and f.free and f.free <= taken) then
    redis.call('HDEL', limiter, 'held', 'held_ms')
  end
  if #fields > 0 then redis.call('HSET', limiter, unpack(fields)) end
end
