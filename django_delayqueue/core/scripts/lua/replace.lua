-- replace: schedule messages under ids that may be taken, replacing what holds them.
-- KEYS[1] pending zset   KEYS[2] ready list   KEYS[3] messages hash   KEYS[4] unack zset
-- KEYS[5] retry zset   KEYS[6] garbage zset   KEYS[7] attempts hash   KEYS[8] tokens hash
-- KEYS[9] reasons hash   KEYS[10] successors hash   KEYS[11] cancelled hash
-- KEYS[12] ready_since hash   KEYS[13] ranked zset   KEYS[14] priorities hash
-- KEYS[15] flow_keys hash   KEYS[16] key_turns zset   KEYS[17] key_waiting zset
-- KEYS[18] key_state hash   KEYS[19] key_tats zset   KEYS[20] key_lists prefix
-- KEYS[21] key_load zset
-- ARGV[1] now (ms)   ARGV[2] announce horizon (ms)   ARGV[3] wake channel
-- ARGV[4..] triples: id, due (ms), envelope
-- returns: {how many messages were stored (all of them), then for each id that was taken: its
--           position in this call (1-based) and the state of the message it replaced}
-- Rules (docs/scheduling.md, "Re-scheduling an id"):
-- * free id: scheduled as schedule.lua does.
-- * waiting (pending, ready, retry) or dead (garbage): the message is replaced at once, as a
--   new message: new envelope, moved to pending or ready by the new due time, attempts, reason
--   and delivery token cleared (a late ack of an earlier delivery cannot delete the new
--   message), its priority and any successor dropped: afterwards the id holds exactly this
--   message. A ready message due now again keeps its place in the list (one that had a
--   priority goes to the list's tail).
-- * in flight (unack): the message becomes the id's successor (replacing an earlier one),
--   scheduled when the running delivery is acknowledged, or when it dies (ack, nack, reap).
-- New messages due now, or due within the horizon, are announced on the wake channel.
-- The work is includes/replacing.lua's (send_once.lua does it too).
local pending, ready, messages, unack = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local retry, garbage, attempts, tokens = KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local reasons, successors, cancelled, ready_since = KEYS[9], KEYS[10], KEYS[11], KEYS[12]
local ranked, priorities, flow_keys, key_turns = KEYS[13], KEYS[14], KEYS[15], KEYS[16]
local key_waiting, key_state, key_tats, key_lists = KEYS[17], KEYS[18], KEYS[19], KEYS[20]
local key_load = KEYS[21]
--- @include "includes/replacing.lua"
local K = keyed_keys(flow_keys, key_turns, key_waiting, key_state, key_tats, key_lists, key_load)
return replace_triples(
  pending, ready, messages, unack, retry, garbage, attempts, tokens, reasons, successors,
  cancelled, ready_since, ranked, priorities, 4, #ARGV, false, K
)
