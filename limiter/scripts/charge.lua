-- Extend a running request's output lease, atomically. Mirrors limiter/policy.py:charge.
-- KEYS: tokens TAT, concurrency set (one {user} hash tag)
-- ARGV: now_override_us ('' = Redis TIME; tests only), request_id, token_window_us,
--       token_capacity, want, lease_ttl_us
-- Returns: the tokens granted: want when the budget covers it, else what it still holds (0: stop).

local request_id = ARGV[2]
local token_window = tonumber(ARGV[3])
local token_capacity = tonumber(ARGV[4])
local want = tonumber(ARGV[5])
local lease_ttl = tonumber(ARGV[6])

local tat = tonumber(redis.call('GET', KEYS[1])) or 0
local base = math.max(tat, now)
local available = room(tat, token_window, token_capacity)
local granted = math.min(want, available)
if granted > 0 then
  tat = base + span(granted, token_window, token_capacity)
  redis.call('SET', KEYS[1], string.format('%d', tat), 'PX', math.floor((tat - now + 999) / 1000) + EXPIRY_MARGIN_MS)
end
-- Only a slot still held is refreshed: a settled or lapsed request (past its lease, pruned or
-- not yet) does not get one back.
local held = redis.call('ZSCORE', KEYS[2], request_id)
if held and tonumber(held) > now then
  redis.call('ZADD', KEYS[2], 'XX', string.format('%d', now + lease_ttl), request_id)
  redis.call('PEXPIRE', KEYS[2], math.floor((lease_ttl + 999) / 1000) + EXPIRY_MARGIN_MS)
end
return granted
