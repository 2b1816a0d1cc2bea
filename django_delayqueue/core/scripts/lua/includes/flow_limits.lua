-- includes/flow_limits.lua: a queue's rate limit and in-flight cap, decided in the claim
-- (core/flow_limits.py says what they mean; the claim calls these only when a limit is set).
--- @include "includes/limit_waits.lua"
-- The limiter hash (QueueKeys.limiter) holds:
--   tat        the GCRA's theoretical arrival time (ms, a fraction kept): the next message may
--              start at tat - (burst - 1) * interval; it moves on by one interval per message
--   interval   the interval tat was counted in: a rate edited while messages wait (staff in
--              the admin) rescales what is owed, so a raised limit applies at once and a
--              lowered one is not skipped
--   held       why the last claim took fewer than it wanted: 'rate', 'in_flight' or 'key' (a
--              flow key's limits held back all it could take)
--   held_ms    since when messages wait on a limit (the first claim held back)
--   throttled  messages claimed while a limit held the queue back: they started later than
--              they would have without it (queuestats, metrics)
--   window_ms, started, started_before  messages claimed in this second and in the one
--              before (the current rate shown by queuestats and the admin)
--   wait_since, wait_at, wait_gaps, wait_free  the period in which the rate or the cap holds
--              ready messages back (includes/limit_waits.lua): the limit wait of each message
--              claimed; wait_free is also set by slot_freed.lua when a slot frees

-- flow_allowance(limiter, unack, spec, now, want): how many of `want` messages the limits let
-- this claim take at `now`, and what flow_settle needs: the tokens and free slots there are,
-- when the first token came, the GCRA time to move on from, the limiter's fields as read and,
-- when nothing may be taken, why ('rate' or 'in_flight') and when the next may start (ms; -1:
-- when a message in flight ends). Reads only: one HMGET (and a ZCARD with a cap).
-- spec: "<interval ms> <burst> <cap>", 0 for a limit that is off; a cap of -1: this shard has
-- no share of the queue's cap (a cap smaller than its shards), it takes nothing.
local function flow_allowance(limiter, unack, spec, now, want)
  local interval, burst, cap = string.match(spec, '^(%S+) (%S+) (%S+)')
  interval, burst, cap = tonumber(interval), tonumber(burst), tonumber(cap)
  local s = redis.call(
    'HMGET', limiter, 'tat', 'held', 'interval', 'window_ms', 'started', 'throttled',
    'wait_since', 'wait_at', 'wait_gaps', 'wait_free'
  )
  local f = {
    interval = interval, burst = burst, cap = cap, now = now, tat = now, held = s[2],
    rescaled = false, window_ms = tonumber(s[4]) or 0, started = tonumber(s[5]) or 0,
    throttled = tonumber(s[6]) or 0, tokens = math.huge, free = math.huge,
  }
  local since = tonumber(s[7])
  if since then
    f.period = {since = since, at = tonumber(s[8]) or since, gaps = tonumber(s[9]) or 0,
      free = tonumber(s[10])}
  end
  local allowed = want
  if interval > 0 then
    local stored = tonumber(s[1]) or now
    local tat = math.max(stored, now)
    local counted_in = tonumber(s[3])
    if counted_in and counted_in > 0 and counted_in ~= interval then
      tat, f.rescaled = now + (tat - now) * interval / counted_in, true  -- written at once
    end
    f.tat = tat
    -- Tokens at `now`: burst when idle (tat == now), one more per interval after tat. The
    -- first of them came at the stored time less the burst (before now: a token that waited).
    f.tokens = math.floor((now - tat) / interval + burst + 1e-9)
    f.first_token = (stored > now and tat or stored) - (burst - 1) * interval
    allowed = math.min(allowed, math.max(0, f.tokens))
  end
  if cap ~= 0 then
    f.free = math.max(cap, 0) - redis.call('ZCARD', unack)
    allowed = math.min(allowed, math.max(0, f.free))
  end
  if allowed == 0 then
    -- The cap as tight as the rate: a token alone would not do, a freed slot is awaited.
    if f.free < 1 then
      f.why, f.next_at = 'in_flight', -1
    else
      f.why, f.next_at = 'rate', f.tat + (1 - burst) * interval
    end
  end
  return allowed, f
end

-- flow_release(f): when the queue's limits let go (ms: the later of the first token's instant
-- and since when a slot is free), or nil when one holds now (no token, or no free slot).
-- A slot free since an unknown time (freed by a consumer of an earlier version, which did not
-- say when) counts as free since the period's last claim: not waited on the limit.
local function flow_release(f)
  local release = -math.huge
  if f.interval > 0 then
    if f.tokens < 1 then return nil end
    release = math.max(release, f.first_token)
  end
  if f.cap ~= 0 then
    if f.free < 1 then return nil end
    local p = f.period
    release = math.max(release, (p and (p.free or p.at)) or f.now)
  end
  return release
