-- claim: up to N ids from ready -> unack, each with a visibility deadline and a new token.
-- KEYS[1] ready list   KEYS[2] unack zset   KEYS[3] messages hash   KEYS[4] attempts hash
-- KEYS[5] tokens hash   KEYS[6] seq counter   KEYS[7] garbage zset   KEYS[8] reasons hash
-- KEYS[9] cancelled hash   KEYS[10] ready_since hash   KEYS[11] ranked zset
-- KEYS[12] limiter hash
-- KEYS[13] flow_keys hash   KEYS[14] key_turns zset   KEYS[15] key_waiting zset
-- KEYS[16] key_state hash   KEYS[17] key_tats zset   KEYS[18] key_lists prefix
-- KEYS[19] key_load zset
-- KEYS[20] claim receipt string (optional: one per consumer, see below)
-- ARGV[1] now (ms)   ARGV[2] deadline (ms)   ARGV[3] most ids to claim
-- ARGV[4] limits: '' or "<interval ms> <burst> <cap> <key cap> <key interval ms> <key burst>"
--   (see includes/flow_limits.lua and includes/key_claims.lua)
-- ARGV[5] claim id (with KEYS[20])   ARGV[6] '1': replay the receipt only, claim nothing new
-- returns: flat array of quadruples: id, envelope ('' when missing), attempt, token; when a
-- limit held the claim back (it took fewer than it wanted and found ready), one more element
-- after them: when (ms) the next message may start, -1 when a message in flight must end first;
-- when a claimed message had come back to ready (a retry, requeue, run now, release: it has a
-- ready_since), one last element, a table {id, ready_since (ms), ...} of those: the consumer
-- measures their start lateness from it, as counts.lua counts them overdue from it. A replay
-- (the receipt) returns the same table, kept in the receipt (the claim deleted ready_since).
-- Flow control: with limits (a rate, an in-flight cap) the claim takes at most what they allow
-- now and says when to come back, so that consumers sleep instead of polling; without them it
-- pays one comparison of ARGV[4]. ARGV[1] is the consumer's reading of the server clock
-- (core/clock.py, never ahead of it: the one clock of due times, injectable in tests), or the
-- instant it aims at when that is at most one claim lead (MAX_CLAIM_LEAD_MS, 5 ms) ahead
-- (consumer/loop.py): a rate's token may then be granted up to that lead before its instant.
-- Keys (includes/key_claims.lua): keyed ready messages wait in per-key lists; the claim takes
-- them by turns, one per key per turn, the unkeyed ready list taking turns as one more key, and
-- within each key's limits (key_concurrency, key_rate_limit). A queue without keyed messages
-- pays one HLEN for this.
-- The receipt: a claim that took messages records its claim id and what it took in KEYS[20]
-- (one SET, expiring a minute after their visibility deadline: after an outage longer than the
-- timeout they may still sit in unack, not reaped yet). A reply can be lost after the script ran
-- (the connection broke; redis-py may even send the pipeline again): called again with the
-- same claim id, the claim takes nothing new and returns those messages again (those still in
-- unack under the token it gave them), with the new deadline. A message that never reached
-- its consumer is then delivered, not left to time out and lose an attempt (or die on its
-- last one). A different claim id claims as usual; '1' in ARGV[6] (a consumer stopping) only
-- replays, so that the consumer can give those messages back. The receipt costs a GET, and a
-- SET when something was claimed.
-- One variadic call per key and chunk rather than four calls per message: a batch of a few
-- hundred costs Redis little more than one message. Chunks keep unpack() under Lua's limit.
-- Redis does not roll a script back, so everything is read before the first write, and the
-- first write that changes anything is the INCRBY of the token counter, which fails on a
-- counter that is not an integer: a bad value or a key of the wrong type fails the claim with
-- nothing changed. Before it, allow_oom() lets the claim run when Redis is out of memory
-- (includes/memory.lua): deliveries go on, and their acks free memory. The
-- reads prove the types of ready, messages and attempts; unack and tokens are checked. A
-- message whose attempt count is not a number goes to garbage with a reason, not to a handler.
-- The dead entries of messages cancelled in ready are dropped (at most 1000 a call), and do
-- not count towards N. An empty ready costs two reads (three with a receipt).
-- Order: the ranked entries above priority 0, the list, the ranked entries below 0 (see
-- ready_list.lua); a queue without priorities pays one ZCARD for it.
--- @include "includes/guard.lua"
--- @include "includes/attempts.lua"
--- @include "includes/ready_list.lua"
--- @include "includes/memory.lua"
--- @include "includes/flow_limits.lua"
--- @include "includes/key_claims.lua"
local receipt = KEYS[20]
if receipt then
  local held = redis.call('GET', receipt)
  -- {claim id, first token, ids..., and the ready_since pairs of those that came back}
  local record = held and cmsgpack.unpack(held)
  if record and record[1] == ARGV[5] then
    local out, deadlines, back, kept = {}, {}, nil, {}
    if type(record[#record]) == 'table' then back = table.remove(record) end
    for k = 3, #record do
      local id, token = record[k], string.format('%d', record[2] + k - 3)
      if redis.call('HGET', KEYS[5], id) == token and redis.call('ZSCORE', KEYS[2], id) then
        kept[id] = true
        out[#out + 1] = id
        out[#out + 1] = redis.call('HGET', KEYS[3], id) or ''
        out[#out + 1] = redis.call('HGET', KEYS[4], id)
        out[#out + 1] = token
        deadlines[#deadlines + 1] = ARGV[2]
        deadlines[#deadlines + 1] = id
      end
    end
    allow_oom(KEYS[2], 'zset')  -- a replay runs when Redis is out of memory, as a claim does
    for i = 1, #deadlines, 2000 do  -- after every read (see above)
      redis.call('ZADD', KEYS[2], 'XX', unpack(deadlines, i, math.min(i + 1999, #deadlines)))
    end
    if back then  -- as the claim it replays said, for the messages still in flight
      local since = {}
      for k = 1, #back, 2 do
        if kept[back[k]] then since[#since + 1], since[#since + 2] = back[k], back[k + 1] end
      end
      if #since > 0 then out[#out + 1] = since end
    end
    return out
  end
  if ARGV[6] == '1' then return {} end
end
local len, nranked = redis.call('LLEN', KEYS[1]), redis.call('ZCARD', KEYS[11])
local K = keyed_keys(13)
local nkeyed = redis.call('HLEN', K.flow_keys) > 0 and keyed_ready(K) or 0
if len == 0 and nranked == 0 and nkeyed == 0 then return {} end
local want, dead_total = tonumber(ARGV[3]), dead_in_ready(KEYS[9])
local limits, wanted, flow = ARGV[4], want, nil
if limits ~= '' then
  want, flow = flow_allowance(KEYS[12], KEYS[2], limits, tonumber(ARGV[1]), want)
  if want == 0 then
    allow_oom(KEYS[12], 'hash')  -- waiting on a limit is noted when Redis is full, too
    flow_taken(KEYS[12], flow, 0, true)
    return {math.ceil(flow.next_at)}
  end
end
local high, low = {}, {}
if nranked > 0 then
  high = redis.call('ZRANGEBYSCORE', KEYS[11], '-inf', '(' .. RANK_NORMAL, 'LIMIT', 0, want)
end
-- Keyed messages and the list take turns (key_claims.lua): how many the list gives, the keyed
-- ids taken (popped from their lists already) and why keys held some back.
local plain_quota, keyed_ids, key_hold = want - #high, {}, nil
if nkeyed > 0 and #high < want then
  -- The rotation writes before the INCRBY of tokens: a counter it would fail on fails now.
  local seq = redis.call('GET', KEYS[6])
  if seq and not tonumber(seq) then redis.call('INCRBY', KEYS[6], 1) end
  guard(KEYS[2], 'zset', KEYS[5], 'hash')
  allow_oom(KEYS[2], 'zset')
  plain_quota, keyed_ids, key_hold = take_turns(
    K, limits, tonumber(ARGV[1]), want - #high, math.max(0, len - dead_total)
  )
  -- Consumers may sleep on a key hold (slot_freed.lua wakes them only while the limiter says
  -- 'key'): a claim that gets all it wants keeps it while keys still wait for a slot or token.
  if flow and flow.held == 'key' and redis.call('ZCARD', K.waiting) > 0 then
    flow.keep_held = true
  end
end
local listed, walked, dead, ndead = {}, 0, {}, 0
if plain_quota > 0 and len > 0 then
  if dead_total > 0 then
    listed, walked, dead, ndead = ready_walk(KEYS[1], KEYS[9], 0, plain_quota, 1000)
  else
    walked = math.min(len, plain_quota)
    listed = redis.call('LRANGE', KEYS[1], 0, walked - 1)
  end
end
-- Below priority 0 only once the list is walked to its end (past a long run of dead entries it
-- may not be).
if nranked > #high and #high + #listed + #keyed_ids < want and walked == len then
  low = redis.call('ZRANGEBYSCORE', KEYS[11], '(' .. RANK_NORMAL, '+inf', 'LIMIT', 0,
    want - #high - #listed - #keyed_ids)
end
local ids, ranked_ids = {}, {}
for _, id in ipairs(high) do ids[#ids + 1], ranked_ids[#ranked_ids + 1] = id, id end
for _, id in ipairs(listed) do ids[#ids + 1] = id end
for _, id in ipairs(keyed_ids) do ids[#ids + 1] = id end
for _, id in ipairs(low) do ids[#ids + 1], ranked_ids[#ranked_ids + 1] = id, id end
local n = #ids
local since = n > 0 and redis.call('HLEN', KEYS[10]) > 0  -- rarely: a message came back
local envelopes, counts, came_back = {}, {}, {}
for i = 1, n, 1000 do
  local last = math.min(i + 999, n)
  local e = redis.call('HMGET', KEYS[3], unpack(ids, i, last))
  local a = redis.call('HMGET', KEYS[4], unpack(ids, i, last))
  for k = 1, last - i + 1 do envelopes[i + k - 1], counts[i + k - 1] = e[k], a[k] end
  if since then
    local r = redis.call('HMGET', KEYS[10], unpack(ids, i, last))
    for k = 1, last - i + 1 do came_back[i + k - 1] = r[k] end
  end
end
local deliver, bad = {}, {}
for j = 1, n do
  local attempts, why = attempt_count(counts[j])
  if attempts then
    deliver[#deliver + 1] = j
    counts[j] = attempts + 1
  else
    bad[#bad + 1] = {ids[j], why}
  end
end
guard(KEYS[2], 'zset', KEYS[5], 'hash')
if #bad > 0 then guard(KEYS[7], 'zset', KEYS[8], 'hash', KEYS[19], 'zset') end
allow_oom(KEYS[2], 'zset')
local first = 0
if #deliver > 0 then first = redis.call('INCRBY', KEYS[6], #deliver) - #deliver + 1 end
if walked > 0 then redis.call('LTRIM', KEYS[1], walked, -1) end
for i = 1, #ranked_ids, 1000 do
  redis.call('ZREM', KEYS[11], unpack(ranked_ids, i, math.min(i + 999, #ranked_ids)))
end
if ndead > 0 then
  if walked == len then
    redis.call('DEL', KEYS[9])  -- the list is empty: no entry is left to be dead
  else
    for id, passed in pairs(dead) do
      local left = (tonumber(redis.call('HGET', KEYS[9], id)) or 0) - passed
      if left > 0 then
        redis.call('HSET', KEYS[9], id, left)
      else
        redis.call('HDEL', KEYS[9], id)
      end
    end
    set_dead_in_ready(KEYS[9], dead_total - ndead)
  end
end
local out = {}
for i = 1, #deliver, 1000 do
  local last = math.min(i + 999, #deliver)
  local attempt_args, token_args, deadline_args = {}, {}, {}
  for d = i, last do
    local j, k = deliver[d], d - i + 1
    local id = ids[j]
    local token = string.format('%d', first + d - 1)
    attempt_args[2 * k - 1], attempt_args[2 * k] = id, counts[j]
    token_args[2 * k - 1], token_args[2 * k] = id, token
    deadline_args[2 * k - 1], deadline_args[2 * k] = ARGV[2], id
    out[#out + 1] = id
    out[#out + 1] = envelopes[j] or ''
    out[#out + 1] = counts[j]
    out[#out + 1] = token
  end
  redis.call('HSET', KEYS[4], unpack(attempt_args))
  redis.call('HSET', KEYS[5], unpack(token_args))
  redis.call('ZADD', KEYS[2], unpack(deadline_args))
end
if since then
  for i = 1, n, 1000 do redis.call('HDEL', KEYS[10], unpack(ids, i, math.min(i + 999, n))) end
end
for _, dead in ipairs(bad) do
  redis.call('ZADD', KEYS[7], ARGV[1], dead[1])
  redis.call('HSET', KEYS[8], dead[1], dead[2])
  if nkeyed > 0 then key_slot_freed(K, dead[1], tonumber(ARGV[1])) end
end
if flow then
  local more = len + nranked - dead_total + nkeyed > n  -- ready messages left after this claim
  local limited = want < wanted and more
  if not limited and key_hold and n < wanted then
    limited, flow.why, flow.next_at = true, 'key', key_hold
  end
  flow_taken(KEYS[12], flow, #deliver, limited, more)
  if limited then out[#out + 1] = math.ceil(flow.next_at) end
end
local back = {}  -- {id, ready_since, ...}: in the reply, and in the receipt for a replay
if since then
  for _, j in ipairs(deliver) do
    if came_back[j] then back[#back + 1], back[#back + 2] = ids[j], came_back[j] end
  end
  if #back > 0 then out[#out + 1] = back end
end
if receipt and #deliver > 0 then
  local record = {ARGV[5], first}
  for d = 1, #deliver do record[d + 2] = ids[deliver[d]] end
  if #back > 0 then record[#record + 1] = back end
  local ttl = math.max(0, tonumber(ARGV[2]) - tonumber(ARGV[1])) + 60000  -- see the header
  redis.call('SET', receipt, cmsgpack.pack(record), 'PX', ttl)
end
return out
