-- acquire.lua: reserve `cost` tokens of one bucket in one call (the same algorithm as
-- `BucketState::reserve` in src/store/bucket.rs; keep the two in step).
--
-- KEYS[1]  the bucket, a hash {tokens, ts, seq, epoch}; e.g. tollgate:{provider:region}
-- ARGV[1]  rate, tokens per second (> 0)
-- ARGV[2]  capacity, tokens (>= 1)
-- ARGV[3]  cost, tokens
-- ARGV[4]  max_wait_us: refuse (taking nothing) a slot further away than this, in microseconds
-- ARGV[5]  now_us: the caller's clock in microseconds (store.clock = "local"); absent, "" or "0"
--          means: read this server's TIME (store.clock = "redis")
--
-- Reply: an array of integers {status, wait_us, seq[, epoch]}
--   { 1, wait_us, seq, epoch}  granted: go in wait_us microseconds; seq numbers the reservation
--                       (give_back.lua); epoch is when this state was created: a caller that sees it
--                       change knows the state (and the queue of slots in it) was lost, e.g. by a restart
--   { 0, wait_us, 0}    refused, the slot would be wait_us away (> max_wait_us); nothing written
--   {-1, 0, 0}          refused, cost is not in (0, capacity]: it can never be served; nothing written
-- Integers only: Redis truncates Lua numbers to integers in replies. Every value here is an exact
-- integer below 2^53 (seq starts at a time in microseconds, about 1.8e15 with TIME).
--
-- Stored numbers are written with %.17g, which reads back to the same double and prints integers
-- below 1e17 without an exponent (tostring would use %.14g and lose seq's last digits).

local MICROS = 1000000
-- Keep an idle key this much past the moment it would be full again: the expiry must never come
-- before the refill is complete (a fresh state is full), and callers' clocks (store.clock = "local")
-- may run apart from the server's by about this much.
local EXPIRE_MARGIN_MS = 1000

local function num(x)
  return string.format('%.17g', x)
end

local rate = tonumber(ARGV[1])
local capacity = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])
local max_wait = tonumber(ARGV[4])
local now = tonumber(ARGV[5] or '')
if rate == nil or not (rate > 0) or capacity == nil or cost == nil or max_wait == nil then
  return redis.error_reply('ERR acquire.lua: bad arguments (rate, capacity, cost, max_wait_us[, now_us])')
end

if not (cost > 0 and cost <= capacity) then
  return {-1, 0, 0}
end

if now == nil or now <= 0 then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * MICROS + tonumber(t[2])
end

local state = redis.call('HMGET', KEYS[1], 'tokens', 'ts', 'seq', 'epoch')
local tokens, ts, seq = tonumber(state[1]), tonumber(state[2]), tonumber(state[3])
-- A state written before epochs existed counts as created at 0.
local epoch = tonumber(state[4]) or 0
if tokens == nil or ts == nil or seq == nil then
  -- A new (or expired) bucket is full; seq starts at now so that a reservation of an earlier
  -- incarnation of the key cannot be given back into this one.
  tokens, ts, seq, epoch = capacity, now, now, now
end

-- A caller's clock behind the stored time must not credit the same interval twice.
if now < ts then
  now = ts
end

local elapsed = (now - ts) / MICROS
local after = math.min(capacity, tokens + elapsed * rate) - cost
local wait = 0
if after < 0 then
  wait = math.ceil(-after / rate * MICROS)
end
if wait > max_wait then
  return {0, wait, 0}
end

seq = seq + 1
redis.call('HSET', KEYS[1], 'tokens', num(after), 'ts', num(now), 'seq', num(seq), 'epoch', num(epoch))
-- Full again after (capacity - after) / rate seconds; forget the key then (plus the margin).
local full_ms = math.ceil((capacity - after) / rate * 1000)
redis.call('PEXPIRE', KEYS[1], num(full_ms + EXPIRE_MARGIN_MS))
return {1, wait, seq, epoch}
