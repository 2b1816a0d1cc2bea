-- includes/unique.lua: uniqueness windows (schedule(..., id=..., unique_for=seconds)); shared by
-- schedule_unique.lua and send_once.lua, which take the first keys and arguments of replace.lua
-- (the fourteen keys replace_triples takes, given to schedule_in_window by the names of their
-- prologues):
-- ARGV[1] now (ms)   ARGV[2] announce horizon (ms)   ARGV[3] wake channel
-- plus the unique zset (id -> end of the window its last accepted schedule opened, ms), whose
-- type the caller guards before its first write.
-- A schedule of an id whose window is open is refused, whatever became of the message that
-- opened it (waiting, running, acknowledged, cancelled, dead). Otherwise the message is
-- scheduled (or replaced) as schedule.lua (replace.lua) would, and a message stored opens a
-- new window from now. Only schedules that ask for a window read one: the other scripts never
-- look at this zset, so ids scheduled without unique_for (recurring ticks, say) pay nothing.
--- @include "includes/scheduling.lua"
--- @include "includes/replacing.lua"

-- schedule_in_window(pending, ..., priorities (as replace_triples), unique, i, window_ms, replace,
-- K): the message in ARGV[i..i+2] (id, due, envelope). Returns stored (1 or 0), the state of the
-- message that held the id (nil when it was free; '' when refused and the id holds nothing any
-- more), the end (ms) of the open window that refused it (nil when not refused by a window), and
-- the time to announce on the wake channel (nil for none): nothing is published here, so that a
-- call of many messages publishes once, the earliest (publish_wake), as schedule.lua does.
local function schedule_in_window(
  pending, ready, messages, unack, retry, garbage, attempts, tokens, reasons, successors,
  cancelled, ready_since, ranked, priorities, unique, i, window_ms, replace, K
)
  local now = tonumber(ARGV[1])
  local id = ARGV[i]
  local open_until = redis.call('ZSCORE', unique, id)
  if open_until and tonumber(open_until) > now then
    local state = ''
    if redis.call('HEXISTS', messages, id) == 1 then
      state = state_of(id, pending, unack, retry, garbage)
    end
    return 0, state, tonumber(open_until), nil
  end
  local out, wake
  if replace then
    out, wake = replace_triples(
      pending, ready, messages, unack, retry, garbage, attempts, tokens, reasons, successors,
      cancelled, ready_since, ranked, priorities, i, i + 2, true, K
    )
  else
    out, wake = schedule_triples(pending, ready, messages, unack, retry, garbage, i, i + 2, true, K)
  end
  if out[1] == 1 then redis.call('ZADD', unique, now + window_ms, id) end
  return out[1], out[3], nil, wake
end

-- publish_wake(wake): announce the earliest time schedule_in_window returned, if any.
local function publish_wake(wake)
  if wake ~= nil then redis.call('PUBLISH', ARGV[3], tostring(wake)) end
end

-- forget_windows(unique, most): remove at most ``most`` windows that are over (the oldest
-- first). Each call that opens n windows forgets up to 2n, so the zset holds the open windows
-- plus fewer closed ones than were ever opened, and a call never scans it: O(log N + most).
local function forget_windows(unique, most)
  if most > 1000 then most = 1000 end
  local over = redis.call('ZRANGEBYSCORE', unique, '-inf', ARGV[1], 'LIMIT', 0, most)
  if #over > 0 then redis.call('ZREM', unique, unpack(over)) end
end
