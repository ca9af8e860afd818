-- give_back.lua: return a reservation whose request never went upstream, only if no reservation
-- was made after it (the same rule as `BucketState::give_back` in src/store/bucket.rs).
--
-- KEYS[1]  the bucket hash {tokens, ts, seq} written by acquire.lua
-- ARGV[1]  seq of the reservation (the integer acquire.lua replied)
-- ARGV[2]  its cost, tokens
--
-- Reply: integer 1 if the tokens were returned (then seq is the previous reservation's again),
--        integer 0 if not (the key is gone, or a later reservation depends on this one); nothing written.
-- The key keeps its TTL: it was set for a bucket with less in it, so it is long enough.

local seq = tonumber(ARGV[1])
local cost = tonumber(ARGV[2])
if seq == nil or cost == nil then
  return redis.error_reply('ERR give_back.lua: bad arguments (seq, cost)')
end

local state = redis.call('HMGET', KEYS[1], 'tokens', 'seq')
local tokens, stored = tonumber(state[1]), tonumber(state[2])
if tokens == nil or stored == nil or stored ~= seq then
  return 0
end

redis.call('HSET', KEYS[1], 'tokens', string.format('%.17g', tokens + cost),
  'seq', string.format('%.17g', seq - 1))
return 1