end

-- flow_settle(limiter, f, taken, wanted, more, key_hold): the claim took `taken` messages of
-- the `wanted`; `more`: ready messages are left; `key_hold`: keys held some back (when to come
-- back, see key_claims.lua), or nil. Records them started (the GCRA moves on, or is written
-- rescaled to an edited rate; the counts), whether and why the queue waits on a limit, and the
-- limit wait period. Returns when to come back (ms; -1: when a slot frees) if a limit held this
-- claim back, else nil; and the period as it stood for the messages taken (nil: none held).
-- Why is decided by what the claim took, not what it was allowed: a cap with slots left over
-- did not hold it back (a flow key's token did, or its slot), nor a rate with a token left.
-- One HSET at most (and an HDEL when nothing waits on a limit any more). A claim that got all it
-- wanted but took the last free slot while ready messages are left keeps an 'in_flight' hold:
-- the other consumers still wait on the cap, and slot_freed.lua wakes them only while it is
-- set. Likewise a 'key' hold while keys wait for a slot or a token (f.keep_held, set by
-- claim.lua).
local function flow_settle(limiter, f, taken, wanted, more, key_hold)
  local now, fields, gone = f.now, {}, {}
  local function put(name, value)
    local n = #fields
    fields[n + 1], fields[n + 2] = name, value
  end
  local limited, rate_spent, cap_spent = false, false, false
  if more then
    rate_spent = f.interval > 0 and f.tokens - taken < 1
    cap_spent = f.cap ~= 0 and f.free - taken < 1
    if taken < wanted then
      limited = true
      if f.why then  -- nothing could be taken: flow_allowance said why
      elseif cap_spent then
        f.why, f.next_at = 'in_flight', -1
      elseif rate_spent then
        f.why, f.next_at = 'rate', f.tat + (taken + 1 - f.burst) * f.interval
      elseif key_hold then
        f.why, f.next_at = 'key', key_hold
      else
        limited = false  -- fewer for another reason (dead entries walked): no limit's
      end
    end
  end
  if f.interval > 0 and (taken > 0 or f.rescaled) then
    put('tat', string.format('%.3f', f.tat + taken * f.interval))
    put('interval', f.interval)
  end
  if taken > 0 then
    if f.held and not f.keep_held then put('throttled', f.throttled + taken) end
    local window = now - now % 1000
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
    if not f.held then put('held_ms', now) end
  elseif f.held and not f.keep_held and not (f.held == 'in_flight' and cap_spent) then
    gone[#gone + 1], gone[#gone + 2] = 'held', 'held_ms'
  end
  -- The limit wait period: gaps while the limits let go, then whether they still hold.
  local p, before = f.period, nil
  if p then
    local gaps = p.gaps
    period_gap(p, now, flow_release(f))
    if taken > 0 then before = {since = p.since, gaps = p.gaps} end
    if not more then
      gone[#gone + 1], gone[#gone + 2], gone[#gone + 3] = 'wait_since', 'wait_at', 'wait_gaps'
      gone[#gone + 1] = 'wait_free'
    elseif taken > 0 or p.gaps ~= gaps then
      put('wait_at', now)
      if p.gaps ~= gaps then put('wait_gaps', string.format('%.0f', p.gaps)) end
    end
  elseif more and ((limited and f.why ~= 'key') or rate_spent or cap_spent) then
    p = {since = now}  -- the rate or the cap holds ready messages back from now
    put('wait_since', now)
    put('wait_at', now)
    put('wait_gaps', 0)
  end
  if p and more and f.cap ~= 0 then
    if cap_spent then  -- no slot free from now: slot_freed.lua says when one frees
      if p.free then gone[#gone + 1] = 'wait_free' end
    elseif not p.free then
      put('wait_free', now)  -- a slot left free from now: what no claim takes is a gap
    end
  end
  if #gone > 0 then redis.call('HDEL', limiter, unpack(gone)) end
  if #fields > 0 then redis.call('HSET', limiter, unpack(fields)) end
  if limited then return math.ceil(f.next_at), before end
  return nil, before
end
