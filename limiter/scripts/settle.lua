-- Finish a request, atomically: free its slot and refund its unused lease (GCRA: move the TAT
-- back). Only the call that removes the slot refunds, so it is idempotent. Mirrors
-- limiter/policy.py:settle.
-- KEYS: tokens TAT, concurrency set (one {user} hash tag)
-- ARGV: now_override_us ('' = Redis TIME; tests only), request_id, token_interval_us, refund_tokens
-- Returns: 1 when this call removed the slot, else 0.
local EXPIRY_MARGIN_MS = 1000

local now
if ARGV[1] ~= '' then
  now = tonumber(ARGV[1])
else
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local token_interval = tonumber(ARGV[3])
local refund = tonumber(ARGV[4])

if redis.call('ZREM', KEYS[2], ARGV[2]) == 0 then
  return 0
end
if refund > 0 then
  local tat = tonumber(redis.call('GET', KEYS[1])) or 0
  tat = math.max(tat - refund * token_interval, now)
  redis.call('SET', KEYS[1], string.format('%d', tat), 'PX', math.floor((tat - now + 999) / 1000) + EXPIRY_MARGIN_MS)
end
return 1
