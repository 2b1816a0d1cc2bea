-- includes/key_claims.lua: the claim's side of flow keys (includes/key_turns.lua): turns taken
-- between keys, within each key's limits.
-- Limits, after the queue's in claim.lua's ARGV[4]: "<key cap> <key interval ms> <key burst>"
-- (0: that limit is off): key_concurrency, and key_rate_limit as a GCRA per key (as the
-- queue's rate, includes/flow_limits.lua, its time in K.tats).
--- @include "includes/key_turns.lua"

-- key_limits(spec): key cap, key interval (ms), key burst from the claim's limits argument.
local function key_limits(spec)
  local cap, interval, burst = string.match(spec or '', '^%S+ %S+ %S+ (%S+) (%S+) (%S+)')
  return tonumber(cap) or 0, tonumber(interval) or 0, tonumber(burst) or 1
end

-- key_held(K, key, now, token): the key's limits hold its ready messages back from `now` (it is
-- out of slots, or of tokens until `token`): its limit wait period begins, if none has. One
-- that has says so already: the take that spent the key's last slot or token wrote it (no
-- slot free, its next token), so it is left as it is (one HSETNX, no read).
local function key_held(K, key, now, token)
  local p = {since = now, at = now, gaps = 0, token = token}
  redis.call('HSETNX', K.state, 'w:' .. key, period_text(p))
end

-- take_one(K, key, now, cap, interval, burst): one message of `key`, whose turn it is, if its
-- limits allow. Returns the id taken and the key's limit wait period as it stood for it (nil:
-- the key's limits did not hold it back), or nil and why not: 'slot' (key_concurrency
-- reached: the key leaves the rotation until a delivery of it ends), 'rate' with when its
-- next token comes (it waits in K.waiting until then) or 'empty'. A key that gave one goes to
-- the rotation's tail while it has more ready.
-- The period (includes/limit_waits.lua) lets go when a slot frees (key_slot_freed says when)
-- and when the next token comes (known as the key is taken from): the wait for its turn in
-- the rotation after that is the consumers', not the limit's.
local function take_one(K, key, now, cap, interval, burst)
  local count = 0
  if cap > 0 then
    count = tonumber(redis.call('HGET', K.state, 'c:' .. key)) or 0
    if count >= cap then
      redis.call('ZREM', K.turns, key)
      redis.call('ZADD', K.waiting, KEY_BLOCKED, key)
      local tat = interval > 0 and tonumber(redis.call('ZSCORE', K.tats, key))
      key_held(K, key, now, tat and tat + (1 - burst) * interval or nil)
      return nil, 'slot'
    end
  end
  local tat = now
  if interval > 0 then
    tat = math.max(tonumber(redis.call('ZSCORE', K.tats, key)) or now, now)
    if math.floor((now - tat) / interval + burst + 1e-9) < 1 then
      local at = tat + (1 - burst) * interval  -- when it has a token again
      redis.call('ZREM', K.turns, key)
      redis.call('ZADD', K.waiting, string.format('%.3f', at), key)
      key_held(K, key, now, at)
      return nil, 'rate', at
    end
  end
  local list = K.lists .. key
  local id = redis.call('LPOP', list)
  if not id then
    redis.call('ZREM', K.turns, key)
    return nil, 'empty'
  end
  redis.call('HINCRBY', K.state, ' ready', -1)
  if interval > 0 then redis.call('ZADD', K.tats, string.format('%.3f', tat + interval), key) end
  key_taken(K, key, id)
  local left = redis.call('LLEN', list)
  if left > 0 then
    redis.call('ZADD', K.turns, next_turn(K), key)
  else
    redis.call('ZREM', K.turns, key)
  end
  if cap == 0 and interval == 0 then return id end  -- no key limit: no period to keep
  local p, before = key_period(K, key), nil
  if p then
    local release = -math.huge
    if cap > 0 then release = p.free or p.at end
    if interval > 0 and p.token then release = math.max(release, p.token) end
    period_gap(p, now, release)
    before = {since = p.since, gaps = p.gaps}
  end
  if left == 0 then
    if p then redis.call('HDEL', K.state, 'w:' .. key) end
    return id, before
  end
  -- Still held after this one: out of slots, or its next token ahead.
  local spent = cap > 0 and count + 1 >= cap
  local token = interval > 0 and tat + interval + (1 - burst) * interval or nil
  if p or spent or (token and token > now) then
    p = p or {since = now, gaps = 0}
    p.at, p.token = now, token
    p.free = (cap > 0 and not spent) and now or nil
    key_period_put(K, key, p)
  end
  return id, before
end

