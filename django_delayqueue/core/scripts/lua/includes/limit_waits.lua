-- includes/limit_waits.lua: how long a claimed message waited on a flow limit (its limit wait,
-- which the consumer takes off its start lateness: core/timings/recorder.py). Kept by the
-- claim, per queue (the rate and the cap: includes/flow_limits.lua) and per flow key (its slot
-- and token: includes/key_claims.lua), on the server, whichever consumer claims.
-- A limit holds ready messages over a *period*: from the claim that finds the limit binding
-- (it took fewer than it wanted, or the last token or slot, and ready messages are left) to
-- the claim that leaves nothing ready. Inside it the limit does not hold them while a token or
-- a slot is there that no claim has taken yet (the consumers were busy, or slow to wake):
-- those *gaps* are added up, each from when the limit let go (the token's instant, the slot
-- freed: slot_freed.lua, key_slot_freed) to the claim that came. A message ready before the
-- period began waited on the limit for the period so far less its gaps; one that became ready
-- later for its share of that (its wait times the part of the period the limit held: the gaps
-- are kept as a sum, not by instant). A period is a table:
--   since  when it began (ms)   at  its last claim (ms)   gaps  the sum of its gaps (ms)
--   free   since when a slot has been free (ms), nil when none is or it is not known

-- period_gap(p, now, release): a claim at `now`; the limits let go at `release` (ms), or nil
-- when one still holds (no token or no slot now). What no claim took since is a gap.
local function period_gap(p, now, release)
  if release == nil or release >= now then return end
  local from = math.max(release, p.at)
  if now > from then p.gaps = p.gaps + now - from end
end

-- held_wait(ready, now, p): the limit wait (whole ms) of a message ready since `ready` (ms; nil
-- when unknown: from the period's start) claimed at `now` in period p (nil: none, 0).
local function held_wait(ready, now, p)
  if not p then return 0 end
  local span = now - p.since
  if span <= 0 then return 0 end
  local waited
  if not ready or ready <= p.since then
    waited = span - p.gaps
  else
    waited = (now - ready) * (1 - p.gaps / span)
  end
  if waited <= 0 then return 0 end
  return math.floor(waited)
end

-- period_text(p) / period_of(text): a flow key's period as one string, in its key_state field
-- 'w:<key>': "<since> <at> <gaps> <free> <token>", where free is since when a slot of the key
-- is free and token when its next token comes (or came), '-' for none.
local function period_text(p)
  local function ms(value) return value and string.format('%.0f', value) or '-' end
  return string.format('%s %s %s %s %s', ms(p.since), ms(p.at), ms(p.gaps), ms(p.free),
    ms(p.token))
end

local function period_of(text)
  if not text then return nil end
  local since, at, gaps, free, token = string.match(text, '^(%S+) (%S+) (%S+) (%S+) (%S+)$')
  since = tonumber(since)
  if not since then return nil end
  return {since = since, at = tonumber(at) or since, gaps = tonumber(gaps) or 0,
    free = tonumber(free), token = tonumber(token)}
end