-- retime_keys(K, now, interval): key_rate_limit edited since the last claim (its interval, as
-- the last claim saw it, in K.state ' interval'): the GCRA times still ahead are rescaled to the
-- new interval (dropped when the limit is off), as the queue's rate is (flow_limits.lua), and
-- the keys waiting for a token rejoin the rotation, where take_one decides again with the new
-- times. Without this a key would wait out a token of the old rate (an hour for "1/h" cleared
-- or raised). Once per edit: O(keys with a token ahead).
local function retime_keys(K, now, interval)
  local last = tonumber(redis.call('HGET', K.state, ' interval')) or 0
  if last == interval then return end
  redis.call('HSET', K.state, ' interval', interval)
  if last == 0 then return end
  if interval == 0 then
    redis.call('DEL', K.tats)
  else
    local ahead = redis.call('ZRANGEBYSCORE', K.tats, '(' .. now, '+inf', 'WITHSCORES')
    for i = 1, #ahead, 2 do
      local tat = now + (tonumber(ahead[i + 1]) - now) * interval / last
      redis.call('ZADD', K.tats, string.format('%.3f', tat), ahead[i])
    end
  end
  local waiting = redis.call('ZRANGEBYSCORE', K.waiting, '-inf', '(' .. KEY_BLOCKED)
  for _, key in ipairs(waiting) do
    redis.call('ZREM', K.waiting, key)
    key_join(K, key)
  end
end

-- take_turns(K, limits, now, want, plain_left): up to `want` messages by turns: the keys in
-- K.turns, lowest turn first, one message each per turn, and the unkeyed ready list as one
-- more participant (its turn in K.state ' plain') while it has messages (`plain_left`).
-- Returns how many the list gives (the caller takes them from its head), the keyed ids taken,
-- when keys held messages back, when to come back: the earliest key token (ms), or -1 (a
-- key's slot must free first), or nil when nothing was held back; and the limit wait periods
-- of the keys of the ids taken (by id, for those their key's limits held back).
-- Cost: O(log n) per key looked at, in number of keys; keys looked at are bounded (2 per
-- message wanted, plus 100), and a key looked at without being taken from leaves the
-- rotation (it came back once per message pushed or slot freed), so it is paid once.
-- Keys whose token came (K.waiting) rejoin the tail first (at most 100 per claim, the
-- earliest first); GCRA times that are past (which a key without them reads the same) are
-- forgotten, up to 100 per claim.
local function take_turns(K, limits, now, want, plain_left)
  local cap, interval, burst = key_limits(limits)
  retime_keys(K, now, interval)
  local back = redis.call('ZRANGEBYSCORE', K.waiting, '-inf', now, 'LIMIT', 0, 100)
  -- A cap raised (or lifted) since the last claim: keys out of slots may have one now.
  local last_cap = tonumber(redis.call('HGET', K.state, ' cap')) or 0
  if last_cap ~= cap then
    if last_cap > 0 and (cap == 0 or cap > last_cap) then
      local blocked = redis.call('ZRANGEBYSCORE', K.waiting, KEY_BLOCKED, '+inf', 'LIMIT', 0, 1000)
      for _, key in ipairs(blocked) do back[#back + 1] = key end
    end
    redis.call('HSET', K.state, ' cap', cap)
  end
  for _, key in ipairs(back) do
    redis.call('ZREM', K.waiting, key)
    key_join(K, key)
  end
  forget_past_tats(K, now, 100)
  local plain_turn = tonumber(redis.call('HGET', K.state, ' plain')) or 0
  local plain, taken, periods, held_slot, next_token = 0, {}, {}, false, nil
  local budget, remaining, exhausted = 2 * want + 100, want, false
  while remaining > 0 and budget > 0 do
    local heads = redis.call('ZRANGE', K.turns, 0, remaining - 1, 'WITHSCORES')
    if #heads == 0 then
      exhausted = true
      break
    end
    for h = 1, #heads, 2 do
      if remaining == 0 or budget == 0 then break end
      local key, turn = heads[h], tonumber(heads[h + 1])
      if plain < plain_left and plain_turn <= turn then  -- the list's turn comes first
        plain, remaining, plain_turn = plain + 1, remaining - 1, next_turn(K)
      end
      if remaining > 0 then
        budget = budget - 1
        local id, why, at = take_one(K, key, now, cap, interval, burst)
        if id then
          taken[#taken + 1] = id
          if why then periods[id] = why end  -- (on success: its key's limit wait period)
          remaining = remaining - 1
        elseif why == 'slot' then
          held_slot = true
        elseif why == 'rate' and (next_token == nil or at < next_token) then
          next_token = at
        end
      end
    end
  end
  if exhausted and plain < plain_left then  -- no key can give more: the list gives the rest
    plain = math.min(plain_left, plain + remaining)
  end
  redis.call('HSET', K.state, ' plain', plain_turn)
  local hold = nil
  if #taken + plain < want and redis.call('ZCARD', K.turns) == 0 then
    local first = redis.call('ZRANGE', K.waiting, 0, 0, 'WITHSCORES')
    if first[2] and tonumber(first[2]) < KEY_BLOCKED then
      hold = tonumber(first[2])
    elseif first[2] or held_slot or keyed_ready(K) > 0 then
      hold = -1
    end
  elseif #taken + plain < want and budget == 0 then
    hold = now  -- looked at as many keys as a claim may: come back at once
  end
  return plain, taken, hold, periods
end
